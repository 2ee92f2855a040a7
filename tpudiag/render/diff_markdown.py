"""The diff as markdown (GitHub, editor previews). Input-derived strings are escaped as in the report."""

from __future__ import annotations

from tpudiag.version import __version__
from tpudiag.analysis.diff import Diff, NamedChange, PartKind
from tpudiag.render.diff_format import (PART_COLUMNS, attribution_summary, change_cells, compiled_cells,
                                         exposure_moves, fmt_delta, no_steps_line, noise_rule, part_cells, part_name,
                                         rest_text, shown_parts)
from tpudiag.render.markdown import code, document, prose, table, text
from tpudiag.model.units import fmt_time

HEADER = ["base", "new", "change", "change %", "noise band", "95% interval", "verdict"]


def _named(title: str, rows: tuple[NamedChange, ...]) -> list[str]:
    if not rows:
        return []
    body = [[text(r.name)] + change_cells(r.change) for r in rows]
    return [f"## {title}", ""] + table(["", *HEADER], body, "lrrrrrrl") + [""]


def _attribution(diff: Diff, top: int) -> list[str]:
    a = diff.attribution
    if a is None or not a.moved:
        return []
    shown, rest = shown_parts(a, top)
    rows = [[code(part_name(p)) if p.kind in (PartKind.OP, PartKind.APPEARED, PartKind.GONE) else text(p.name)]
            + part_cells(p) for p in shown + ([rest] if rest is not None else [])]
    out = ["## Where the change comes from", "", text(attribution_summary(a)), ""]
    out += table(list(PART_COLUMNS), rows, "llrrrrl") + [""]
    more = rest_text(a, shown, rest)
    if more:
        out += [text(more) + ".", ""]
    moves = exposure_moves(diff)
    if moves:
        out += ["Collectives that moved between exposed and hidden:", ""]
        out += [f"- {code(o.base_name)} → {code(o.name)}: {o.exposure.text()} ({fmt_delta(o.change.delta_ps)} of "
                "self time)" for o in moves] + [""]
    return out


def render_diff_markdown(diff: Diff, top: int = 25) -> str:
    same_run = diff.base_run == diff.new_run and diff.base_input != diff.new_input
    base_label, new_label = ((diff.base_input, diff.new_input) if same_run or not diff.base_run
                             else (diff.base_run, diff.new_run))
    out = [f"# Diff: {code(base_label)} → {code(new_label)}", ""]
    out += [f"- Base: {code(diff.base_input)}", f"- New: {code(diff.new_input)}", ""]
    st = diff.step_time
    if st is None:
        out += [text(no_steps_line(diff)), ""]
    else:
        c = change_cells(st)
        out += [f"**Step time (median over steps): {c[0]} → {c[1]}, {c[2]} ({c[3]}); noise band {c[4]}; "
                f"interval {c[5]}: {c[6]}.**", "",
                f"Base p10–p90 {fmt_time(st.base.p10_ps)}–{fmt_time(st.base.p90_ps)} over {st.base.n_steps} steps; "
                f"new {fmt_time(st.new.p10_ps)}–{fmt_time(st.new.p90_ps)} over {st.new.n_steps} steps.", ""]
    out += _attribution(diff, top)
    out += _named("Step breakdown (mean per step and core)", diff.breakdown)
    out += _named("Collectives by family (time per step and core)", diff.collectives)
    changed = diff.significant_ops
    out += ["## Ops changed beyond noise", ""]
    if not changed:
        out += [f"None of the {len(diff.ops)} ops found in both runs changed beyond noise.", ""]
    else:
        rows = []
        for o in changed[:top]:
            name = code(o.name) if o.name == o.base_name else f"{code(o.base_name)} → {code(o.name)}"
            rows.append([name, text(o.category)] + change_cells(o.change)[:-1] + [o.matched_by])
        out += [f"{len(changed)} of {len(diff.ops)} matched ops; self time {diff.op_basis}.", ""]
        out += table(["op", "category", *HEADER[:-1], "matched by"], rows, "llrrrrrrl") + [""]
    if diff.compiled_changes:
        rows = [[code(o.name), text(o.category)] + compiled_cells(o) for o in diff.compiled_changes[:top]]
        out += ["## Padding and spills (compiled programs)", "",
                "Padding: bytes the tiled TPU layouts add to operands and result; spills: VMEM spill stores + "
                "fills. Compiler facts, not measurements.", ""]
        out += table(["op", "category", "padding base → new", "spills base → new"], rows, "llrr") + [""]
    for title, items in (("Ops only in the new run", diff.appeared), ("Ops only in the base run", diff.disappeared)):
        if items:
            rows = [[code(r.name), text(r.category), code(r.shape), fmt_time(r.time_ps)] for r in items[:top]]
            out += [f"## {title}", ""] + table(["op", "category", "shape", f"time {diff.op_basis}"], rows,
                                               "lllr") + [""]
    out += ["## Findings", ""]
    if not diff.findings_rules_run:
        out += ["Not compared: the rules were not run.", ""]
    else:
        for title, refs in (("Appeared", diff.findings_appeared), ("Went away", diff.findings_resolved)):
            out.append(f"- {title}: {len(refs)}")
            out += [f"  - {text(f.rule)} ({text(f.code)}, {text(f.severity)}): {prose(f.message)}" for f in refs]
        same = [p for p in diff.findings_persisting if not p.saving_changed]
        out.append(f"- In both runs, unchanged: {len(same)}")
        out += [f"  - {text(p.new.rule)}: {', '.join(code(o) for o in p.base.ops)} → "
                f"{', '.join(code(o) for o in p.new.ops)} ({p.how})" for p in same if p.renamed]
        moved = [p for p in diff.findings_persisting if p.saving_changed]
        for p in moved:
            out.append(f"- Still present, saving changed: {text(p.new.rule)} ({', '.join(code(o) for o in p.new.ops)}) "
                       f"{fmt_time(p.base.saving_ps)} → {fmt_time(p.new.saving_ps)} "
                       f"({fmt_delta(p.new.saving_ps - p.base.saving_ps)})")
        out.append("")
    out += ["## Method", "", noise_rule(diff), "", f"tpudiag {__version__}", ""]
    if diff.warnings:
        out += ["## Warnings", ""] + [f"- {text(w)}" for w in diff.warnings] + [""]
    return document(out)
