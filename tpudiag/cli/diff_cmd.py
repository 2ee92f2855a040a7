"""`tpudiag diff BASE NEW`: what changed between two captures, beyond run-to-run noise.

Exit codes: 0 (a diff is information, whatever it shows), 2 usage or input error. Use
`tpudiag check --baseline` to fail a build on a regression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import SCHEDULER_HELP, Chip, Format
from tpudiag.errors import UsageError


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
    output_format: Annotated[Format, typer.Option("--format", "-f", help="Output format")] = Format.terminal,
    min_change: Annotated[float, typer.Option(help="Smallest change reported, in percent of the base value; "
                                                   "the per-step spread can widen the band further")] = 2.0,
    top: Annotated[int, typer.Option(help="Ops to list per section")] = 15,
    config: Annotated[Path | None, typer.Option(help="Rule configuration file (TOML) for both captures")] = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
    scheduler: Annotated[str | None, typer.Option(help=SCHEDULER_HELP)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the diff to this file (`-` for stdout; "
                                                                    "never inside an input)")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="For compile outputs: the clock turning estimated cycles "
                                                         "into time, as in `tpudiag simulate`")] = None,
    base_dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory of BASE (LLO and/or XLA), "
                                                               "for spills, padding and the rules; repeatable")] = None,
    new_dumps: Annotated[list[Path] | None, typer.Option(help="Compiler dump directory of NEW; repeatable")] = None,
    chip: Annotated[Chip | None, typer.Option(help="TPU generation of compiler dumps that do not name it")] = None,
) -> None:
    """Compare two captures step by step: step time, breakdown, collectives, ops and findings.

    A change is reported only beyond its noise band: the largest of --min-change percent of the
    base value and either run's spread over steps (half the p10-p90 range); see the output's last
    lines. Ops are matched by canonical-HLO fingerprint when unique, else by (module, name, shape).
    A `tpudiag compile` output is first simulated (modelled times, as `tpudiag simulate`); the
    output then says so.
    """
    from tpudiag.cli.outputs import emit
    from tpudiag.cli.rules_cmd import check_number_option
    from tpudiag.pipeline import compare
    from tpudiag.writers.files import resolve_output

    options = noise_options(min_change)
    check_number_option("--clock-ghz", clock_ghz, positive=True)
    output = resolve_output(output, [base, new, *(base_dumps or []), *(new_dumps or [])])
    result = compare(base, new, base_dumps=base_dumps or (), new_dumps=new_dumps or (), config=config, jobs=jobs,
                     clock_ghz=clock_ghz, noise=options, chip=chip.value if chip else None,
                     scheduler=scheduler).result
    emit(result, output_format.value, output, top=top)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
