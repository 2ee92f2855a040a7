"""The diff in the terminal, with rich. Readable without colour."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tpudiag.analysis.diff import Diff, NamedChange
from tpudiag.render.diff_format import (PART_COLUMNS, attribution_summary, change_cells, compiled_cells,
                                         exposure_moves, fmt_delta, no_steps_line, noise_rule, part_cells, part_name,
                                         rest_text, shown_parts)
from tpudiag.model.units import fmt_time

CHANGE_COLUMNS = ("base", "new", "change", "change %", "noise band", "95% interval", "verdict")
STYLE = {"slower": "red", "faster": "green", "within noise": "dim"}


def _changes_table(title: str, rows: tuple[NamedChange, ...]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False)
    t.add_column("")
    for col in CHANGE_COLUMNS:
        t.add_column(col, justify="left" if col == "verdict" else "right")
    for r in rows:
        cells = change_cells(r.change)
        t.add_row(escape(r.name), *cells[:-1], Text(cells[-1], style=STYLE[cells[-1]]))
    return t


def _attribution(diff: Diff, console: Console, top: int) -> None:
    a = diff.attribution
    console.print()
    console.print(Text(attribution_summary(a)))
    t = Table(title="Where the change comes from (largest first)", title_justify="left", show_edge=False)
    for col in PART_COLUMNS:
        t.add_column(col, justify="right" if col in ("base", "new", "change", "noise band") else "left",
                     overflow="fold" if col == "part" else "ellipsis")
    shown, rest = shown_parts(a, top)
    for p in shown + ([rest] if rest is not None else []):
        t.add_row(escape(part_name(p)), *part_cells(p))
    console.print(t)
    more = rest_text(a, shown, rest)
    if more:
        console.print(Text(f"  {more}"))
    moves = exposure_moves(diff)
    if moves:
        console.print(Text("Collectives that moved between exposed and hidden", style="bold"))
        for o in moves:
            name = o.name if o.name == o.base_name else f"{o.base_name} → {o.name}"
            console.print(Text(f"  {name}: {o.exposure.text()} ({fmt_delta(o.change.delta_ps)} of self time)"))


def render_diff_terminal(diff: Diff, console: Console, top: int = 15) -> None:
    console.print(Text.assemble(("tpudiag diff", "bold"), f"  {diff.base_input}  →  {diff.new_input}"))
    st = diff.step_time
    if st is None:
        console.print(no_steps_line(diff))
    else:
        cells = change_cells(st)
        console.print(Text.assemble(
            "Step time (median): ", f"{cells[0]} → {cells[1]}  {cells[2]} ({cells[3]}), noise band {cells[4]}, "
            f"interval {cells[5]}: ", (cells[6], f"bold {STYLE[cells[6]]}")))
        console.print(f"  base p10–p90 {fmt_time(st.base.p10_ps)}–{fmt_time(st.base.p90_ps)} over {st.base.n_steps} "
                      f"steps · new {fmt_time(st.new.p10_ps)}–{fmt_time(st.new.p90_ps)} over {st.new.n_steps} steps")
    if diff.attribution is not None and diff.attribution.moved:
        _attribution(diff, console, top)
    if diff.breakdown:
        console.print()
        console.print(_changes_table("Step breakdown (mean per step and core)", diff.breakdown))
    if diff.collectives:
        console.print()
        console.print(_changes_table("Collectives by family (time per step and core)", diff.collectives))
    console.print()
    changed = diff.significant_ops
    if changed:
        t = Table(title=f"Ops changed beyond noise ({len(changed)} of {len(diff.ops)} matched; self time "
                        f"{diff.op_basis})", title_justify="left", show_edge=False)
        t.add_column("op", overflow="fold")
        t.add_column("category")
        for col in CHANGE_COLUMNS[:-1]:
            t.add_column(col, justify="right")
        t.add_column("matched by")
        for o in changed[:top]:
            name = o.name if o.name == o.base_name else f"{o.base_name} → {o.name}"
            t.add_row(escape(name), escape(o.category), *change_cells(o.change)[:-1], o.matched_by)
        console.print(t)
    else:
        console.print(f"No op changed beyond noise ({len(diff.ops)} matched)")
    if diff.compiled_changes:
        console.print()
        t = Table(title="Padding and spills changed (compiled programs; compiler facts)", title_justify="left",
                  show_edge=False)
        for col in ("op", "category", "padding base → new", "spills base → new"):
            t.add_column(col, justify="right" if "→" in col else "left")
        for o in diff.compiled_changes[:top]:
            t.add_row(escape(o.name), escape(o.category), *compiled_cells(o))
        console.print(t)
    for title, rows in (("Ops only in NEW (appeared)", diff.appeared), ("Ops only in BASE (disappeared)",
                                                                        diff.disappeared)):
        if rows:
            console.print()
            console.print(Text(title, style="bold"))
            for r in rows[:top]:
                console.print(Text(f"  {r.name} ({r.category}) {fmt_time(r.time_ps)} {diff.op_basis}"))
    console.print()
    if not diff.findings_rules_run:
        console.print("Findings: not compared (rules were not run)")
    else:
        for title, refs in (("Findings that appeared", diff.findings_appeared),
                            ("Findings that went away", diff.findings_resolved)):
            console.print(Text(f"{title}: {len(refs)}", style="bold"))
            for f in refs:
                console.print(Text(f"  [{f.severity}] {f.rule} ({f.code}) {f.message}"))
        same = [p for p in diff.findings_persisting if not p.saving_changed]
        renamed = [p for p in same if p.renamed]
        line = f"Findings in both runs, unchanged: {len(same)}"
        if renamed:
            line += " (on renamed ops: " + ", ".join(f"{', '.join(p.base.ops)} → {', '.join(p.new.ops)}"
                                                     for p in renamed) + ")"
        console.print(Text(line, style="bold"))
        moved = [p for p in diff.findings_persisting if p.saving_changed]
        if moved:
            console.print(Text("Findings in both runs whose estimated saving changed", style="bold"))
            for p in moved:
                ops = ", ".join(p.new.ops)
                console.print(Text(f"  {p.new.rule} ({ops}): saving {fmt_time(p.base.saving_ps)} → "
                                   f"{fmt_time(p.new.saving_ps)} ({fmt_delta(p.new.saving_ps - p.base.saving_ps)})"))
    console.print()
    console.print(Text(noise_rule(diff), style="dim"))
    if diff.warnings:
        console.print()
        console.print(Text("Warnings", style="bold"))
        for w in diff.warnings:
            console.print(Text(f"  {w}"))
