"""`tpudiag whatif`'s result (`tpudiag.whatif.WhatIf`) for the terminal and as JSON; every figure modelled."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.model.units import fmt_bytes, fmt_time
from tpudiag.render.console import markup


def _side(c) -> dict:
    return {"out": str(c.out), "step_time_ps": c.step_ps, "exposed_collective_ps": c.exposed_collective_ps,
            "hbm_peak_bytes": c.hbm_peak_bytes, "schedule_sha256_12": c.schedule_sha,
            "async_collectives": c.async_collectives, "sync_collectives": c.sync_collectives,
            "findings": [{"rule": f.rule, "severity": f.severity.name.lower(), "message": f.message}
                         for f in c.diagnosis.findings]}


def _finding(f) -> dict:
    return {"rule": f.rule, "severity": f.severity, "message": f.message, "saving_ps": f.saving_ps}


def whatif_json(result) -> dict:
    """The what-if as one JSON object (`kind: tpudiag.whatif`); every figure modelled."""
    return {
        "kind": "tpudiag.whatif", "modelled": True, "target": result.target, "topology": result.topology,
        "baseline": _side(result.baseline),
        "variants": [{"settings": [str(s) for s in v.variant.settings],
                      "goes_to": [s.goes_to for s in v.variant.settings], **_side(v.compiled),
                      "schedule_changed": v.compiled.schedule_sha != result.baseline.schedule_sha,
                      "step_time_change_ps": v.diff.step_time.delta_ps if v.diff.step_time else None,
                      "step_time_significant": bool(v.diff.step_time and v.diff.step_time.significant),
                      **_finding_changes(v)}
                     for v in result.variants],
    }


def _finding_changes(v) -> dict:
    appeared, gone, both = v.finding_changes()

    def pair(p) -> dict:
        return {"base": _finding(p.base), "variant": _finding(p.new), "how": p.how, "base_ops": list(p.base.ops),
                "variant_ops": list(p.new.ops)}

    return {"findings_appeared": [_finding(f) for f in appeared], "findings_resolved": [_finding(f) for f in gone],
            "findings_unchanged": [pair(p) for p in both if not p.changed],
            "findings_changed": [pair(p) for p in both if p.changed]}


def _change(base: float | None, new: float | None, fmt) -> str:
    if base is None or new is None:
        return "n/a"
    delta = new - base
    pct = f" ({delta / base:+.1%})" if base else ""
    return ("±0" if delta == 0 else ("+" if delta > 0 else "-") + fmt(abs(delta))) + pct


def render_whatif_terminal(result, console: Console) -> None:
    base = result.baseline
    console.print(f"[bold]tpudiag whatif[/]  {markup(result.target)} on {markup(result.topology)}", soft_wrap=True)
    console.print("deviceless compiles: every figure is modelled, none measured")
    for i, v in enumerate(result.variants, 1):
        new = v.compiled
        console.print()
        console.print(f"[bold]variant {i}[/]: {markup(v.variant.label)}", soft_wrap=True)
        table = Table(show_edge=False, pad_edge=False)
        for column in ("modelled", "baseline", f"variant {i}", "change"):
            table.add_column(column, justify="left" if column == "modelled" else "right")
        table.add_row("step time", fmt_time(base.step_ps), fmt_time(new.step_ps),
                      _change(base.step_ps, new.step_ps, fmt_time))
        table.add_row("exposed collectives per step", fmt_time(base.exposed_collective_ps),
                      fmt_time(new.exposed_collective_ps),
                      _change(base.exposed_collective_ps, new.exposed_collective_ps, fmt_time))
        table.add_row("HBM peak per device (compiler)", fmt_bytes(base.hbm_peak_bytes), fmt_bytes(new.hbm_peak_bytes),
                      _change(base.hbm_peak_bytes, new.hbm_peak_bytes, fmt_bytes))
        table.add_row("collectives async / sync", f"{base.async_collectives} / {base.sync_collectives}",
                      f"{new.async_collectives} / {new.sync_collectives}",
                      "same schedule" if new.schedule_sha == base.schedule_sha else "schedule changed")
        console.print(table)
        appeared, gone, both = v.finding_changes()
        for title, refs in (("findings that appear", appeared), ("findings that go away", gone)):
            if refs:
                console.print(f"{title}: {len(refs)}")
                for f in refs:
                    console.print(f"  \\[{f.severity}] {markup(f.rule)}: {markup(f.message)}", soft_wrap=True)
        same = [p for p in both if not p.changed]
        renamed = [p for p in same if p.renamed]
        if same:
            names = ", ".join(f"`{markup(', '.join(p.base.ops))}` -> `{markup(', '.join(p.new.ops))}`"
                              for p in renamed)
            console.print(f"findings unchanged: {len(same)}" + (f" ({len(renamed)} on renamed ops: {names})"
                                                                 if renamed else ""), soft_wrap=True, highlight=False)
        for p in (p for p in both if p.changed):
            console.print(f"finding changed: {markup(p.new.rule)} on `{markup(', '.join(p.new.ops[:3]))}`"
                          f"{' and more' if len(p.new.ops) > 3 else ''}: saving {fmt_time(p.base.saving_ps)} -> "
                          f"{fmt_time(p.new.saving_ps)}", soft_wrap=True, highlight=False)
        if not (appeared or gone or renamed or any(p.changed for p in both)):
            console.print("findings: the same rules fire on the same ops")
        console.print(f"op by op: `tpudiag diff {markup(str(base.out))} {markup(str(new.out))}`", highlight=False,
                      soft_wrap=True)
