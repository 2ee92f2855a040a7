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

ERROR_HELP = ("A RESOURCE_EXHAUSTED error text from JAX, libtpu or TensorFlow (a file, or `-` for stdin): "
              "analysed on its own, and joined to a program of PATH only when it names it or its sizes match")
# The most of an --error text read, from a file or stdin alike: an OOM report is a few KiB.
ERROR_TEXT_CAP = 1 << 20


def read_error_text(error: Path | None) -> str | None:
    """The text of `--error FILE` (`-`: stdin): its first ERROR_TEXT_CAP bytes, undecodable bytes
    replaced; an unreadable file is an input error naming it."""
    if error is None:
        return None
    if str(error) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text-only stdin (an embedding that replaced it): take its text
            return sys.stdin.read(ERROR_TEXT_CAP)
        try:
            return stream.read(ERROR_TEXT_CAP).decode("utf-8", errors="replace")
        except OSError as exc:
            raise InputError(f"cannot read stdin ({exc.strerror or exc})", path="-") from exc
    from tpudiag.parsers.input_files import read_input_text

    if not error.exists():
        raise InputError("no such file", path=error)
    return read_input_text(error, limit=ERROR_TEXT_CAP)


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

    error_alone = path is None and not dumps and error is not None  # the user's OOM, not the bundled example
    compiled_view = not (path is None and pprof is not None and not dumps and error is None) and not error_alone
    shown = [path if path is not None else bundled_capture()] if compiled_view else []
    output = resolve_output(output, [*shown, *(dumps or []), *([pprof] if pprof else [])])
    text = read_error_text(error)
    report = None
    timelines = None  # the allocator's, read in the diagnosis's own pass over a capture PATH
    if error_alone:
        from tpudiag.analysis.device_memory import error_report
        from tpudiag.pipeline import parse_error_text

        report = error_report(str(error), parse_error_text(text))
    elif compiled_view:
        result = diagnose(path, dumps=dumps or (), chip=chip.value if chip else None, error=text,
                          select="hbm-pressure", memory_timeline=path is not None)
        report = result.memory()
        if path is not None:
            timelines = result.memory_timelines()
    # After diagnose: a capture it cannot read at all is its one error line, not also a warning here.
    measured = measured_memory(timelines, pprof)
    if report is not None:
        from tpudiag.analysis.device_memory import with_allocator_capacity

        report = with_allocator_capacity(report, [a.capacity_bytes for t in measured.timelines for a in t.allocators])
    emit(MemoryView(report, measured), output_format.value, output, top=top)


def register(app: typer.Typer) -> None:
    app.command()(memory)
