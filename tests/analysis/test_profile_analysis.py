"""The analysis' own figures (`tpudiag.analysis.profile_analysis`) on hand-built tables: step times
per host and combined over hosts (XProf: the slowest core's step, then the slowest host's), the mean
breakdown, and the core counts a per-core mean divides by. Expected values worked by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.profile_analysis import Analysis, analyze, combined_step_times, mean_breakdown, per_step_times
from tpudiag.model import schemas
from tpudiag.model.profile import Platform
from tpudiag.model.report import Breakdown


def _steps(rows: list[tuple]) -> pd.DataFrame:
    """STEPS from (host, core, step, dur_ps, compute_ps, collective_ps, io_ps, host_transfer_ps) rows;
    busy is the four kinds, idle the rest."""
    host, core, step, dur, comp, coll, io, hc = zip(*rows) if rows else ((),) * 8
    busy = np.add.reduce([np.array(x, dtype=np.int64) for x in (comp, coll, io, hc)]) if rows else []
    return schemas.STEPS.frame({
        "host": list(host), "device": [f"/device:TPU:{c}" for c in core], "core": list(core), "step": list(step),
        "start_ps": [0] * len(rows), "dur_ps": list(dur), "busy_ps": list(busy), "compute_ps": list(comp),
        "collective_ps": list(coll), "io_ps": list(io), "host_transfer_ps": list(hc),
        "idle_ps": list(np.array(dur, dtype=np.int64) - np.array(busy, dtype=np.int64))})


# h0: two cores, steps 0-2 (step 2 on core 0 only); h1: one core, steps 0-1.
STEP_ROWS = [("h0", 0, 0, 100, 50, 10, 0, 0), ("h0", 1, 0, 120, 60, 20, 0, 0), ("h0", 0, 1, 90, 40, 0, 10, 0),
             ("h0", 1, 1, 80, 30, 0, 0, 10), ("h0", 0, 2, 50, 10, 0, 0, 0),
             ("h1", 0, 0, 110, 70, 0, 0, 0), ("h1", 0, 1, 130, 80, 30, 0, 0)]


def test_a_hosts_step_time_is_its_slowest_cores():
    got = per_step_times(_steps(STEP_ROWS))
    assert [(str(h), int(s), int(d)) for h, s, d in got[["host", "step", "dur_ps"]].itertuples(index=False)] == [
        ("h0", 0, 120), ("h0", 1, 90), ("h0", 2, 50), ("h1", 0, 110), ("h1", 1, 130)]


def test_the_combined_step_time_is_the_slowest_hosts_over_the_steps_every_host_ran():
    times, warnings = combined_step_times(_steps(STEP_ROWS), 2)
    # step 0: max(120, 110); step 1: max(90, 130); step 2 only on h0: left out, and said so
    assert times.tolist() == [120, 130] and times.dtype == np.int64
    assert warnings == ["1 step numbers are missing on some hosts; the combined step time uses only the steps "
                        "every host recorded"]
    alone, warnings = combined_step_times(_steps(STEP_ROWS[:5]), 1)
    assert alone.tolist() == [120, 90, 50] and warnings == []
    empty, warnings = combined_step_times(_steps([]), 2)
    assert empty.tolist() == [] and empty.dtype == np.int64 and warnings == []


def test_the_mean_breakdown_is_per_step_and_core():
    b = mean_breakdown(_steps(STEP_ROWS[:4]))
    # four (core, step) rows: step (100+120+90+80)/4, compute (50+60+40+30)/4, collective 30/4, I/O
    # 10/4, host transfers 10/4; idle is the rest of the step: (40+40+40+40)/4
    assert b == Breakdown(step_ps=97.5, compute_ps=45.0, collective_ps=7.5, io_ps=2.5, idle_ps=40.0,
                          host_transfer_ps=2.5)
    assert mean_breakdown(_steps([])) is None


def _op_cores(pairs: list[tuple[str, int]]) -> pd.DataFrame:
    return pd.DataFrame({"device": [d for d, _ in pairs], "core": [c for _, c in pairs]})


def _analysis(platform: Platform, cores_per_host: list[int], op_cores: list[list[tuple[str, int]]],
              over_peak=()) -> Analysis:
    hosts = [SimpleNamespace(device=SimpleNamespace(platform=platform, n_cores=n)) for n in cores_per_host]
    digests = {f"h{i}": SimpleNamespace(op_cores=_op_cores(p), n_events=10 * (i + 1)) for i, p in enumerate(op_cores)}
    return Analysis(SimpleNamespace(hosts=hosts), digests, None, steps=None, ops=None, step_sources={},
                    core_time_ps={}, host_transfers=None, over_peak=over_peak)


def test_a_gpu_mean_counts_the_gpus_that_ran_ops():
    # 8 GPUs on each of two hosts; ops ran on 1 of h0's (two ops on it) and 2 of h1's
    a = _analysis(Platform.GPU, [8, 8], [[("/device:GPU:0", 0), ("/device:GPU:0", 0)],
                                         [("/device:GPU:0", 0), ("/device:GPU:3", 3)]])
    assert a.platform is Platform.GPU and a.n_cores_with_ops == 3 and a.n_cores_of_ops == 3
    # no GPU ran an op: every plane counts
    assert _analysis(Platform.GPU, [8, 8], [[], []]).n_cores_of_ops == 16
    assert a.n_events == 10 + 20


def test_a_tpu_mean_counts_every_core_and_at_least_one():
    a = _analysis(Platform.TPU, [4, 4], [[("/device:TPU:0", 0)], [("/device:TPU:1", 1)]])
    assert a.n_cores_with_ops == 2 and a.n_cores_of_ops == 8
    assert _analysis(Platform.TPU, [0], [[]]).n_cores_of_ops == 1


def test_over_peak_names_are_the_ops_named():
    over = (SimpleNamespace(op="fusion.1"), SimpleNamespace(op="fusion.2"), SimpleNamespace(op="fusion.1"))
    assert _analysis(Platform.TPU, [1], [[]], over).over_peak_names == frozenset({"fusion.1", "fusion.2"})


def test_a_fold_made_elsewhere_must_be_passed():
    # every host brings a digest whose per-step tables were folded as it arrived, and the profile
    # holds no fold of an earlier analysis: the caller must pass the fold
    digest = SimpleNamespace(per_step=None)
    profile = SimpleNamespace(hosts=[SimpleNamespace(host="h0", digest=digest)], step_fold=None)
    with pytest.raises(ValueError, match="some hosts' per-step tables were folded elsewhere: pass that fold as "
                                         "`per_step`"):
        analyze(profile)


def test_a_fold_made_elsewhere_is_refused_with_the_whole_message():
    digest = SimpleNamespace(per_step=None)
    profile = SimpleNamespace(hosts=[SimpleNamespace(host="h0", digest=digest)], step_fold=None)
    with pytest.raises(ValueError) as info:
        analyze(profile)
    assert str(info.value) == "some hosts' per-step tables were folded elsewhere: pass that fold as `per_step`"



@pytest.mark.parametrize("modelled", [False, True])
def test_an_analysis_keeps_its_profile_its_sources_its_transfers_and_the_ops_over_the_peak(write_design, modelled):
    from tests.conftest import US, small_design
    from tpudiag.analysis.limits import ASYNC_CAUSE, MODEL_CAUSE
    from tpudiag.model.profile import StepKind, StepSource
    from tpudiag.parsers.capture import load_capture

    stats = {"tpudiag_modelled": 1} if modelled else {}
    profile = load_capture(write_design(small_design(extra_plane_stats=stats)), jobs=1)
    assert profile.modelled is modelled
    a = analyze(profile)
    assert a.profile is profile and a.platform is Platform.TPU
    assert a.step_sources == {"host0": StepSource(StepKind.STEPS_LINE)}  # the design writes a Steps line
    # no host copy in the design: an empty transfer table, with its columns
    assert a.host_transfers.empty and list(a.host_transfers.columns) == schemas.HOST_TRANSFERS.names
    # The design's ops above its chip's peaks (918 TFLOP/s, 1,640 GB/s), each over 2 chips x 5 steps:
    # fusion.5's 1e12 FLOPs in 990 us is 1,010 TFLOP/s; all-gather-start.1's 1e8 bytes in 10 us, 10 TB/s
    got = [(o.op, o.quantity, o.peak, o.time_ps) for o in a.over_peak]
    assert got == [("fusion.5", "FLOP/s", 918e12, 10 * 990 * US),
                   ("all-gather-start.1", "HBM bandwidth", 1640e9, 10 * 10 * US)]
    assert [o.rate for o in a.over_peak] == [pytest.approx(1e12 / 990e-6), pytest.approx(1e8 / 10e-6)]
    # a modelled capture's op above the roofline is tpudiag's own error, an async start's or not
    assert a.over_peak[1].cause == (MODEL_CAUSE if modelled else ASYNC_CAUSE)
    assert a.over_peak_names == frozenset({"fusion.5", "all-gather-start.1"})
