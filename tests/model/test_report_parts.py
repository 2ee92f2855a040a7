"""The report model's own small facts (`model.report`) on literal cases: the duty cycle and the 0.5 %
step-time difference, a host transfer's one line in each of its forms, the devices' wording, the
ridge point (peak FLOP/s over HBM bytes/s), rule skips by reason, and which op rows are shown."""

from __future__ import annotations

import dataclasses

from tpudiag.model.profile import PeaksSource, Platform
from tpudiag.model.report import (Breakdown, Distribution, HostTransferRate, OpRow, OpsShown, RuleSkip, Summary,
                                  skips_by_reason)


def test_duty_cycle_and_a_step_that_differs():
    b = Breakdown(step_ps=1000.0, compute_ps=600.0, collective_ps=100.0, io_ps=50.0, idle_ps=250.0)
    assert b.duty_cycle == 0.75
    assert Breakdown(0.0, 0.0, 0.0, 0.0, 0.0).duty_cycle == 0.0

    def dist(mean: float) -> Distribution:
        return Distribution(count=3, mean_ps=mean, p50_ps=mean, p90_ps=mean, min_ps=0, max_ps=0)
    assert not b.step_differs(dist(1000.0)) and not b.step_differs(None)
    assert not b.step_differs(dist(1005.0))  # 5 of 1,005: under 0.5 %
    assert b.step_differs(dist(1006.0))  # 6 of 1,006: over
    assert not b.step_differs(dist(996.0)) and b.step_differs(dist(995.0))  # 0.5 % of the step time: 4.98, 4.975
    # 995 against a mean of 1,000 differs by exactly 0.5 %: not more
    assert not dataclasses.replace(b, step_ps=995.0).step_differs(dist(1000.0))


def _rate(**kw) -> HostTransferRate:
    base = dict(direction="host to HBM", ops=("copy-done.1",), transfers_per_step=3.0, bytes_per_step=16e9,
                wait_ps=575.8e9, achieved_bytes_per_s=27.2e9, link_bytes_per_s=32e9, dtypes=("f32",))
    return HostTransferRate(**(base | kw))


def test_a_host_transfer_in_one_line():
    assert _rate().link_share == 0.85
    assert _rate().line() == ("host to HBM: 16 GB per step (3 copies, f32), waited 575.80 ms, at 27.2 GB/s per core "
                              "(measured); 85.0% of the host link's nominal 32 GB/s")
    one = _rate(transfers_per_step=1.0004, dtypes=("bf16", "f32"), achieved_bytes_per_s=None, above_link=True)
    assert one.link_share is None
    assert one.line() == ("host to HBM: 16 GB per step (1 copy, bf16/f32), waited 575.80 ms, rate n/a (the copies' "
                          "windows imply more than the nominal link: they do not hold the whole transfer); the host "
                          "link's nominal 32 GB/s")
    unknown = _rate(direction="HBM to host", dtypes=(), link_bytes_per_s=None, achieved_bytes_per_s=None,
                    transfers_per_step=0.5, bytes_per_step=1.5e9, wait_ps=2e6)
    assert unknown.link_share is None
    assert unknown.line() == ("HBM to host: 1.5 GB per step (0.5 copies), waited 2.0 µs; the host link's bandwidth "
                              "for this chip is unknown")
    # 0.6 or 1.4 copies a step are copies, not "1 copy"; 1.375 GB to three digits, the tie to even, is 1.38
    assert _rate(transfers_per_step=0.6, dtypes=()).line().startswith("host to HBM: 16 GB per step (0.6 copies),")
    assert _rate(transfers_per_step=1.4, bytes_per_step=1.375e9).line().startswith(
        "host to HBM: 1.38 GB per step (1.4 copies, f32),")


def _summary(**kw) -> Summary:
    base = dict(input_path="p", run="r", platform=Platform.TPU, device_type="TPU v6 Lite", generation="v6e",
                hosts=("h",), n_chips=4, n_cores=4, peak_flops_per_s=918e12, hbm_bytes_per_s=1.64e12,
                peaks_source=PeaksSource.TRACE, step_source="Steps line", step_time=None, host_spread_ps=0.0,
                slowest_host="h", breakdown=None, modelled=False)
    return Summary(**(base | kw))


def test_devices_in_words():
    assert _summary().devices_text() == "4 chips" and _summary().devices_text(cores=True) == "4 chips · 4 cores"
    assert _summary(n_chips=1, n_cores=1).devices_text(cores=True) == "1 chip · 1 core"
    assert _summary(n_chips=1, n_cores=2).devices_text(cores=True) == "1 chip · 2 cores"
    gpu = _summary(platform=Platform.GPU, n_cores=8, n_cores_with_ops=1)
    assert gpu.devices_text() == "8 GPUs (1 ran kernels)" and gpu.chip_word == "GPU"
    assert _summary(platform=Platform.GPU, n_cores=8, n_cores_with_ops=8).devices_text() == "8 GPUs"
    assert _summary(platform=Platform.GPU, n_cores=1).devices_text() == "1 GPU"
    assert _summary(platform=Platform.CPU).devices_text(cores=True) == "one device (XLA's CPU threads)"
    assert _summary().chip_word == "chip" and _summary(platform=Platform.CPU).chip_word == "chip"


def test_the_ridge_point():
    assert _summary().ridge_flops_per_byte == 918e12 / 1.64e12  # ~560 FLOP/B
    assert _summary(peak_flops_per_s=None).ridge_flops_per_byte is None
    assert _summary(hbm_bytes_per_s=0.0).ridge_flops_per_byte is None


def test_skips_grouped_by_reason_in_first_seen_order():
    skips = [RuleSkip("a", "no steps"), RuleSkip("b", "no peak"), RuleSkip("c", "no steps")]
    assert skips_by_reason(skips) == [("no steps", ("a", "c")), ("no peak", ("b",))]
    assert skips_by_reason([]) == []


def _row(name: str, family: str = "", step: float | None = None, outside: bool = False, **kw) -> OpRow:
    values = {f.name: 0 for f in dataclasses.fields(OpRow) if f.default is dataclasses.MISSING}
    return OpRow(**{**values, "host": "h", "name": name, "category": "", "program": "", "bound_by": "HBM",
                    "family": family, "shape_with_layout": "", "source": "", "tf_op": "", "self_time_ps": 2_000_000,
                    "step_self_time_ps": step, "outside_steps": outside, **kw})


def test_a_rows_time_cell_and_bound():
    assert _row("f").time_cell == "2.0 µs" and _row("f").shown_time_ps == 2_000_000.0
    assert _row("f", step=500.0).time_cell == "500 ps"
    assert _row("f", step=500.0, outside=True).time_cell == "outside steps"
    assert _row("f", outside=True).shown_time_ps is None
    assert _row("f").bound_shown == "HBM"
    assert _row("f", bound_basis="intensity with copied bytes").bound_shown == "HBM*"


def test_ops_shown_take_the_first_of_each_kind():
    long = "void ns::Kernel<" + "int, " * 20 + "float>(int)"
    rows = [_row("f.1"), _row("ag.1", family="all-gather"), _row(long), _row("f.3", step=5.0),
            _row("ar.1", family="all-reduce"), _row("ar.2", family="all-reduce", outside=True)]
    shown = OpsShown.of(rows, 2)
    assert [op.name for op in shown.compute] == ["f.1", long] and shown.n_compute == 3
    assert [op.name for op in shown.collectives] == ["ag.1", "ar.1"] and shown.n_collectives == 3
    assert shown.per_step and not shown.outside_steps
    assert shown.compute_names == ("f.1", "ns::Kernel<…>(…)") and shown.names_shortened
    plain = OpsShown.of(rows[:2], 5)
    assert not plain.per_step and not plain.names_shortened and plain.n_compute == 1
    assert OpsShown.of(rows, 3).outside_steps
    assert OpsShown.of((), 5) == OpsShown((), 0, (), 0, False, ())
