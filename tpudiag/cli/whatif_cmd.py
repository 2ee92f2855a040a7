"""`tpudiag whatif MODULE:FUNCTION --topology T --xla-flag NAME=VALUE`: a flag's modelled effect, no TPU."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

WHATIF_HELP = """Compile MODULE:FUNCTION without a TPU with and without some settings, and print the modelled difference.

The baseline compiles with the default settings; the variant with every --xla-flag and --option
given (--each: one variant per setting). Each compile output is laid on a modelled timeline as in
`tpudiag report DIR` and compared with the baseline: step time, exposed collective time, the HBM
peak (the compiler's memory_analysis), the collective schedule, and the findings that appear or
go away. Every figure is modelled from the compiler's estimates, never measured.
--xla-flag NAME=VALUE: libtpu flags (xla_tpu_*, xla_jf_*, xla_mosaic_*, xla_sc_*) go to
LIBTPU_INIT_ARGS, others to XLA_FLAGS. --option KEY=VALUE: lowered.compile(compiler_options=...).
MODULE:FUNCTION as for `tpudiag compile` (docs/compile.md). The compile outputs stay in -o DIR
(default: a fresh temporary directory, named on stderr) for `tpudiag diff` or `report`.
"""


def whatif_command(
    target: Annotated[str, typer.Argument(help="MODULE:FUNCTION (module path or dotted name), as for `compile`")],
    topology: Annotated[str, typer.Option("--topology", "-t", help="TPU topology, e.g. v5e:2x2, v6e:2x2, v5p:2x2x1")],
    xla_flag: Annotated[list[str] | None, typer.Option("--xla-flag", help="NAME=VALUE, e.g. "
                        "xla_tpu_enable_latency_hiding_scheduler=false (repeatable)")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="Compiler option KEY=VALUE for "
                      "lowered.compile(compiler_options=...) (repeatable)")] = None,
    each: Annotated[bool, typer.Option("--each", help="One variant per setting instead of one with all")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory for the compile outputs "
                                             "(baseline/, variant-N/); default: a fresh temporary directory")] = None,
    output_format: Annotated[str, typer.Option("--format", "-f", help="terminal or json")] = "terminal",
    static_profile: Annotated[bool | None, typer.Option("--static-profile/--no-static-profile",
                              help="Per-op estimated cycles from the static LLO profile (about +50 s per compile); "
                                   "default as for `compile`: on for v5e, v5p, v6e")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="Clock for cycles -> time (v6e and TPU7x have no "
                                                         "public one)")] = None,
    min_change: Annotated[float, typer.Option(help="Smallest modelled change called a change, in percent")] = 0.5,
    timeout_s: Annotated[float, typer.Option(help="Give up on each compile after this many seconds")] = 900.0,
) -> None:
    from tpudiag.cli.compile_cmd import parse_target_and_topology
    from tpudiag.cli.rules_cmd import check_format, check_number_option
    from tpudiag.errors import UsageError
    from tpudiag.whatif import plan_variants, whatif

    check_format(output_format)
    for name, value, positive in (("--clock-ghz", clock_ghz, True), ("--timeout-s", timeout_s, True),
                                  ("--min-change", min_change, False)):
        check_number_option(name, value, positive)
    parse_target_and_topology(target, topology)  # usage errors before any compile
    variants = plan_variants(xla_flag or (), option or (), each)
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="tpudiag-whatif-"))
    elif out.exists() and not out.is_dir():
        raise UsageError("exists and is not a directory", path=out)
    sys.stderr.write(f"tpudiag whatif: compile outputs in `{out}`\n")

    def progress(text: str) -> None:
        sys.stderr.write(f"tpudiag whatif: {text}\n")
        sys.stderr.flush()

    result = whatif(target, topology, variants, out, static_profile=static_profile, clock_ghz=clock_ghz,
                    timeout_s=timeout_s, min_change=min_change / 100, progress=progress)
    if output_format == "json":
        sys.stdout.write(json.dumps(whatif_json(result), indent=1) + "\n")
    else:
        render_whatif_terminal(result)


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
        "variants": [{"settings": [str(s) for s in v.variant.settings], **_side(v.compiled),
                      "schedule_changed": v.compiled.schedule_sha != result.baseline.schedule_sha,
                      "step_time_change_ps": v.diff.step_time.delta_ps if v.diff.step_time else None,
                      "step_time_significant": bool(v.diff.step_time and v.diff.step_time.significant),
                      **_finding_changes(v)}
                     for v in result.variants],
    }


def _finding_changes(v) -> dict:
    appeared, gone, renamed = v.finding_changes()
    return {"findings_appeared": [_finding(f) for f in appeared], "findings_resolved": [_finding(f) for f in gone],
            "findings_renamed": [{"base": _finding(a), "variant": _finding(b)} for a, b in renamed]}


def _change(base: float | None, new: float | None, fmt) -> str:
    if base is None or new is None:
        return "n/a"
    delta = new - base
    pct = f" ({delta / base:+.1%})" if base else ""
    return ("±0" if delta == 0 else ("+" if delta > 0 else "-") + fmt(abs(delta))) + pct


def render_whatif_terminal(result) -> None:
    from rich.table import Table

    from tpudiag.cli.console import stdout_console
    from tpudiag.model.units import fmt_bytes, fmt_time
    from tpudiag.render.console import markup

    console = stdout_console()
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
        appeared, gone, renamed = v.finding_changes()
        for title, refs in (("findings that appear", appeared), ("findings that go away", gone)):
            if refs:
                console.print(f"{title}: {len(refs)}")
                for f in refs:
                    console.print(f"  \\[{f.severity}] {markup(f.rule)}: {markup(f.message)}", soft_wrap=True)
        if renamed:
            names = ", ".join(f"`{markup(', '.join(a.ops))}` -> `{markup(', '.join(b.ops))}`" for a, b in renamed)
            console.print(f"findings unchanged on renamed ops: {len(renamed)} ({names})", soft_wrap=True,
                          highlight=False)
        if not (appeared or gone or renamed):
            console.print("findings: the same rules fire on the same ops")
        console.print(f"op by op: `tpudiag diff {markup(str(base.out))} {markup(str(new.out))}`", highlight=False,
                      soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("whatif", help=WHATIF_HELP)(whatif_command)
