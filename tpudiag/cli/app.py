"""The `tpudiag` command line. Data goes to stdout, diagnostics to stderr.

Exit codes: 0 clean, 1 findings at or above `--fail-on`, 2 usage or input error.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli import compile_cmd, rules_cmd
from tpudiag.cli import check_cmd, diff_cmd
from tpudiag.cli import tui_cmd
from tpudiag.cli import lab_cmd
from tpudiag.cli import memory_cmd
from tpudiag.cli import run_cmd, whatif_cmd
from tpudiag.cli.console import stderr_console
from tpudiag.cli.options import SCHEDULER_HELP, Chip, Format
from tpudiag.errors import TpudiagError, UsageError
from tpudiag.model.text import one_line
from tpudiag.render.console import markup

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Performance diagnosis for TPU workloads from XProf captures and compiler dumps.")

def default_capture() -> Path:
    from tpudiag.examples_data import bundled_capture

    return bundled_capture()


@app.command()
def report(
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file, or a compiler "
                                                     "dump directory alone (static report); default: the "
                                                     "bundled example")] = None,
    output_format: Annotated[Format, typer.Option("--format", "-f", help="Output format")]
    = Format.terminal,
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
    chip: Annotated[Chip | None, typer.Option(help="TPU generation, where the files do not say it (compiler "
                                                   "dumps without `target_arguments.txt`)")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="Compiler dumps alone: the clock turning estimated cycles "
                                                         "into time (default: the public clock, else the "
                                                         "FLOPs/bytes roofline)")] = None,
    scheduler: Annotated[str | None, typer.Option(help=SCHEDULER_HELP)] = None,
    error: Annotated[Path | None, typer.Option("--error", help=memory_cmd.ERROR_HELP)] = None,
    trace_out: Annotated[Path | None, typer.Option("--trace-out", help="Also write the device timeline of the "
                                                   "analysed steps, the findings marked on their ops, as Chrome "
                                                   "trace-event JSON for Perfetto (ui.perfetto.dev)")] = None,
) -> None:
    """Print where each step's time goes, which ops dominate it, and the rules' findings.

    PATH may also be an fsspec URL of a capture (`gs://bucket/logdir`) with the cloud extra installed.
    """
    with imports_uncollected():  # numpy, the pipeline and pandas: objects that live as long as the process
        no_huge_pages()
        from tpudiag.parsers import read_ahead
        from tpudiag.writers.files import resolve_output

        threshold = rules_cmd.parse_fail_on(fail_on)
        rules_cmd.check_number_option("--clock-ghz", clock_ghz, positive=True)
        # `-o -` is stdout; never into an input (checked before reading anything)
        inputs = [path if path is not None else default_capture(), *(dumps or [])]
        output = resolve_output(output, inputs)
        if trace_out is not None:
            if resolve_output(trace_out, inputs) is None:
                raise UsageError("--trace-out needs a file name, not stdout", hint="e.g. --trace-out trace.json")
            if output is not None and trace_out.expanduser().resolve() == output.expanduser().resolve():
                raise UsageError("--trace-out and -o name the same file", path=trace_out)
        error_text = memory_cmd.read_error_text(error)
        if path is not None and scheduler is None and (jobs is None or jobs >= 1):
            # The host file of a one-host capture is read and parsed on the other core while the pipeline imports.
            read_ahead.start(path, jobs)
        from tpudiag.pipeline import diagnose
    err = stderr_console()
    status = err.status("reading") if err.is_terminal else None

    def progress(text: str) -> None:
        if status is not None:
            status.update(markup(text))  # the text names host files: trace-controlled

    if status is not None:
        status.start()
    try:
        result = diagnose(path, dumps=dumps or (), config=config, chip=chip.value if chip else None, jobs=jobs,
                          progress=progress, select=select, ignore=ignore, clock_ghz=clock_ghz,
                          scheduler=scheduler, error=error_text)
    finally:
        if status is not None:
            status.stop()
    from tpudiag.cli.outputs import emit
    from tpudiag.gate import findings_check  # `check`'s findings policy: the same "at or above"

    if trace_out is not None:
        written = result.write_trace(trace_out)
        err.print(f"trace: {written.n_ops:,} op slices, {written.n_findings} findings marked, "
                  f"written to `{markup(str(trace_out))}` (open it at ui.perfetto.dev)", highlight=False, soft_wrap=True)
    emit(result, output_format, output, top=top)
    if threshold is not None and not findings_check(result.findings, threshold).passed:
        raise typer.Exit(1)


rules_cmd.register(app)
compile_cmd.register(app)
diff_cmd.register(app)
check_cmd.register(app)
tui_cmd.register(app)
lab_cmd.register(app)
memory_cmd.register(app)
run_cmd.register(app, report)
whatif_cmd.register(app)


def _print_version(value: bool) -> None:
    if value:
        from tpudiag.version import __version__

        sys.stdout.write(f"tpudiag {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Performance diagnosis for TPU workloads from XProf captures and compiler dumps."""


# glibc's malloc hands blocks of 128 KiB and more back to the kernel when they are freed (its
# threshold then grows with the largest block freed, and the heap's top is trimmed past twice
# that), so the array temporaries of a host's parse and digest, freed and allocated again
# hundreds of times, fault their pages in afresh each time: about a third of a one-host report's
# CPU time was system time. The command is the whole process, so it keeps what it frees for the
# next allocation instead (its peak grows by a few MB; docs/speed.md).
# Its threads (`parsers.read_ahead`, the plane threads of `parsers.capture`) allocate from the
# same arena, so that what one frees the next reuses (per-thread arenas took the peak from 384 to
# 493 MB, and faulted in 50 % more pages).
_KEEP_FREED_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt(3) parameters, glibc's values


def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory in the process (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    mallopt(_M_MMAP_THRESHOLD, _KEEP_FREED_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES)
    mallopt(_M_ARENA_MAX, 1)


def no_huge_pages() -> None:
    """Stop numpy asking the kernel for transparent huge pages (`madvise`) for its large arrays,
    in this process only (the environment variable would reach `tpudiag run`'s program too).

    Where the kernel's THP `defrag` setting is `madvise` (a common default), each such fault may
    compact memory synchronously: a one-host report spent 0.2 s more system time with them
    (docs/speed.md), and its arrays are each used a few times, not long enough to repay it.
    """
    import numpy as np

    np._core.multiarray._set_madvise_hugepage(False)


# Python's cyclic garbage collector runs a young-generation pass every 700 container objects
# allocated, and each pass looks at every young object still alive. The command's imports create
# hundreds of thousands of long-lived objects (classes, functions, dataclasses) and its data
# lives in numpy arrays, not in Python containers, so those passes find almost nothing: a
# one-host report ran 250 of them for about 0.13 s of CPU (7 %). Every 100,000 objects it runs
# one or two (docs/speed.md); cyclic garbage still goes, only in fewer, larger passes.
_YOUNG_COLLECTION_OBJECTS = 100_000


# Whether the process is the command's own (`main` called without `argv`): only then may it freeze
# objects out of the collector (`imports_uncollected`, `no_collection_at_exit`).
_command_process = False


def fewer_collections() -> None:
    """Run the garbage collector's young-generation pass every `_YOUNG_COLLECTION_OBJECTS`
    allocations instead of every 700 (the older generations' thresholds are kept)."""
    import gc

    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION_OBJECTS, older, oldest)


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """Import without the garbage collector, then leave what the imports made out of later collections
    (`gc.freeze`), where the process is the command's own (`main` without `argv`); elsewhere nothing.

    The report's imports (numpy, pandas, the pipeline) make some 100,000 objects that live until the
    process ends; with the young threshold at `_YOUNG_COLLECTION_OBJECTS` they set off one young pass
    in the middle of pandas' import that walks them all and frees next to nothing (about 45 ms of CPU,
    docs/speed.md). Frozen, they are never walked, and the count of allocations starts again from
    zero: a one-host report then runs no collection at all.
    """
    import gc

    if not _command_process:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def no_collection_at_exit() -> None:
    """Leave the objects alive now out of the collection Python runs as it exits (`gc.freeze`).

    At exit the interpreter clears every module and collects the cycles that leaves (classes,
    functions and their globals: the imports' hundreds of thousands of objects, pandas' and the
    rules' among them) one by one, only to hand the memory back to a process that ends: 0.2-0.3 s of
    a one-host report's CPU (docs/speed.md). Frozen, they stay until the process ends; `atexit`
    handlers, buffered output and finalizers run as before.
    """
    import gc

    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (typer); the project's own errors print one line and exit 2.
    Called without `argv`, as the process's command (`tpudiag`, `python -m tpudiag`), the process
    skips the garbage collection of its exit (`no_collection_at_exit`); called with it (tests, other
    programs), nothing the caller holds is frozen. Either way the collector's young threshold
    (`fewer_collections`) and malloc's settings (`keep_freed_memory`) are set for the process."""
    global _command_process
    _command_process = argv is None
    fewer_collections()
    keep_freed_memory()
    try:
        app(args=argv)
    except TpudiagError as exc:
        # Plain writes: the message must stay on one line whatever the terminal width.
        # Messages quote trace text (file and op names): shown escaped, never as terminal controls.
        sys.stderr.write(f"error: {one_line(exc.one_line())}\n")
        if exc.hint:
            sys.stderr.write(f"hint: {one_line(exc.hint)}\n")
        sys.exit(exc.exit_code)
    finally:
        if argv is None:
            no_collection_at_exit()


if __name__ == "__main__":
    main()
