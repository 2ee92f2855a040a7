"""`tpudiag tui PATH`: the interactive terminal UI. Textual is imported only when the command runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.errors import UsageError

TUI_HINT = "install it with `pip install 'tpudiag[tui]'`"


def tui(
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file; "
                                                     "default: the bundled example")] = None,
    dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory (LLO `--xla_jf_dump_to` or XLA "
                                                          "`--xla_dump_to`) for per-op spills, padding and cycles; "
                                                          "repeatable")] = None,
) -> None:
    """Browse a capture interactively: overview, findings, ops, step timeline, hosts."""
    try:
        import textual  # noqa: F401  (the optional `tui` extra)
    except ImportError:
        raise UsageError("the terminal UI needs the `textual` package, which is not installed",
                         hint=TUI_HINT) from None
    from tpudiag.examples_data import bundled_capture, bundled_dumps
    from tpudiag.parsers.capture_files import find_capture
    from tpudiag.tui.app import TpudiagApp

    target = path if path is not None else bundled_capture()
    if path is None and not dumps:
        dumps = list(bundled_dumps())  # as `tpudiag report` with no PATH
    find_capture(target)  # a wrong PATH is a one-line error before the screen is taken over
    for d in dumps or ():
        if not d.is_dir():
            raise UsageError("--dumps: not a directory", path=d)
    if not _is_terminal():  # piped or redirected: the app would take over nothing and wait for keys
        raise UsageError("the terminal UI needs a terminal (stdin or stdout is not one)",
                         hint="for a file or a pipe use `tpudiag report` (`--format json` or `md`)")
    TpudiagApp(target, dumps=tuple(dumps or ())).run()


def _is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def register(app: typer.Typer) -> None:
    app.command("tui")(tui)
