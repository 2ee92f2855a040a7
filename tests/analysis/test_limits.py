"""Physical limits: a rate above the core's peak is a warning naming the op and a likely cause, never a finding."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import tpudiag
from tests.rules import scenarios as sc
from tpudiag.analysis.limits import over_peak
from tpudiag.model.profile import DeviceInfo
from tpudiag.writers.tpu_design import OpDef, Placed

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def test_a_measured_copy_done_above_the_hbm_peak_is_a_warning_naming_async_not_a_finding_rate(tmp_path):
    """A measured trace counts a 16 MiB prefetch copy's bytes on its done, which waits 10 µs for the
    DMA: 1.68 TB/s, 102% of 1.64 TB/s. Still on the HBM roof, but with no rate and no saving."""
    copy_bytes = 16 * 2 ** 20
    ops = (OpDef("copy-start", "copy-start"), OpDef("fusion.1", "loop fusion", bytes_accessed=1e6),
           OpDef("copy-done", "copy-done", bytes_accessed=copy_bytes))
    d = sc.design(ops, lambda chip, step: [Placed("copy-start", 0, 1 * sc.US), Placed("fusion.1", 1 * sc.US, 1 * sc.US),
                                           Placed("copy-done", 2 * sc.US, 10 * sc.US)], step_ps=12 * sc.US)
    diagnosis = tpudiag.diagnose(sc.write_run(d, tmp_path))
    (f,) = [f for f in diagnosis.findings if f.rule == "memory-bound"]
    assert f.ops == ("copy-done",) and "no rate is stated" in f.message and f.saving.ps == 0
    assert dict(f.evidence[0].values)["bandwidth"] == "above the peak as timed (see the warnings)"
    (w,) = [w for w in diagnosis.warnings if w.startswith("HBM bandwidth above the core's peak")]
    assert "`copy-done`" in w and "likely async ops" in w
    assert "TB/s" not in w.split("which none reaches:")[1]  # an async op's rate as timed is not shown


@pytest.mark.parametrize("name", sorted(p.name for p in (MODELS / "captures").iterdir()))
def test_no_modelled_op_runs_above_the_peak(name):
    """Our own modelled captures, and static mode on the dumps they came from: no op's FLOP/s or HBM
    bandwidth above the core's peak (transformer_train_v5e's fusion.57 ran at 292% of peak on a 4x
    FLOP count, and the decode's copy-dones at up to 1000x the HBM peak on bytes put on a 10 ns done)."""
    for path in (MODELS / "captures" / name, MODELS / "dumps" / name):
        d = tpudiag.diagnose(path)
        assert d.analysis.profile.modelled
        device = d.analysis.profile.hosts[0].device
        assert d.analysis.over_peak == ()
        assert not [w for w in d.warnings if "above the core's peak" in w]
        ops = d.analysis.ops.groupby(d.analysis.ops["name"].astype(str))[["flops", "hbm_bytes", "total_time_ps"]].sum()
        seconds = ops["total_time_ps"] / 1e12
        assert (ops["flops"] / seconds <= device.peak_flops_per_s * 1.001).all(), path
        assert (ops["hbm_bytes"] / seconds <= device.hbm_bytes_per_s * 1.001).all(), path  # collectives too


def test_a_rate_above_peak_in_a_modelled_capture_is_called_a_tpudiag_bug():
    """None of a measured trace's causes apply to our own model: the warning says so, for async ops too."""
    device = DeviceInfo(platform="TPU", device_type="TPU v5 Lite", chip=None, peak_flops_per_s=197e12,
                        hbm_bytes_per_s=819e9, peaks_source="trace", n_cores=1, n_chips=1)
    # 2 GFLOP and 1 GB in 1 µs: 2,000 TFLOP/s and 1 PB/s, rates the ops table nulled (NaN)
    ops = pd.DataFrame({"host": ["h", "h"], "name": ["fusion.57", "copy-done"], "family": ["", ""],
                        "flops": [2e9, 0.0], "hbm_bytes": [0.0, 1e9], "total_time_ps": [1_000_000, 1_000_000],
                        "flop_rate": [float("nan"), 0.0], "hbm_bw": [0.0, float("nan")]})
    modelled = over_peak(ops, {"h": device}, modelled=True)
    assert {o.op for o in modelled} == {"fusion.57", "copy-done"}
    assert all("tpudiag modelling error" in o.cause for o in modelled)
    measured = {o.op: o.cause for o in over_peak(ops, {"h": device})}
    assert {o.op: o.rate for o in modelled} == {"fusion.57": 2e15, "copy-done": 1e15}
    assert "async" in measured["copy-done"] and "int8 or fp8" in measured["fusion.57"]


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


RATES = ("flop_rate", "hbm_bw", "ici_bw")
UTILIZATIONS = ("flop_utilization", "hbm_utilization", "ici_utilization")


def _shown_rates_within_peak(doc: dict) -> None:
    """No value of a report's JSON is a rate above its peak, and no op is bound by `Unknown`."""
    s = doc["summary"]
    peaks = {"flop_rate": s["peak_flops_per_s"], "hbm_bw": s["hbm_bytes_per_s"]}
    for op in doc["ops"]:
        for key in UTILIZATIONS:
            assert op[key] is None or op[key] <= 1.001, (op["name"], key, op[key])
        for key, peak in peaks.items():
            assert op[key] is None or peak is None or op[key] <= peak * 1.001, (op["name"], key, op[key])
        assert op["bound_by"] != "Unknown", op["name"]
        if op["family"]:
            assert op["bound_by"] == "collective", op["name"]


def _examples() -> list[Path]:
    root = MODELS.parent
    return [*sorted((root / "captures").iterdir()), *sorted((MODELS / "captures").iterdir())]


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_no_bundled_example_shows_a_rate_above_peak(path):
    from tpudiag.render.json_format import report_to_dict
    _shown_rates_within_peak(report_to_dict(tpudiag.diagnose(path).report))


def test_train_v6e_4chip_async_gathers_show_no_hbm_rate_and_say_why_once():
    """The designed capture puts each all-gather's bytes on its start and done (xprof: 511 % of the
    HBM peak on `all-gather-done.1`, 170 % and 128 % on the starts); tpudiag shows n/a, warns once
    naming all three, and gives the gathers their ICI traffic over the async window instead."""
    from tpudiag.render.json_format import report_to_dict
    doc = report_to_dict(tpudiag.diagnose(MODELS.parent / "captures" / "train_v6e_4chip").report)
    ops = {o["name"]: o for o in doc["ops"]}
    for name in ("all-gather-done.1", "all-gather-start.1", "all-gather-start.2.0"):
        assert ops[name]["hbm_bw"] is None and ops[name]["hbm_utilization"] is None
        assert ops[name]["bound_by"] == "collective"
    (w,) = [w for w in doc["warnings"] if w.startswith("HBM bandwidth above")]
    assert "`all-gather-done.1`" in w and "shown as n/a" in w and "511.5%" not in w
    # bf16[4096,12288] gathered over the 4 chips (no replica_groups in the text: assumed): each
    # device receives 3/4 of 96 MiB per occurrence, over its ~1.5 ms window.
    gather = ops["all-gather-start.1"]
    assert gather["group_size"] == 4 and gather["group_source"] == "assumed"
    assert gather["ici_bytes"] == pytest.approx(0.75 * 4096 * 12288 * 2 * gather["occurrences"])
    assert 0 < gather["ici_utilization"] < 1


REAL_OFFLOAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-captures" / \
    "tpu-v6e-hostoffload-inference" / "trace"


def test_real_host_offload_capture_shows_no_rate_above_peak():
    """The real v6e capture's `copy-start` rows put 5 GiB host copies on µs-long starts: xprof shows
    54,626,898 % to 180,833,870 % of the HBM peak. No value of tpudiag's JSON is above a peak."""
    if not REAL_OFFLOAD.exists():
        pytest.skip(f"the real host-offload capture is in ../shared, absent here ({REAL_OFFLOAD})")
    from tpudiag.render.json_format import report_to_dict
    doc = report_to_dict(tpudiag.diagnose(REAL_OFFLOAD).report)
    _shown_rates_within_peak(doc)
    (w,) = [w for w in doc["warnings"] if "`copy-start" in w]
    assert "shown as n/a" in w and "%" not in w.split("which none reaches:")[1]  # no 54,626,898 %


def test_the_rates_above_peak_are_decided_once_per_diagnosis(tmp_path, monkeypatch):
    """The ops table nulls a rate above the peak; the analysis reads those marks once
    (`Analysis.over_peak`), and the warning and the rules read that: one call per diagnosis."""
    from tpudiag.analysis import profile_analysis

    calls = []
    monkeypatch.setattr(profile_analysis, "over_peak", lambda *a, **k: calls.append(a) or over_peak(*a, **k))
    op = OpDef("fusion.9", "convolution fusion", flops=2.0e12, bytes_accessed=1.0e9)
    d = sc.design((op,), lambda chip, step: [Placed("fusion.9", 0, 1000 * sc.US)], step_ps=1000 * sc.US)
    diagnosis = tpudiag.diagnose(sc.write_run(d, tmp_path))
    assert len(calls) == 1
    assert diagnosis.analysis.over_peak_names == {"fusion.9"}
    assert diagnosis.analysis.ops["flop_rate"].isna().all()  # the ops table's mark the analysis read
    assert [w for w in diagnosis.warnings if "`fusion.9` 2000.0 TFLOP/s" in w]


def _device(source, device_type):
    from tpudiag.model.profile import DeviceInfo, PeaksSource, Platform
    return DeviceInfo(Platform.TPU, device_type, None, 918e12, 1.64e12, PeaksSource(source), 1, 1)


def test_each_cause_of_a_rate_above_peak_as_written():
    # The warning's wording per case, written out (a mutated word or branch shows here).
    from tpudiag.analysis.limits import ASYNC_CAUSE, MODEL_CAUSE, _cause
    trace, table = _device("trace", "TPU v6 Lite"), _device("hardware table", "")
    assert _cause("all-gather.1", "ICI bandwidth", trace, False) == (
        "likely the payload or replica group modelled for it is not what moved (without `replica_groups` in the "
        "HLO text every chip of the host is assumed), or the trace's time is not the transfer's")
    assert _cause("fusion.1", "FLOP/s", trace, True) == MODEL_CAUSE
    assert _cause("copy-done.2", "HBM bandwidth", trace, False) == ASYNC_CAUSE       # by its async role
    assert _cause("my-start.2", "HBM bandwidth", trace, False) == ASYNC_CAUSE         # by the name's suffix
    assert _cause("fusion.1", "FLOP/s", trace, False) == (
        "likely it runs in int8 or fp8, whose peak can be above the bf16 peak used here, its FLOP count holds work "
        "the core did not do (padding), or the trace's peak for TPU v6 Lite is not this core's (another "
        "generation's, or per chip where the op runs on one core)")
    assert _cause("fusion.1", "HBM bandwidth", table, False) == (
        "likely its bytes are not all HBM traffic (on-chip memory counted as HBM), or the hardware table's peak "
        "is not this core's (another generation's, or per chip where the op runs on one core)")


def test_an_op_above_peak_is_shown_with_its_rate_and_share():
    from tpudiag.analysis.limits import OverPeak
    assert OverPeak("fusion.1", "FLOP/s", 1.5e15, 918e12, "").shown() == "`fusion.1` 1500.0 TFLOP/s (163.4%)"
    assert OverPeak("copy.1", "HBM bandwidth", 2.46e12, 1.64e12, "").shown() == "`copy.1` 2.46 TB/s (150.0%)"


def test_above_peak_means_beyond_a_tenth_of_a_percent():
    from tpudiag.analysis.limits import above_peak
    # 1,000 GB/s peak: up to 0.1 % over is rounding (the edge itself included), 1,001.5 GB/s is
    # above; NaN is not a rate.
    edge = 1.0e12 * (1 + 1e-3)
    assert above_peak([1.0e12, edge, 1.0015e12, float("nan")], 1.0e12).tolist() == [False, False, True, False]
    assert above_peak([5e12], None).tolist() == [False]
