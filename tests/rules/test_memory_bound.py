"""memory-bound (TPD106): ops on the HBM roof with their byte levers; the near miss and healthy stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.model.units import fmt_bandwidth, fmt_bytes
from tpudiag.rules import RulesConfig
from tpudiag.rules.memory_bound import Options


def _run(analysis, *rules, **options):
    rules = rules or ("memory-bound",)
    findings, _ = run_rules(analysis, RulesConfig(select=rules, options={"memory-bound": options}))
    return findings


def test_decode_weight_matmuls_are_on_the_hbm_roof(tmp_path: Path, snapshot):
    a = sc.analyse(sc.decode_v6e(), tmp_path)
    (f,) = _run(a)
    # Designed: 7 x 135.3 MB per execution at 85 % of 1,640 GB/s, OI 31.7 FLOP/B against a 560 ridge.
    assert f"{fmt_bytes(7 * sc.DECODE_BYTES)} per step" in f.message
    assert f"at {fmt_bandwidth(0.85 * sc.HBM)} (85.0% of {fmt_bandwidth(sc.HBM)})" in f.message
    assert "operational intensity 32 FLOP/B vs ridge 560" in f.message
    assert set(f.ops) == {op.name for op in sc.DECODE_OPS}
    # int8 weights: the bf16[8192,8192] weights (134.2 of 135.3 MB) shrink by half.
    weight = 8192 * 8192 * 2
    expected = 7 * sc.DECODE_MM_PS * (weight / 2) / sc.DECODE_BYTES
    assert f.saving.ps == pytest.approx(expected, rel=0.01) and f.saving.basis == "modelled"
    assert f.severity == Severity.HIGH and "int8/fp8" in f.fix
    assert "64 rows instead of 32" in dict(f.evidence[0].values)["larger batch"]
    snapshot("memory-bound", render_findings([f]))


def test_low_mxu_refers_the_hbm_bound_matmuls_instead_of_dropping_them(tmp_path: Path):
    findings = _run(sc.analyse(sc.decode_v6e(), tmp_path), "low-mxu-utilization")
    (f,) = findings
    assert f.severity == Severity.INFO and f.saving.ps == 0
    assert "4.8% of peak FLOP/s" in f.message and "see `memory-bound`" in f.message
    assert len(f.ops) == 7


def test_unfused_elementwise_gets_the_fusion_lever(tmp_path: Path):
    (f,) = _run(sc.analyse(sc.elementwise_bound(), tmp_path))
    assert f.ops == ("fusion.50",) and "fuse" in f.fix
    # Its output (one third of its bytes) would stay out of HBM.
    assert f.saving.ps == pytest.approx(sc.ELEMENTWISE_PS / 3, rel=0.01)


def test_near_miss_below_the_roof_and_healthy(tmp_path: Path):
    near = sc.analyse(sc.decode_near_roof(0.65), tmp_path / "near")  # 65 % < the 70 % roof
    assert _run(near) == []
    assert len(_run(near, near_roof=0.6)) == 1
    findings, _ = run_rules(sc.analyse(sc.healthy(), tmp_path / "healthy"))
    assert [f for f in findings if f.severity >= Severity.LOW] == []


def test_options_validate():
    with pytest.raises(ValueError, match="near_roof"):
        Options(near_roof=0)
