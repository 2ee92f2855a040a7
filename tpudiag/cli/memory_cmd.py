"""`tpudiag memory PATH`: what holds device memory at the peak, and why a program does not fit.

`--error FILE` (`-` for stdin) is shared with `tpudiag report`: the `RESOURCE_EXHAUSTED` text
JAX printed, joined to the compiled program.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.memory_runtime import PPROF_HELP
from tpudiag.cli.options import Chip, TerminalOrJson
from tpudiag.errors import InputError

ERROR_HELP = ("A RESOURCE_EXHAUSTED error text from JAX (a file, or `-` for stdin): its HBM or VMEM figures are "
              "joined to the compiled program")


def read_error_text(error: Path | None) -> str | None:
    """The text of `--error FILE` (`-`: stdin); an unreadable file is an input error naming it."""
    if error is None:
        return None
    if str(error) == "-":
        return sys.stdin.read()
    from tpudiag.parsers.input_files import read_input_text

    if not error.exists():
        raise InputError("no such file", path=error)
    return read_input_text(error, limit=1 << 20)


def memory(
    path: Annotated[Path | None, typer.Argument(help="Compiler dump directory (XLA `--xla_dump_to` or `tpudiag "
                                                     "compile -o`), or a capture (with --dumps; its allocator's "
                                                     "timeline where it traced one); default: the bundled example, "
                                                     "or none with --pprof")] = None,
    dumps: Annotated[list[Path] | None, typer.Option(help="XLA dump directory of the capture's program; "
                                                          "repeatable")] = None,
    error: Annotated[Path | None, typer.Option("--error", help=ERROR_HELP)] = None,
    chip: Annotated[Chip | None, typer.Option(help="TPU generation, where the files do not say it")] = None,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
    = TerminalOrJson.terminal,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (`-` for stdout; "
                                                                       "never inside the input)")] = None,
    top: Annotated[int, typer.Option(help="Buffers at the peak to list in the terminal table")] = 15,
    pprof: Annotated[Path | None, typer.Option("--pprof", help=PPROF_HELP)] = None,
) -> None:
    """Device memory of the compiled program: the peak per memory space, what is live at it, and what would lower it."""
    from tpudiag.cli.memory_runtime import measured_memory
    from tpudiag.cli.outputs import MemoryView, emit
    from tpudiag.examples_data import bundled_capture
    from tpudiag.pipeline import diagnose
    from tpudiag.writers.files import resolve_output

    compiled_view = not (path is None and pprof is not None and not dumps and error is None)
    shown = [path if path is not None else bundled_capture()] if compiled_view else []
    output = resolve_output(output, [*shown, *(dumps or []), *([pprof] if pprof else [])])
    text = read_error_text(error)
    report = None
    if compiled_view:
        result = diagnose(path, dumps=dumps or (), chip=chip.value if chip else None, error=text,
                          select="hbm-pressure")
        report = result.memory()
    # After diagnose: a capture it cannot read at all is its one error line, not also a warning here.
    measured = measured_memory(path, pprof)
    emit(MemoryView(report, measured), output_format.value, output, top=top)


def register(app: typer.Typer) -> None:
    app.command()(memory)
