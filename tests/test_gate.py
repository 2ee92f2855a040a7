"""The CI gate's policy below the CLI (`tpudiag.gate`): the verdict a notebook gets is `check`'s."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tpudiag.errors import UsageError
from tpudiag.gate import DEFAULT_FAIL_ON, Verdict, gate, judge
from tpudiag.model.findings import Severity
from tpudiag.pipeline import compare, diagnose
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "captures" / "train_v6e_4chip"


@pytest.fixture(scope="module")
def example():
    return diagnose(EXAMPLE, jobs=1)


def test_without_a_baseline_the_gate_fails_on_high_findings_only(example):
    verdict = judge(example, None, DEFAULT_FAIL_ON)
    [check] = verdict.checks
    assert check.name == "findings" and verdict.step_time is None and verdict.baseline is None
    highs = [f for f in example.findings if f.severity >= Severity.HIGH]
    assert check.passed is (not highs) and verdict.exit_code == (1 if highs else 0)


def test_a_lower_threshold_fails_and_names_the_first_finding(example):
    verdict = judge(example, None, Severity.LOW)
    assert not verdict.passed and verdict.exit_code == 1
    first = next(f for f in example.findings if f.severity >= Severity.LOW)
    assert f"first: [{first.severity.label()}] {first.rule}: " in verdict.checks[0].detail
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.checks = ()  # type: ignore[misc]


def test_a_run_against_itself_passes_the_regression_check_with_a_zero_budget(example):
    compared = compare(EXAMPLE, EXAMPLE, jobs=1)
    verdict = judge(compared.new, compared, None, max_regression_pct=0.0)
    [check] = verdict.checks
    assert check.name == "step-time-regression" and check.passed and "allowed +0%" in check.detail
    assert verdict.step_time is compared.result.step_time and verdict.baseline == str(EXAMPLE)


def test_gate_applies_the_defaults_and_refuses_a_budget_without_a_baseline():
    verdict = gate(EXAMPLE, jobs=1)
    assert isinstance(verdict, Verdict) and [c.name for c in verdict.checks] == ["findings"]
    assert "at or above high" in verdict.checks[0].detail
    with pytest.raises(UsageError, match="needs a baseline"):
        gate(EXAMPLE, max_regression_pct=5)
    with pytest.raises(UsageError, match="max_regression_pct"):
        gate(EXAMPLE, baseline=EXAMPLE, max_regression_pct=float("nan"))


def test_check_prints_the_gates_verdict(capsys, example):
    """The CLI adds nothing to the decision: its JSON is the verdict's, reason for reason."""
    from tpudiag.cli.app import main

    with pytest.raises(SystemExit) as info:
        main(["check", str(EXAMPLE), "--fail-on", "low", "-f", "json", "--jobs", "1"])
    doc = json.loads(capsys.readouterr().out)
    verdict = judge(example, None, Severity.LOW)
    assert info.value.code == doc["exit_code"] == verdict.exit_code == 1
    assert doc["checks"] == [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in verdict.checks]
    assert len(doc["findings"]) == len(verdict.findings) and doc["warnings"] == list(verdict.warnings)
