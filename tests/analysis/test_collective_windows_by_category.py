"""A collective known only by its category (a reduce-scatter fusion that XLA names `fusion.N`) is a
collective window, sync, of its family: the exposed-collective rule reads these windows."""

from __future__ import annotations

from tests.conftest import US
from tpudiag.analysis.collective_windows import host_windows
from tpudiag.analysis.steps import build_steps
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed


def test_a_reduce_scatter_fusion_named_fusion_n_is_a_sync_collective_window(write_design):
    ops = (OpDef("fusion.1", "convolution fusion", flops=1e9), OpDef("fusion.12", "all-reduce-scatter fusion"),
           OpDef("fusion.13", "loop fusion"))

    def sched(chip, step):  # by design: 40 µs of reduce-scatter, its first 10 µs beside no compute
        return [Placed("fusion.1", 0, 100 * US), Placed("fusion.12", 100 * US, 40 * US),
                Placed("fusion.13", 150 * US, 10 * US)]

    run = write_design(CaptureDesign("h", "TPU v5 lite", None, None, "m", 1, ops, 1, 2, 200 * US, sched))
    host = load_capture(run).hosts[0]
    steps, _ = build_steps(host)
    windows = host_windows(host, steps)
    assert windows is not None
    assert set(windows["name"]) == {"fusion.12"}  # neither the convolution nor the loop fusion
    assert set(windows["family"]) == {"reduce-scatter"}
    assert set(windows["kind"]) == {"sync"}
    assert len(windows) == 2 and (windows["span_ps"] == 40 * US).all()


def _windows_and_collective_time(write_design, ops, sched):
    run = write_design(CaptureDesign("h", "TPU v5 lite", None, None, "m", 1, ops, 1, 2, 200 * US, sched))
    host = load_capture(run).hosts[0]
    steps, _ = build_steps(host)
    return host_windows(host, steps), steps


def test_a_fusion_category_without_all_names_its_collective_as_the_steps_table_does(write_design):
    # `reduce-scatter fusion` and `collective-permute fusion` name no "all-": a guard once kept them from
    # being windows while the steps table counted them as collective time.
    ops = (OpDef("fusion.1", "convolution fusion", flops=1e9), OpDef("fusion.12", "reduce-scatter fusion"),
           OpDef("fusion.13", "collective-permute fusion"))

    def sched(chip, step):  # by design: 30 µs of reduce-scatter and 20 µs of permute, beside no compute
        return [Placed("fusion.1", 0, 100 * US), Placed("fusion.12", 100 * US, 30 * US),
                Placed("fusion.13", 140 * US, 20 * US)]

    windows, steps = _windows_and_collective_time(write_design, ops, sched)
    assert windows is not None
    assert sorted(set(zip(windows["name"], windows["family"]))) == [("fusion.12", "reduce-scatter"),
                                                                    ("fusion.13", "collective-permute")]
    assert sorted(windows["span_ps"].unique()) == [20 * US, 30 * US]
    assert (steps["collective_ps"] == 50 * US).all()  # the same 50 µs per step and core


def test_an_async_collective_fusion_continuation_is_compute_whatever_its_category(write_design):
    # Its name says it is the compute an async collective carries: never a collective window, as in
    # the steps table, even where the category names a collective.
    ops = (OpDef("async-collective-fusion.3", "all-gather fusion", flops=1e9),
           OpDef("fusion.12", "all-gather fusion"))

    def sched(chip, step):  # by design: 100 µs of continuation, then 40 µs of all-gather beside nothing
        return [Placed("async-collective-fusion.3", 0, 100 * US), Placed("fusion.12", 100 * US, 40 * US)]

    windows, steps = _windows_and_collective_time(write_design, ops, sched)
    assert windows is not None and set(windows["name"]) == {"fusion.12"}
    assert (steps["collective_ps"] == 40 * US).all() and (steps["compute_ps"] >= 100 * US).all()
