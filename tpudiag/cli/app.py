"""The `tpudiag` command line. Data goes to stdout, diagnostics to stderr.

Exit codes: 0 clean, 1 findings at or above `--fail-on`, 2 usage or input error.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from tpudiag.render.console import SafeConsole, markup

from tpudiag.cli import compile_cmd, rules_cmd
from tpudiag.cli import check_cmd, diff_cmd
from tpudiag.cli import tui_cmd
from tpudiag.cli import lab_cmd
from tpudiag.errors import TpudiagError, UsageError
from tpudiag.model.text import one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Performance diagnosis for TPU workloads from XProf captures and compiler dumps.")

EXAMPLE_CAPTURE = Path(__file__).resolve().parents[2] / "examples" / "models" / "captures" / "transformer_train_v5e"
# The compiler dumps the example capture was simulated from: with no PATH, `report` joins them so
# the bundled example shows every rule, spills included.
EXAMPLE_DUMPS = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps" / "transformer_train_v5e"


class OutputFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    md = "md"


def _plain() -> bool:
    # NO_COLOR (no-color.org) wins over FORCE_COLOR; rich alone would still emit bold and dim.
    return bool(os.environ.get("NO_COLOR"))


def stdout_console() -> Console:
    # When piped, keep lines long enough for the tables.
    return SafeConsole(width=None if sys.stdout.isatty() else 140, soft_wrap=False,
                   color_system=None if _plain() else "auto")


def stderr_console() -> Console:
    return SafeConsole(stderr=True, width=None if sys.stderr.isatty() else 140,
                   color_system=None if _plain() else "auto")


def default_capture() -> Path:
    if not EXAMPLE_CAPTURE.exists():
        raise UsageError("no PATH given and the bundled example is not here",
                         path=EXAMPLE_CAPTURE, hint="run from a checkout of tpudiag, or pass a capture PATH")
    return EXAMPLE_CAPTURE


@app.command()
def report(
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file, or a compiler "
                                                     "dump directory alone (static report); default: the "
                                                     "bundled example")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format")]
    = OutputFormat.terminal,
    top: Annotated[int, typer.Option(help="Ops to list in the terminal report")] = 15,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
    select: Annotated[list[str] | None, typer.Option(help="Run only these rules (names or codes, comma-separated)")]
    = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Do not run these rules (names or codes)")] = None,
    config: Annotated[Path | None, typer.Option(help="Rule configuration file (TOML); default: a tpudiag.toml "
                                                     "or pyproject.toml \\[tool.tpudiag] next to the input")] = None,
    fail_on: Annotated[str | None, typer.Option(help="Exit 1 when a finding at or above this severity "
                                                     "(info, low, medium, high) is reported")] = None,
    dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory for the rules and the "
                                                          "per-op padding/spill/cycle columns: LLO (--xla_jf_dump_to), "
                                                          "XLA (--xla_dump_to) or `tpudiag compile -o`; repeatable")]
    = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file (`-` for "
                                                "stdout; never inside the input); markdown figures go beside "
                                                "it as <stem>-*.png")] = None,
) -> None:
    """Print where each step's time goes, which ops dominate it, and the rules' findings."""
    from tpudiag.analysis.profile_analysis import analyze, build_report
    from tpudiag.parsers.capture import load_capture
    from tpudiag.rules import load_config, run_rules

    threshold = rules_cmd.parse_fail_on(fail_on)
    target = path if path is not None else default_capture()
    if path is None and not dumps and EXAMPLE_DUMPS.exists():
        dumps = [EXAMPLE_DUMPS]
    from tpudiag.cli.report_dumps import is_dump_directory, join_for_report, report_dump_directory
    from tpudiag.render.files import resolve_output

    output = resolve_output(output, [target, *(dumps or [])])  # `-o -` is stdout; never into an input
    if is_dump_directory(target):  # compiler dumps without a trace: the static report of `tpudiag compile`
        report_dump_directory(target, output_format.value, top=top, dumps=dumps, output=output)
        return
    rules_config = load_config(target, config).with_cli(select, ignore)
    rules_config.resolve()  # option errors are usage errors: report them before reading the capture
    extra_inputs, dump_labels = rules_cmd.load_dump_inputs(dumps)
    err = stderr_console()
    if err.is_terminal:
        with err.status(markup(f"reading {target}")):
            profile = load_capture(target, jobs=jobs)
    else:
        profile = load_capture(target, jobs=jobs)
    analysis = analyze(profile)
    analysis.join = join_for_report(analysis, extra_inputs)  # compiled facts per op, for rules and report
    findings, skipped = run_rules(analysis, rules_config, extra_inputs)
    result = build_report(analysis, tuple(findings), rules_run=True, rules_skipped=tuple(skipped),
                          dumps=dump_labels)
    if output is not None or output_format is OutputFormat.md:
        from tpudiag.cli.outputs import write_report

        write_report(result, output_format.value, output, top=top)
    elif output_format is OutputFormat.json:
        from tpudiag.render.json_format import render_json

        sys.stdout.write(render_json(result) + "\n")
    else:
        from tpudiag.render.terminal import render_terminal

        render_terminal(result, stdout_console(), top=top)
    if threshold is not None and any(f.severity >= threshold for f in result.findings):
        raise typer.Exit(1)


rules_cmd.register(app)
compile_cmd.register(app)
diff_cmd.register(app)
check_cmd.register(app)
tui_cmd.register(app)
lab_cmd.register(app)


@app.callback()
def _root() -> None:
    """Performance diagnosis for TPU workloads from XProf captures and compiler dumps."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (typer); the project's own errors print one line and exit 2."""
    try:
        app(args=argv)
    except TpudiagError as exc:
        # Plain writes: the message must stay on one line whatever the terminal width.
        # Messages quote trace text (file and op names): shown escaped, never as terminal controls.
        sys.stderr.write(f"error: {one_line(exc.one_line())}\n")
        if exc.hint:
            sys.stderr.write(f"hint: {one_line(exc.hint)}\n")
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
