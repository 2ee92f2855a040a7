"""low-mxu-utilization (TPD102): slow matmuls with their reasons; healthy and near-miss ops stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tpudiag.rules import RulesConfig, run_rules
from tpudiag.rules.low_mxu_utilization import Options, Shape, diagnose, is_matmul, parse_shapes


def _run(analysis, **options):
    findings, _ = run_rules(analysis, RulesConfig(select=("low-mxu-utilization",),
                                                  options={"low-mxu-utilization": options}))
    return findings


@pytest.fixture
def analysis(tmp_path: Path):
    return sc.analyse(sc.low_mxu(), tmp_path)


def test_slow_matmuls_are_flagged_with_reasons(analysis, snapshot):
    findings = _run(analysis)
    by_op = {f.ops[0]: f for f in findings}
    # fusion.13 (60 %), fusion.14 (51 %: near miss), fusion.15 (0.2 % of time: near miss) and the
    # loop fusion fusion.16 (not a matmul) are not reported.
    assert set(by_op) == {"fusion.10", "fusion.11", "fusion.12"}
    assert "dims not multiples of 256: 1000, 5000" in by_op["fusion.10"].message
    assert "1000→1024" in by_op["fusion.10"].fix and "5000→5120" in by_op["fusion.10"].fix
    assert "memory-bound" not in by_op["fusion.10"].message  # OI 833 > ridge 560
    assert "memory-bound (operational intensity 8 FLOP/B < ridge 560)" in by_op["fusion.11"].message
    assert "small batch (M = 8 rows < MXU 256)" in by_op["fusion.11"].message
    assert "f32 operands" in by_op["fusion.12"].message and "bf16" in by_op["fusion.12"].fix
    assert all(f.saving.basis == "modelled" for f in findings)
    snapshot("low-mxu-utilization", render_findings(findings))


def test_saving_is_self_time_times_missing_utilization(analysis):
    f = {f.ops[0]: f for f in _run(analysis)}["fusion.12"]
    # Compute-bound (OI 1,229 > 560): self time x (1 - 0.15 / 0.7), once per step on each core.
    assert f.saving.ps == pytest.approx(sc.F32_MM_PS * (1 - 0.15 / 0.7), rel=1e-3)
    small = {f.ops[0]: f for f in _run(analysis)}["fusion.11"]
    # Memory-bound: the attainable target is 0.7 x OI / ridge = 0.7 x 8.0 / 559.8.
    oi = sc.SMALL_BATCH.flops / sc.SMALL_BATCH.bytes_accessed
    target = 0.7 * oi / (sc.PEAK / sc.HBM)
    assert small.saving.ps == pytest.approx(sc.SMALL_BATCH_PS * (1 - 0.002 / target), rel=1e-3)


def test_near_misses_turn_into_findings_when_thresholds_move(analysis):
    ops = {f.ops[0] for f in _run(analysis, low_utilization=0.55, min_time_share=0.001)}
    assert {"fusion.14", "fusion.15"} <= ops
    assert "fusion.13" not in ops  # 60 % stays above 55 %


def test_v5e_uses_a_128_mxu(tmp_path: Path):
    # The same op durations against v5e's lower peaks: only the memory-bound small batch stays slow.
    d = sc.with_device(sc.low_mxu(), "TPU v5 lite", 197.0, 819.0)
    findings = _run(sc.analyse(d, tmp_path))
    assert [f.ops[0] for f in findings] == ["fusion.11"]
    assert "small batch (M = 8 rows < MXU 128)" in findings[0].message


def test_alignment_depends_on_the_mxu_size():
    ops = [Shape("bf16", (2048, 640)), Shape("bf16", (640, 1024))]
    out = [Shape("bf16", (2048, 1024))]
    # 640 = 5 x 128: aligned on a 128 MXU (v4, v5e, v5p), not on a 256 MXU (v6e, TPU7x).
    assert diagnose(out, ops, 128, 900.0, 560.0) == ([], [])
    reasons, fixes = diagnose(out, ops, 256, 900.0, 560.0)
    assert reasons == ["dims not multiples of 256: 640"] and fixes == ["pad dims to multiples of 256 (640→768)"]


def test_shape_parsing_and_diagnosis():
    assert parse_shapes("%f = bf16[8,4096]{1,0:T(8,128)(2,1)} fusion(f32[8,1000]{1,0} %a, s8[] %b)") == [
        Shape("bf16", (8, 4096)), Shape("f32", (8, 1000)), Shape("s8", ())]
    assert is_matmul("fusion.3", "convolution fusion") and is_matmul("dot.1", "") and is_matmul("x", "dot")
    assert not is_matmul("fusion.3", "loop fusion") and not is_matmul("dotted_add", "loop fusion")
    reasons, _ = diagnose([Shape("bf16", (1024, 1024))], [Shape("bf16", (1024, 1024))] * 2, 256, 600.0, 560.0)
    assert reasons == []


def test_options_validate():
    with pytest.raises(ValueError, match="target_utilization must be in"):
        Options(target_utilization=0.0)


def test_llo_dumps_add_the_static_mxu_busy_fraction(analysis):
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.model.inputs import CompiledInputs

    # The LLO parser's per-op table: fusion.10's compiled code keeps the MXUs busy 22 % of bundles.
    llo = SimpleNamespace(ops=pd.DataFrame({"name": ["fusion.10", "fusion.12"], "mxu_busy_fraction": [0.22, 0.81]}))
    findings, _ = run_rules(analysis, RulesConfig(select=("low-mxu-utilization",)), CompiledInputs(llo=(llo,)))
    by_op = {f.ops[0]: f for f in findings}
    assert "MXUs busy in only 22.0% of its bundles (static LLO)" in by_op["fusion.10"].message
    assert "static LLO" not in by_op["fusion.12"].message  # 81 %: the compiled code is not the problem
    assert dict(by_op["fusion.12"].evidence[0].values)["static MXU busy"] == "81.0%"


def test_skipped_without_flops(tmp_path: Path):
    # The collective scenario records no FLOPs on any op: nothing to compare with the peak.
    findings, skipped = run_rules(sc.analyse(sc.exposed_collectives(), tmp_path),
                                  RulesConfig(select=("low-mxu-utilization",)))
    assert findings == []
    assert [(s.rule, s.reason) for s in skipped] == [
        ("low-mxu-utilization", "needs per-op FLOPs and a peak FLOP/s in the trace")]


@pytest.mark.parametrize(("declared", "source"), [(True, "its declared cost_estimate"),
                                                   (False, "its operand and result shapes")])
def test_pallas_f32_matmul_is_judged(tmp_path: Path, declared, source):
    # The second capture: a Pallas matmul (custom-call, no FLOPs in the trace) on f32 operands,
    # 100 % of each step at 12 % of the bf16 peak.
    findings = _run(sc.analyse(sc.pallas_f32(cost_estimate=declared), tmp_path))
    (f,) = findings
    assert f.ops == ("custom-call.1",) and f.severity.name == "HIGH"
    assert "runs at 12.0% of peak FLOP/s for 100.0% of device time" in f.message
    assert "f32 operands" in f.message and f"FLOPs from {source}" in f.message
    assert "preferred_element_type=jnp.float32" in f.fix
    assert f.saving.ps == pytest.approx(sc.PALLAS_PS * (1 - 0.12 / 0.7), rel=1e-3)


def test_a_fast_bf16_pallas_matmul_is_a_near_miss(tmp_path: Path):
    op = sc.pallas_matmul_op("bf16")
    dur = round(sc.PALLAS_FLOPS / (0.55 * sc.PEAK) * 1e12)  # 55 %: above the 50 % bar
    d = sc.design((op,), lambda chip, step: [sc.Placed(op.name, 0, dur)], step_ps=dur)
    assert _run(sc.analyse(d, tmp_path)) == []
