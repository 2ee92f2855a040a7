from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import US, bounded_examples, small_design
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture


def test_step_breakdown_of_the_small_design(small_capture):
    a = analyze(load_capture(small_capture))
    steps = a.steps
    assert len(steps) == 10  # 2 cores x 5 steps
    assert (steps["dur_ps"] == 10_000 * US).all()
    core0 = steps[steps["core"] == 0].iloc[0]
    # Busy: fusion.1 3000 + start 10 + fusion.3 1000 + done 300 + while 1000 + all-reduce 500 + copy 200.
    assert core0["busy_ps"] == 6010 * US
    assert core0["collective_ps"] == (10 + 300 + 500) * US
    assert core0["busy_ps"] + core0["idle_ps"] == core0["dur_ps"]
    assert core0["compute_ps"] + core0["collective_ps"] + core0["io_ps"] == core0["busy_ps"]


def test_events_are_labelled_with_their_step(small_capture):
    host = load_capture(small_capture).hosts[0]
    analyze_result = analyze(load_capture(small_capture))
    ev = analyze_result.profile.hosts[0].events
    assert set(ev["step"].unique()) == {1, 2, 3, 4, 5}
    assert len(host.events) == len(ev)


def test_steps_from_module_executions_without_a_steps_line(write_design):
    run = write_design(small_design(steps_line=False))
    a = analyze(load_capture(run))
    report = build_report(a)
    assert report.summary.step_source == "XLA Modules (jit_train_step)"
    assert report.summary.step_time.count == 5
    # A module execution spans the first op start to the last op end: 7,200 µs.
    assert report.summary.step_time.mean_ps == 7200 * US
    assert any("no Steps line" in w for w in report.warnings)


def test_no_steps_and_no_modules_reports_no_step_time(write_design):
    run = write_design(small_design(steps_line=False, modules_line=False))
    report = build_report(analyze(load_capture(run)))
    assert report.summary.step_time is None
    assert report.ops  # ops are still analysed


def two_host_run(tmp_path, slow_host_extra_ps: int):
    run = tmp_path / "plugins" / "profile" / "run"
    for i, host in enumerate(("host0", "host1")):
        extra = slow_host_extra_ps if host == "host1" else 0
        design = small_design(hostname=host, first_chip=2 * i,
                              step_ps_for=lambda chip, step, extra=extra: 10_000 * US + extra)
        write_capture(design, run)
    return tmp_path


def test_multi_host_straggler_is_not_hidden(tmp_path):
    report = build_report(analyze(load_capture(two_host_run(tmp_path, 2_000 * US), jobs=2)))
    s = report.summary
    assert s.hosts == ("host0", "host1")
    assert s.slowest_host == "host1"
    assert s.host_spread_ps == pytest.approx(2_000 * US)
    # The combined step time is the slowest host's, per step.
    assert s.step_time.mean_ps == 12_000 * US
    per_host = {h.host: h.step_time.mean_ps for h in report.hosts}
    assert per_host == {"host0": 10_000 * US, "host1": 12_000 * US}


@settings(max_examples=bounded_examples(25, 10), deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.integers(0, 300)), min_size=1, max_size=12),
       st.integers(1, 4))
def test_busy_plus_idle_is_the_step_time(tmp_path_factory, ops, n_steps):
    """Property: for any placement of ops, busy + idle = step and the buckets add up to busy."""
    defs = tuple(OpDef(f"fusion.{i}", "loop fusion", bytes_accessed=1e6) for i in range(len(ops)))

    def sched(chip, step):
        t, out = 0, []
        for i, (dur, gap) in enumerate(ops):
            t += gap * US
            out.append(Placed(f"fusion.{i}", t, dur * US))
            t += dur * US
        return out

    total = sum(d + g for d, g in ops) * US
    design = CaptureDesign("h", "TPU v5 lite", None, None, "m", 1, defs, 1, n_steps, total // 2 + 1, sched)
    run = write_capture(design, tmp_path_factory.mktemp("p") / "run").parent
    steps = analyze(load_capture(run)).steps
    assert (steps["busy_ps"] + steps["idle_ps"] == steps["dur_ps"]).all()
    assert (steps["compute_ps"] + steps["collective_ps"] + steps["io_ps"] == steps["busy_ps"]).all()
    assert (steps["idle_ps"] >= 0).all() and (steps["busy_ps"] >= 0).all()


def test_peaks_fall_back_to_the_hardware_table(write_design):
    run = write_design(small_design(peak_tflops=None, peak_hbm_gbs=None, device_type="TPU v5 lite"))
    report = build_report(analyze(load_capture(run)))
    assert report.summary.peaks_source == "hardware table"
    assert report.summary.peak_flops_per_s == pytest.approx(197e12)
    assert any("public figures for v5e" in w for w in report.warnings)


def test_gpu_capture_gives_an_op_table(tmp_path):
    from tpudiag.writers.xspace_builder import U64, XSpaceBuilder

    space = XSpaceBuilder("gpuhost")
    plane = space.plane("/device:GPU:0", 1)
    plane.set_stat("gpu_device_name", "NVIDIA H200")
    kernel = plane.event_metadata("sm90_xmma_gemm_bf16")
    line = plane.line("Stream #13(compute)", 13, 1_700_000_000_000_000_000)
    for i in range(3):
        line.event(kernel, i * 1_000_000, 400_000, {"hlo_op": "dot.3", "hlo_module": "jit_f", "program_id": U64(9),
                                                     "correlation_id": U64(i)})
    other = plane.event_metadata("loop_add_fusion")
    line.event(other, 5_000_000, 100_000, {"hlo_op": "add_fusion", "hlo_module": "jit_f", "program_id": U64(9)})
    f = space.write(tmp_path / "gpuhost.xplane.pb")
    report = build_report(analyze(load_capture(f)))
    assert report.summary.platform == "GPU"
    ops = {o.name: o for o in report.ops}
    assert ops["dot.3"].occurrences == 3 and ops["dot.3"].total_time_ps == 1_200_000
    assert ops["dot.3"].program == "jit_f"
    assert np.isclose(ops["add_fusion"].self_time_ps, 100_000)


def test_regression_collective_named_by_category_only_counts_as_collective_time(write_design):
    """`fusion` of category `all-reduce-scatter fusion` is a reduce-scatter in the ops table; the step
    breakdown must count it as collective time too, not compute."""
    ops = (OpDef("fusion.1", "convolution fusion", flops=1e9), OpDef("fusion", "all-reduce-scatter fusion"))

    def sched(chip, step):
        return [Placed("fusion.1", 0, 100 * US), Placed("fusion", 100 * US, 40 * US)]

    run = write_design(CaptureDesign("h", "TPU v5 lite", None, None, "m", 1, ops, 1, 2, 200 * US, sched))
    a = analyze(load_capture(run))
    assert (a.steps["collective_ps"] == 40 * US).all()
    assert a.ops.set_index("name").loc["fusion", "family"] == "reduce-scatter"


@pytest.mark.parametrize(("ar_at_us", "exposed_us"), [(100, 0), (500, 100), (None, 200)])
def test_gpu_step_counts_only_the_collective_time_compute_does_not_cover(tmp_path, ar_at_us, exposed_us):
    from tests import gpu_captures as gc
    from tests.rules.scenarios import analyse_path

    # Each 1 ms step: a 600 µs gemm on the compute stream from the step's start, a 200 µs all-reduce
    # on the NCCL stream from `ar_at_us` (None: after the gemm). What the gemm covers is hidden:
    # compute stays 600 µs, collectives are the rest, and busy + idle is the step.
    steps = analyse_path(gc.write(gc.training(ar_at_us=ar_at_us), tmp_path)).steps
    assert (steps["compute_ps"] == 600 * US).all() and (steps["collective_ps"] == exposed_us * US).all()
    assert (steps["busy_ps"] + steps["idle_ps"] == steps["dur_ps"]).all()
    assert (steps["compute_ps"] + steps["collective_ps"] == steps["busy_ps"]).all()
