"""`tpudiag whatif MODULE:FUNCTION --topology T --xla-flag NAME=VALUE`: a flag's modelled effect, no TPU."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import TerminalOrJson

WHATIF_HELP = """Compile MODULE:FUNCTION without a TPU with and without some settings, and print the modelled difference.

The baseline compiles with the default settings; the variant with every --xla-flag and --option
given (--each: one variant per setting). Each compile output is laid on a modelled timeline as in
`tpudiag report DIR` and compared with the baseline: step time, exposed collective time, the HBM
peak (the compiler's memory_analysis), the collective schedule, and the findings that appear or
go away. Every figure is modelled from the compiler's estimates, never measured.
--xla-flag NAME=VALUE: to LIBTPU_INIT_ARGS when libtpu registers NAME, to XLA_FLAGS when XLA
does (both lists read from the installed versions, cached), said for each variant; one flag per
--xla-flag (no whitespace or `--` in VALUE), and none that sets the dumps.
--option KEY=VALUE: lowered.compile(compiler_options=...).
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
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
    = TerminalOrJson.terminal,
    static_profile: Annotated[bool | None, typer.Option("--static-profile/--no-static-profile",
                              help="Per-op estimated cycles from the static LLO profile (about +50 s per compile); "
                                   "default as for `compile`: on for v5e, v5p, v6e")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="Clock for cycles -> time (v6e and TPU7x have no "
                                                         "public one)")] = None,
    min_change: Annotated[float, typer.Option(help="Smallest modelled change called a change, in percent")] = 0.5,
    timeout_s: Annotated[float, typer.Option(help="Give up on each compile after this many seconds")] = 900.0,
) -> None:
    from tpudiag.cli.compile_cmd import parse_target_and_topology
    from tpudiag.cli.outputs import emit
    from tpudiag.cli.rules_cmd import check_number_option
    from tpudiag.errors import UsageError
    from tpudiag.whatif import plan_variants, whatif

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
    emit(result, output_format.value, None)


def register(app: typer.Typer) -> None:
    app.command("whatif", help=WHATIF_HELP)(whatif_command)
