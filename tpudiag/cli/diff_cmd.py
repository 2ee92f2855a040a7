"""`tpudiag diff BASE NEW`: what changed between two captures, beyond run-to-run noise.

Exit codes: 0 (a diff is information, whatever it shows), 2 usage or input error. Use
`tpudiag check --baseline` to fail a build on a regression.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.errors import UsageError


class DiffFormat(str, Enum):
    terminal = "terminal"
    md = "md"
    json = "json"


COMPILE_RESULT = "result.json"  # marks a `tpudiag compile` output directory


def is_compile_output(path: Path) -> bool:
    return path.is_dir() and (path / COMPILE_RESULT).is_file()


def _load(path: Path, jobs: int | None, clock_ghz: float | None):
    """The profile of a capture, or of a compiled program through `tpudiag simulate` (modelled)."""
    from tpudiag.parsers.capture import load_capture

    if not is_compile_output(path):
        return load_capture(path, jobs=jobs)
    import tempfile

    from tpudiag.compiler.dumps import load_compile_output
    from tpudiag.compiler.simulate import simulate

    with tempfile.TemporaryDirectory(prefix="tpudiag-diff-") as tmp:
        simulate(load_compile_output(path), Path(tmp), clock_ghz=clock_ghz)
        profile = load_capture(Path(tmp), jobs=jobs)
    profile.input_path = str(path)  # the temporary capture is gone; name what the user gave
    profile.modelled = True
    return profile


def analyse_capture(path: Path, config: Path | None, jobs: int | None, clock_ghz: float | None = None,
                    dumps: list[Path] | None = None):
    """(analysis, findings, compiled facts per op) of one capture or compiled program.

    The rules see `dumps` (and, for a compile output, its own dumps); the compiled facts join those
    and the HLO the capture embeds to the ops (`tpudiag.analysis.join`).
    """
    from tpudiag.analysis.profile_analysis import analyze
    from tpudiag.cli.report_dumps import join_for_report
    from tpudiag.cli.rules_cmd import load_dump_inputs
    from tpudiag.rules import load_config, run_rules

    rules_config = load_config(path, config)
    rules_config.resolve()
    all_dumps = ([path] if is_compile_output(path) else []) + list(dumps or [])
    extra_inputs, _ = load_dump_inputs(all_dumps)
    analysis = analyze(_load(path, jobs, clock_ghz))
    findings, _ = run_rules(analysis, rules_config, extra_inputs)
    joined = join_for_report(analysis, extra_inputs)
    return analysis, findings, joined.columns


def noise_options(min_change: float):
    from tpudiag.analysis.diff import NoiseOptions
    from tpudiag.cli.rules_cmd import check_number_option

    check_number_option("--min-change", min_change)
    try:
        return NoiseOptions(min_relative=min_change / 100)
    except ValueError as exc:
        raise UsageError(f"--min-change: {exc}") from exc


def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: a capture (logdir, run directory or .xplane.pb file) "
                                              "or a `tpudiag compile` output directory")],
    new: Annotated[Path, typer.Argument(help="Capture or compile output to compare with the baseline")],
    output_format: Annotated[DiffFormat, typer.Option("--format", "-f", help="Output format")] = DiffFormat.terminal,
    min_change: Annotated[float, typer.Option(help="Smallest change reported, in percent of the base value; "
                                                   "the per-step spread can widen the band further")] = 2.0,
    top: Annotated[int, typer.Option(help="Ops to list per section")] = 15,
    config: Annotated[Path | None, typer.Option(help="Rule configuration file (TOML) for both captures")] = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the diff to this file (`-` for stdout; "
                                                                    "never inside an input)")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="For compile outputs: the clock turning estimated cycles "
                                                         "into time, as in `tpudiag simulate`")] = None,
    base_dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory of BASE (LLO and/or XLA), "
                                                               "for spills, padding and the rules; repeatable")] = None,
    new_dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory of NEW; repeatable")] = None,
) -> None:
    """Compare two captures step by step: step time, breakdown, collectives, ops and findings.

    A change is reported only beyond its noise band: the largest of --min-change percent of the
    base value and either run's spread over steps (half the p10-p90 range); see the output's last
    lines. Ops are matched by canonical-HLO fingerprint when unique, else by (module, name, shape).
    A `tpudiag compile` output is first simulated (modelled times, as `tpudiag simulate`); the
    output then says so.
    """
    from tpudiag.analysis.diff import diff_analyses
    from tpudiag.cli.rules_cmd import check_number_option
    from tpudiag.render.files import atomic_open, resolve_output, write_output

    options = noise_options(min_change)
    check_number_option("--clock-ghz", clock_ghz, positive=True)
    output = resolve_output(output, [base, new, *(base_dumps or []), *(new_dumps or [])])
    base_analysis, base_findings, base_compiled = analyse_capture(base, config, jobs, clock_ghz, base_dumps)
    new_analysis, new_findings, new_compiled = analyse_capture(new, config, jobs, clock_ghz, new_dumps)
    result = diff_analyses(base_analysis, new_analysis, base_findings, new_findings, options,
                           base_compiled=base_compiled, new_compiled=new_compiled)
    if output_format is DiffFormat.terminal:
        from tpudiag.cli.app import stdout_console
        from tpudiag.render.console import SafeConsole
        from tpudiag.render.diff_terminal import render_diff_terminal

        if output is None:
            render_diff_terminal(result, stdout_console(), top=top)
        else:
            with atomic_open(output) as fh:
                render_diff_terminal(result, SafeConsole(file=fh, width=140, no_color=True), top=top)
        return
    if output_format is DiffFormat.md:
        from tpudiag.render.diff_markdown import render_diff_markdown

        body = render_diff_markdown(result, top=top)
    else:
        from tpudiag.render.diff_json import render_diff_json

        body = render_diff_json(result) + "\n"
    write_output(output, body)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
