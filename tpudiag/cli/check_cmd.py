"""`tpudiag check PATH`: a CI gate on a capture's findings and on its step time against a baseline.

Exit codes:
  0  every check passed
  1  a check failed: a finding at or above `--fail-on`, or step time regressed beyond
     `--max-regression` percent *and* beyond the noise band (see `tpudiag diff`)
  2  usage or input error (unreadable capture, bad option, no steps to compare)

The policy (defaults, what fails, the warnings) is `tpudiag.gate`; this command parses its
arguments, calls `gate()` and prints the verdict (`tpudiag.cli.outputs.emit`, `-o FILE` as for
`report`). `--format json` prints one object for machines: `result` (pass, fail or error),
`exit_code`, `checks`, `step_time`, `findings`, `warnings` (also printed on stderr as `warning:`
lines: the capture's warnings as `report` gives them, `diff`'s against the baseline, a host-only
capture); on an input or usage error, `result: error` with `error` and `hint` on stdout (the
message is on stderr as well).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import SCHEDULER_HELP, Chip, TerminalOrJson
from tpudiag.errors import TpudiagError, UsageError
from tpudiag.model.text import one_line


def check(
    path: Annotated[Path, typer.Argument(help="Capture to check: logdir, run directory or .xplane.pb file")],
    baseline: Annotated[Path | None, typer.Option(help="Baseline capture to compare step time with")] = None,
    fail_on: Annotated[str | None, typer.Option(help="Fail on a finding at or above this severity (info, low, "
                                                     "medium, high); default high when no --baseline")] = None,
    max_regression: Annotated[float | None, typer.Option(help="Fail when the median step time rises more than "
                                                              "this percent over --baseline, beyond noise "
                                                              "(default 5)")] = None,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
    = TerminalOrJson.terminal,
    config: Annotated[Path | None, typer.Option(help="Rule configuration file (TOML)")] = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
    scheduler: Annotated[str | None, typer.Option(help=SCHEDULER_HELP)] = None,
    chip: Annotated[Chip | None, typer.Option(help="TPU generation of compiler dumps that do not name it")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the verdict to this file (`-` for "
                                                                    "stdout; never inside an input)")] = None,
) -> None:
    """CI gate: exit 0 when every check passes, 1 when one fails, 2 on usage or input errors."""
    from tpudiag.writers.files import resolve_output, write_output

    json_output = output_format.value == "json"
    verdict_file = None  # where the JSON goes once `-o` is known to be writable: stdout until then
    try:
        from tpudiag.cli.outputs import emit
        from tpudiag.cli.rules_cmd import check_number_option, parse_fail_on
        from tpudiag.gate import gate

        output = verdict_file = resolve_output(output, [path, baseline])
        if max_regression is not None and baseline is None:
            raise UsageError("--max-regression needs --baseline", hint="pass the baseline capture with --baseline")
        check_number_option("--max-regression", max_regression)
        threshold = parse_fail_on(fail_on)
        verdict = gate(path, baseline=baseline, fail_on=threshold, max_regression_pct=max_regression,
                       config=config, jobs=jobs, chip=chip.value if chip else None, scheduler=scheduler)
        for w in verdict.warnings:  # diagnostics: stderr, escaped (they quote host and file names)
            sys.stderr.write(f"warning: {one_line(w)}\n")
        emit(verdict, output_format.value, output)
    except TpudiagError as exc:
        if json_output:  # machines get an answer where they asked for the verdict too; main() prints stderr
            body = json.dumps({"result": "error", "exit_code": exc.exit_code, "error": exc.one_line(),
                               "hint": exc.hint}, indent=2) + "\n"
            try:
                write_output(verdict_file, body)
            except TpudiagError:  # the file is what failed: stdout still gets the answer
                write_output(None, body)
        raise
    if verdict.exit_code:
        raise typer.Exit(verdict.exit_code)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
