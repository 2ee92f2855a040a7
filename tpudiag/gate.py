"""The CI gate's policy (`tpudiag check`): which findings and which step-time change fail a build.

`gate()` diagnoses an input (and compares it with a baseline when one is given) and returns a
frozen `Verdict`: every check with its one-line reason, the step-time change, the findings and the
warnings that make the gate weak. The CLI only parses its arguments and prints the verdict, so a
notebook or another front end gets the same decision from the same inputs.

Policy:
- with neither `fail_on` nor `baseline`, a finding at or above `high` fails;
- against a baseline, the median step time may rise at most `max_regression_pct` percent (default
  5, Marin's `track` gate) *and* the rise must be beyond the noise band (`tpudiag.analysis.diff`):
  jitter inside the band never fails, whatever the budget;
- the verdict passes when every check passes; `exit_code` is 0 or 1 (usage and input errors are
  raised, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import InputError, UsageError
from tpudiag.model.findings import Finding, Severity
from tpudiag.model.profile import Platform
from tpudiag.model.units import fmt_time

if TYPE_CHECKING:
    from tpudiag.analysis.diff import Change
    from tpudiag.pipeline import Diagnosis, Diff

DEFAULT_FAIL_ON = Severity.HIGH
DEFAULT_MAX_REGRESSION_PCT = 5.0


@dataclass(frozen=True)
class Check:
    name: str  # "findings" or "step-time-regression"
    passed: bool
    detail: str  # one line, numbers inline


@dataclass(frozen=True)
class Verdict:
    """The gate's decision on one input and the reasons for it."""

    input_path: str
    baseline: str | None
    checks: tuple[Check, ...]
    step_time: Change | None  # the median step time's change against the baseline, when there is one
    findings: tuple[Finding, ...]  # the checked input's findings, in report order
    warnings: tuple[str, ...]  # what makes the verdict weaker than it looks (`check_warnings`)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def rules_text(ran: tuple[str, ...], skipped) -> str:
    """`rules run: a, b; not run: c, d (why)` for a check's detail: what the findings check covers."""
    from tpudiag.model.report import skips_by_reason

    text = f"rules run: {', '.join(ran) or 'none'}"
    if skipped:
        text += "; not run: " + "; ".join(f"{', '.join(rules)} ({reason})" for reason, rules in skips_by_reason(skipped))
    return text


def findings_check(findings: tuple[Finding, ...], threshold: Severity, ran: tuple[str, ...] | None = None,
                   skipped=()) -> Check:
    """The findings check; `ran` and `skipped` (when given) name the rules it covers in its detail."""
    bad = [f for f in findings if f.severity >= threshold]
    label = threshold.label()
    covered = f"; {rules_text(ran, skipped)}" if ran is not None else ""
    if not bad:
        return Check("findings", True, f"no finding at or above {label} ({len(findings)} findings in all{covered})")
    worst = bad[0]
    return Check("findings", False, f"{len(bad)} finding{'s' * (len(bad) != 1)} at or above {label}; "
                                    f"first: [{worst.severity.label()}] {worst.rule}: {worst.message}"
                                    + (f" ({rules_text(ran, skipped)})" if ran is not None else ""))


def regression_check(change: Change, max_regression_pct: float) -> Check:
    from tpudiag.render.diff_format import fmt_ci

    rel = change.relative or 0.0
    detail = (f"median step time {fmt_time(change.base.centre_ps)} -> {fmt_time(change.new.centre_ps)} "
              f"({100 * rel:+.1f}%; allowed +{max_regression_pct:g}%; noise band ±{fmt_time(change.noise_band_ps)}; "
              f"95% interval {fmt_ci(change)})")
    failed = change.significant and change.delta_ps > 0 and rel * 100 > max_regression_pct
    return Check("step-time-regression", not failed, detail)


def check_warnings(checked: Diagnosis, diff: Diff | None = None) -> tuple[str, ...]:
    """What `check` warns about: what `report` shows for the input (its warnings and the host files
    not analysed) or, against a baseline, what `diff` shows (both inputs' warnings, different chips
    or core counts, too few steps), plus what makes the gate weak: a host-only capture has no
    device ops or steps, so its findings check passes vacuously.
    """
    out = []
    if checked.report.summary.platform is Platform.CPU and checked.analysis is not None \
            and not checked.analysis.n_events:
        out.append("host-only capture (no TPU or GPU device plane): no device ops or steps, so nothing "
                   "to gate on; the findings check passes vacuously")
    elif not checked.rules_run and checked.skipped:
        out.append("no rule could run on this input, so the findings check passes vacuously: "
                   + rules_text((), checked.skipped).split("; ", 1)[1])
    elif checked.skipped:
        out.append(f"{len(checked.skipped)} rules could not run, so the findings check does not cover them: "
                   + ", ".join(s.rule for s in checked.skipped))
    if diff is None:
        out += [f"not analysed: {f}" for f in checked.report.failures]
        out += checked.warnings
    else:
        for label, d in (("base", diff.base), ("new", diff.new)):
            out += [f"{label}: not analysed: {f}" for f in d.report.failures]
        out += diff.result.warnings
    return tuple(dict.fromkeys(out))


def judge(checked: Diagnosis, compared: Diff | None, fail_on: Severity | None,
          max_regression_pct: float = DEFAULT_MAX_REGRESSION_PCT) -> Verdict:
    """The verdict on a diagnosis already made (`compared.new` is `checked` when there is a baseline)."""
    checks = []
    if fail_on is not None:
        checks.append(findings_check(checked.findings, fail_on, checked.rules_run, checked.skipped))
    step_change = None
    if compared is not None:
        step_change = compared.result.step_time
        if step_change is None:
            raise InputError("cannot compare step times: a capture has no steps", path=checked.input_path,
                             hint="both captures need a Steps line or XLA Modules executions")
        checks.append(regression_check(step_change, max_regression_pct))
    return Verdict(input_path=checked.input_path,
                   baseline=compared.base.input_path if compared is not None else None,
                   checks=tuple(checks), step_time=step_change, findings=tuple(checked.findings),
                   warnings=check_warnings(checked, compared))


def _severity(value: object) -> Severity | None:
    """`fail_on=`: None, a Severity, or its name (`"high"`)."""
    if value is None or isinstance(value, Severity):
        return value
    if isinstance(value, str):
        try:
            return Severity.parse(value)
        except ValueError as exc:
            raise UsageError(f"fail_on: {exc}") from None
    raise UsageError(f"fail_on must be a Severity or its name (info, low, medium, high), got {value!r:.40}")


def gate(path: Path | str, *, baseline: Path | str | None = None, fail_on: Severity | None = None,
         max_regression_pct: float | None = None, config=None, chip: str | None = None, jobs: int | None = None,
         scheduler=None) -> Verdict:
    """Diagnose `path` (against `baseline` when given) and decide: the policy in the module docstring."""
    from tpudiag import arguments
    from tpudiag.pipeline import check_diagnose_arguments, compare, diagnose

    # Every argument checked before anything is read (a UsageError naming it)
    arguments.check_path(path)
    arguments.check_path(baseline, "baseline")
    fail_on = _severity(fail_on)
    max_regression_pct = arguments.check_number(max_regression_pct, "max_regression_pct")
    check_diagnose_arguments(dict(config=config, chip=chip, jobs=jobs, scheduler=scheduler), "tpudiag.gate.gate")
    if max_regression_pct is not None and baseline is None:
        raise UsageError("max_regression_pct needs a baseline", hint="pass the baseline capture")
    if fail_on is None and baseline is None:
        fail_on = DEFAULT_FAIL_ON
    limit = DEFAULT_MAX_REGRESSION_PCT if max_regression_pct is None else max_regression_pct
    if baseline is None:
        return judge(diagnose(path, config=config, jobs=jobs, chip=chip, scheduler=scheduler), None, fail_on, limit)
    compared = compare(baseline, path, config=config, jobs=jobs, chip=chip, scheduler=scheduler)
    return judge(compared.new, compared, fail_on, limit)
