"""Physical limits: a rate above the core's peak is a warning naming the op and a likely cause, never a finding."""

from __future__ import annotations

from pathlib import Path

import tpudiag
from tests.rules import scenarios as sc
from tpudiag.writers.tpu_design import OpDef, Placed

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def test_issue20_decode_copy_done_above_the_hbm_peak_is_a_warning_not_a_finding():
    """llm_decode_v6e: `copy-done` works out at 110.6 % of 1.64 TB/s (its bytes land on the done)."""
    d = tpudiag.diagnose(MODELS / "captures" / "llm_decode_v6e")
    assert not any("110.6" in f.message or "1.81 TB/s" in f.message for f in d.findings)
    # still on the HBM roof (the decode waits on its weight copies), but with no rate and no saving
    (f,) = [f for f in d.findings if f.rule == "memory-bound"]
    assert f.ops == ("copy-done",) and "no rate is stated" in f.message and f.saving.ps == 0
    assert dict(f.evidence[0].values)["bandwidth"] == "above the peak as timed (see the warnings)"
    (w,) = [w for w in d.warnings if w.startswith("HBM bandwidth above the core's peak")]
    assert "`copy-done` 1.81 TB/s (110.6%)" in w and "likely async ops" in w


def test_a_flop_rate_above_peak_blames_the_peak_and_gets_no_finding(tmp_path):
    # 2 TFLOP in 1 ms is 2,000 TFLOP/s on a 918 TFLOP/s core: not a physical rate.
    op = OpDef("fusion.9", "convolution fusion", flops=2.0e12, bytes_accessed=1.0e9)
    d = sc.design((op,), lambda chip, step: [Placed("fusion.9", 0, 1000 * sc.US)], step_ps=1000 * sc.US)
    diagnosis = tpudiag.diagnose(sc.write_run(d, tmp_path))
    (w,) = [w for w in diagnosis.warnings if "FLOP/s above" in w]
    assert "`fusion.9` 2000.0 TFLOP/s (217.9%)" in w and "another generation's" in w
    assert not [f for f in diagnosis.findings if f.rule == "low-mxu-utilization"]


def test_rates_at_or_below_peak_say_nothing(tmp_path):
    d = sc.healthy()
    diagnosis = tpudiag.diagnose(sc.write_run(d, tmp_path))
    assert not [w for w in diagnosis.warnings if "above the core's peak" in w]
