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
