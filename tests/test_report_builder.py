"""The report: every warning gathered in one place and one order; findings in the engine's one order.

The capture is one step of one op whose FLOP rate is above the core's peak (2 TFLOP in 1 ms on a
918 TFLOP/s core): the analysis warns about it, and a rule configuration with a skipped file
warns too. The configuration's warning leads; the rate's follows the capture's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tpudiag
from tests.rules import scenarios as sc
from tests.rules.scenarios import run_rules
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.model.findings import rank_key
from tpudiag.parsers.capture import load_capture
from tpudiag.report_builder import build_report
from tpudiag.rules import RulesConfig
from tpudiag.writers.tpu_design import OpDef, Placed

SKIPPED = "config: skipped `elsewhere/pyproject.toml` (not TOML)"


@pytest.fixture(scope="module")
def over_peak_run(tmp_path_factory) -> Path:
    op = OpDef("fusion.9", "convolution fusion", flops=2.0e12, bytes_accessed=1.0e9)  # 2,000 TFLOP/s
    d = sc.design((op,), lambda chip, step: [Placed("fusion.9", 0, 1000 * sc.US)], step_ps=1000 * sc.US)
    return sc.write_run(d, tmp_path_factory.mktemp("peak"))


def test_the_configurations_warning_leads_and_the_rates_follow_the_captures(over_peak_run: Path):
    d = tpudiag.diagnose(over_peak_run, config=RulesConfig(warnings=(SKIPPED,)))
    assert d.warnings == d.report.warnings
    assert d.warnings[0] == SKIPPED
    (rate,) = [i for i, w in enumerate(d.warnings) if "FLOP/s above the core's peak" in w]
    assert rate > 0
    assert len(set(d.warnings)) == len(d.warnings)


def test_analysing_leaves_the_profile_as_parsed(over_peak_run: Path):
    """The rate's warning is the report's, not written into the parsed profile: reporting twice
    shows it once, and the profile's own warnings stay the parser's."""
    profile = load_capture(over_peak_run, jobs=1)
    parsed = list(profile.warnings)
    analysis = analyze(profile)
    first = build_report(analysis).warnings
    assert profile.warnings == parsed
    assert build_report(analysis).warnings == first
    assert [w for w in first if "FLOP/s above the core's peak" in w]


def test_the_report_keeps_the_engines_order(tmp_path: Path):
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    findings, skipped = run_rules(analysis, RulesConfig())
    assert len(findings) > 1 and findings == sorted(findings, key=rank_key)
    assert build_report(analysis, findings, tuple(skipped)).findings == tuple(findings)
