"""`tpudiag check PATH`: a CI gate on a capture's findings and on its step time against a baseline.

Exit codes:
  0  every check passed
  1  a check failed: a finding at or above `--fail-on`, or step time regressed beyond
     `--max-regression` percent *and* beyond the noise band (see `tpudiag diff`)
  2  usage or input error (unreadable capture, bad option, no steps to compare)

Defaults: with neither `--fail-on` nor `--baseline`, the gate fails on `high` findings. With
`--baseline` and no `--max-regression`, the allowed rise of the median step time is 5 % (Marin's
`track` gate). `--format json` prints one object for machines: `result` (pass, fail or error),
`exit_code`, `checks`, `step_time`, `findings`, `warnings` (also printed on stderr as `warning:`
lines: `tpudiag.pipeline.check_warnings`, i.e. the capture's warnings as `report` gives them, `diff`'s
against the baseline, a host-only capture); on an input error, `result: error` with `error` and
`hint` (the message is on stderr as well).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from tpudiag.cli.options import SCHEDULER_HELP, Chip
from tpudiag.errors import InputError, TpudiagError, UsageError
from tpudiag.model.text import one_line

DEFAULT_FAIL_ON = "high"
DEFAULT_MAX_REGRESSION_PCT = 5.0


class CheckFormat(str, Enum):
    terminal = "terminal"
    json = "json"


@dataclass(frozen=True)
class CheckResult:
    name: str  # "findings" or "step-time-regression"
    passed: bool
    detail: str  # one line, numbers inline


def findings_check(findings, threshold) -> CheckResult:
    bad = [f for f in findings if f.severity >= threshold]
    label = threshold.label()
    if not bad:
        return CheckResult("findings", True, f"no finding at or above {label} ({len(findings)} findings in all)")
    worst = bad[0]
    return CheckResult("findings", False, f"{len(bad)} finding{'s' * (len(bad) != 1)} at or above {label}; "
                                          f"first: [{worst.severity.label()}] {worst.rule}: {worst.message}")


def regression_check(change, max_regression_pct: float) -> CheckResult:
    from tpudiag.render.diff_format import fmt_ci
    from tpudiag.model.units import fmt_time

    rel = change.relative or 0.0
    detail = (f"median step time {fmt_time(change.base.centre_ps)} -> {fmt_time(change.new.centre_ps)} "
              f"({100 * rel:+.1f}%; allowed +{max_regression_pct:g}%; noise band ±{fmt_time(change.noise_band_ps)}; "
              f"95% interval {fmt_ci(change)})")
    failed = change.significant and change.delta_ps > 0 and rel * 100 > max_regression_pct
    return CheckResult("step-time-regression", not failed, detail)


def check(
    path: Annotated[Path, typer.Argument(help="Capture to check: logdir, run directory or .xplane.pb file")],
    baseline: Annotated[Path | None, typer.Option(help="Baseline capture to compare step time with")] = None,
    fail_on: Annotated[str | None, typer.Option(help="Fail on a finding at or above this severity (info, low, "
                                                     "medium, high); default high when no --baseline")] = None,
    max_regression: Annotated[float | None, typer.Option(help="Fail when the median step time rises more than "
                                                              "this percent over --baseline, beyond noise "
                                                              "(default 5)")] = None,
    output_format: Annotated[CheckFormat, typer.Option("--format", "-f", help="Output format")]
    = CheckFormat.terminal,
    config: Annotated[Path | None, typer.Option(help="Rule configuration file (TOML)")] = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for parsing hosts (default: CPU count)")] = None,
    scheduler: Annotated[str | None, typer.Option(help=SCHEDULER_HELP)] = None,
    chip: Annotated[Chip | None, typer.Option(help="TPU generation of compiler dumps that do not name it")] = None,
) -> None:
    """CI gate: exit 0 when every check passes, 1 when one fails, 2 on usage or input errors."""
    try:
        from tpudiag.cli.rules_cmd import check_number_option, parse_fail_on
        from tpudiag.pipeline import check_warnings, compare, diagnose
        from tpudiag.render.json_format import finding_to_dict

        if max_regression is not None and baseline is None:
            raise UsageError("--max-regression needs --baseline", hint="pass the baseline capture with --baseline")
        check_number_option("--max-regression", max_regression)
        if fail_on is None and baseline is None:
            fail_on = DEFAULT_FAIL_ON
        threshold = parse_fail_on(fail_on)

        chip_name = chip.value if chip else None
        compared = None  # the comparison with the baseline, when there is one
        if baseline is not None:
            compared = compare(baseline, path, config=config, jobs=jobs, chip=chip_name, scheduler=scheduler)
            checked = compared.new
        else:
            checked = diagnose(path, config=config, jobs=jobs, chip=chip_name, scheduler=scheduler)
        findings = checked.findings
        checks: list[CheckResult] = []
        step_change = None
        if threshold is not None:
            checks.append(findings_check(findings, threshold))
        if compared is not None:
            if compared.result.step_time is None:
                raise InputError("cannot compare step times: a capture has no steps", path=path,
                                 hint="both captures need a Steps line or XLA Modules executions")
            step_change = compared.result.step_time
            limit = DEFAULT_MAX_REGRESSION_PCT if max_regression is None else max_regression
            checks.append(regression_check(step_change, limit))

        warnings = list(check_warnings(checked, compared))
        for w in warnings:  # diagnostics: stderr, escaped (they quote host and file names)
            sys.stderr.write(f"warning: {one_line(w)}\n")
        passed = all(c.passed for c in checks)
        code = 0 if passed else 1
        if output_format is CheckFormat.json:
            from tpudiag.render.diff_json import change_to_dict

            sys.stdout.write(json.dumps({
                "result": "pass" if passed else "fail", "exit_code": code, "input": str(path),
                "baseline": None if baseline is None else str(baseline),
                "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks],
                "step_time": change_to_dict(step_change),
                "findings": [finding_to_dict(f) for f in findings],
                "warnings": warnings,
            }, indent=2) + "\n")
        else:
            from tpudiag.cli.console import stdout_console

            console = stdout_console()
            for c in checks:
                console.print(Text.assemble(("pass" if c.passed else "FAIL", "green" if c.passed else "bold red"),
                                            f"  {c.name}: {c.detail}"))
            console.print(Text("check passed" if passed else "check failed", style="bold"))
        if code:
            raise typer.Exit(code)
    except TpudiagError as exc:
        if output_format is CheckFormat.json:  # machines get an answer on stdout too; main() prints stderr
            sys.stdout.write(json.dumps({"result": "error", "exit_code": exc.exit_code, "error": exc.one_line(),
                                         "hint": exc.hint}, indent=2) + "\n")
        raise


def register(app: typer.Typer) -> None:
    app.command("check")(check)
