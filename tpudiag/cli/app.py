"""The `tpudiag` command line. Data goes to stdout, diagnostics to stderr.

Exit codes: 0 clean, 1 findings at or above `--fail-on`, 2 usage or input error.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tpudiag.errors import TpudiagError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Performance diagnosis for TPU workloads from XProf captures and compiler dumps.")

EXAMPLE_CAPTURE = Path(__file__).resolve().parents[2] / "examples" / "captures" / "train_v6e_4chip"


class OutputFormat(str, Enum):
    terminal = "terminal"
    json = "json"


def stdout_console() -> Console:
    # Rich honours NO_COLOR itself; when piped, keep lines long enough for the tables.
    return Console(width=None if sys.stdout.isatty() else 140, soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def default_capture() -> Path:
    if not EXAMPLE_CAPTURE.exists():
        raise UsageError("no PATH given and the bundled example is not here",
                         path=EXAMPLE_CAPTURE, hint="run from a checkout of tpudiag, or pass a capture PATH")
    return EXAMPLE_CAPTURE


@app.command()
def report(
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file; "
                                                     "default: the bundled example")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format")]
    = OutputFormat.terminal,
    top: Annotated[int, typer.Option(help="Ops to list in the terminal report")] = 15,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
) -> None:
    """Print where each step's time goes and which ops dominate it."""
    from tpudiag.analysis.profile_analysis import analyze, build_report
    from tpudiag.parsers.capture import load_capture

    target = path if path is not None else default_capture()
    err = stderr_console()
    if err.is_terminal:
        with err.status(f"reading {target}"):
            profile = load_capture(target, jobs=jobs)
    else:
        profile = load_capture(target, jobs=jobs)
    result = build_report(analyze(profile))
    if output_format is OutputFormat.json:
        from tpudiag.render.json_format import render_json

        sys.stdout.write(render_json(result) + "\n")
    else:
        from tpudiag.render.terminal import render_terminal

        render_terminal(result, stdout_console(), top=top)


@app.callback()
def _root() -> None:
    """Performance diagnosis for TPU workloads from XProf captures and compiler dumps."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (typer); the project's own errors print one line and exit 2."""
    try:
        app(args=argv)
    except TpudiagError as exc:
        # Plain writes: the message must stay on one line whatever the terminal width.
        sys.stderr.write(f"error: {exc.one_line()}\n")
        if exc.hint:
            sys.stderr.write(f"hint: {exc.hint}\n")
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
