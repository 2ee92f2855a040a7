"""The steps table (`analysis.steps.build_steps`, `step_markers`) of hand-built hosts: each step's
busy, compute, collective, I/O, host-transfer and idle time worked out by hand from the timeline
drawn below, by the module's definition (busy: the union of top-level ops inside the step; each
kind of time at most what busy leaves after the kinds before it; busy + idle = the step)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from tpudiag.analysis.steps import build_steps, step_markers
from tpudiag.model import schemas
from tpudiag.model.profile import Platform, StepKind

TPU0, SC0 = "/device:TPU:0", "/device:TPU:0 SparseCore 0"


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENTS from (device, core, name, category, start_ps, end_ps, depth) rows."""
    dev, core, name, cat, start, end, depth = zip(*rows)
    n = len(rows)
    dur = [e - s for s, e in zip(start, end)]
    return schemas.EVENTS.frame({
        "host": ["h"] * n, "device": list(dev), "core": list(core), "chip": list(core), "program_id": [1] * n,
        "module": ["m"] * n, "name": list(name), "category": list(cat), "start_ps": list(start), "dur_ps": dur,
        "self_ps": dur, "depth": list(depth), "step": [0] * n})


def _markers(rows: list[tuple]) -> pd.DataFrame:
    """Step markers from (device, core, step, start_ps, dur_ps) rows."""
    return pd.DataFrame(rows, columns=["device", "core", "step", "start_ps", "dur_ps"])


def _modules(rows: list[tuple]) -> pd.DataFrame:
    """MODULES from (device, core, program_id, module, start_ps, dur_ps) rows."""
    dev, core, pid, module, start, dur = zip(*rows) if rows else ((),) * 6
    n = len(rows)
    return schemas.MODULES.frame({"host": ["h"] * n, "device": list(dev), "core": list(core),
                                  "program_id": list(pid), "module": list(module), "start_ps": list(start),
                                  "dur_ps": list(dur)})


def _host(events, markers, modules=None, platform=Platform.TPU):
    return SimpleNamespace(host="h", events=events, step_markers=markers,
                           modules=modules if modules is not None else _modules([]),
                           device=SimpleNamespace(platform=platform))


# Core 0, steps 0 [0, 100), 1 [100, 200) (a shorter second marker of step 1 is dropped), 2 [200, 240):
#   step 0: fusion.1 [0, 30), all-reduce.1 [30, 50), infeed.1 [50, 60), a host copy [60, 70);
#           a SparseCore op [70, 90) is not TensorCore time. Busy 70: compute 30, collective 20,
#           I/O 10, host transfer 10; idle 30.
#   step 1: while.1 [100, 180) holding fusion.2 [110, 120); all-gather-done.1 [180, 190): busy 90,
#           collective 10, compute 80; idle 10.
#   step 2: all-reduce.2 [200, 230) and infeed.2 [220, 240) overlap, and a host copy [225, 235): busy 40,
#           collective 30, I/O what is left (10), host transfer nothing left; compute 0.
#   fusion.3 [250, 260): in no step.
EVENTS = [
    (TPU0, 0, "fusion.1", "loop fusion", 0, 30, 0),
    (TPU0, 0, "all-reduce.1", "all-reduce", 30, 50, 0),
    (TPU0, 0, "infeed.1", "infeed", 50, 60, 0),
    (TPU0, 0, "copy-start.1", "copy-start", 60, 70, 0),
    (SC0, 0, "fusion.9", "loop fusion", 70, 90, 0),
    (TPU0, 0, "while.1", "while", 100, 180, 0),
    (TPU0, 0, "fusion.2", "loop fusion", 110, 120, 1),
    (TPU0, 0, "all-gather-done.1", "all-gather", 180, 190, 0),
    (TPU0, 0, "all-reduce.2", "all-reduce", 200, 230, 0),
    (TPU0, 0, "Infeed.2", "Infeed", 220, 240, 0),
    (TPU0, 0, "copy-start.2", "copy-start", 225, 235, 0),
    (TPU0, 0, "fusion.3", "loop fusion", 250, 260, 0),
]
HOST_COPY = np.array([name.startswith("copy-start") for _, _, name, *_ in EVENTS])
MARKERS = [(TPU0, 0, 1, 100, 50), (TPU0, 0, 0, 0, 100), (TPU0, 0, 1, 100, 100), (TPU0, 0, 2, 200, 40)]
COLUMNS = ["step", "start_ps", "dur_ps", "busy_ps", "compute_ps", "collective_ps", "io_ps", "host_transfer_ps",
           "idle_ps"]


def test_each_step_splits_its_busy_time_by_kind():
    host = _host(_events(EVENTS), _markers(MARKERS))
    steps, source = build_steps(host, HOST_COPY)
    assert source.kind is StepKind.STEPS_LINE
    assert steps[COLUMNS].to_numpy().tolist() == [
        [0, 0, 100, 70, 30, 20, 10, 10, 30],
        [1, 100, 100, 90, 80, 10, 0, 0, 10],
        [2, 200, 40, 40, 0, 30, 10, 0, 0]]
    assert set(steps["host"]) == {"h"} and set(steps["device"]) == {TPU0} and set(steps["core"]) == {0}
    assert host.events["step"].tolist() == [0, 0, 0, 0, -1, 1, 1, 1, 2, 2, 2, -1]


def test_without_host_copies_marked_a_copy_is_compute():
    steps, _ = build_steps(_host(_events(EVENTS), _markers(MARKERS)))
    assert steps[COLUMNS].to_numpy().tolist()[0] == [0, 0, 100, 70, 40, 20, 10, 0, 30]


def test_a_core_with_markers_and_no_events_is_all_idle():
    events = _events(EVENTS[:1])
    steps, _ = build_steps(_host(events, _markers([(TPU0, 0, 0, 0, 100), ("/device:TPU:1", 1, 0, 0, 100)])))
    assert steps[["core", "busy_ps", "idle_ps"]].to_numpy().tolist() == [[0, 30, 70], [1, 0, 100]]


# A GPU, one step [0, 100): fusion.1 [0, 50) on one stream, all-reduce.1 [30, 80) on NCCL's: busy 80, of
# which the collective alone 30 (compute covers the rest of its span); on a TPU (one line) it would be 50.
GPU_EVENTS = [("/device:GPU:0", 0, "fusion.1", "loop fusion", 0, 50, 0),
              ("/device:GPU:0", 0, "all-reduce.1", "all-reduce", 30, 80, 0)]


def test_a_gpu_collective_counts_only_what_compute_leaves():
    markers = _markers([("/device:GPU:0", 0, 0, 0, 100)])
    gpu, _ = build_steps(_host(_events(GPU_EVENTS), markers, platform=Platform.GPU))
    assert gpu[COLUMNS].to_numpy().tolist() == [[0, 0, 100, 80, 50, 30, 0, 0, 20]]
    tpu, _ = build_steps(_host(_events(GPU_EVENTS), markers))
    assert tpu[COLUMNS].to_numpy().tolist() == [[0, 0, 100, 80, 30, 50, 0, 0, 20]]


def test_a_cpu_s_markers_are_step_annotations():
    _, source = build_steps(_host(_events(EVENTS), _markers(MARKERS), platform=Platform.CPU))
    assert source.kind is StepKind.ANNOTATIONS


def test_without_markers_the_repeating_programs_executions_are_the_steps():
    # jit_train (program 1) runs at 0 and 100 on TPU:0; jit_init (program 2) once, longer; a SparseCore's
    # program 3 repeats and is longest of all, but a SparseCore's modules are not steps.
    modules = _modules([(TPU0, 0, 1, "jit_train", 0, 40), (TPU0, 0, 2, "jit_init", 300, 500),
                        (TPU0, 0, 1, "jit_train", 100, 40), (SC0, 0, 3, "jit_sc", 0, 900), (SC0, 0, 3, "jit_sc", 900, 900)])
    markers, source = step_markers(_host(_events(EVENTS), _markers([]).iloc[:0], modules))
    assert (source.kind, source.module, source.program_id, source.left_out) == (StepKind.XLA_MODULES, "jit_train", 1, 0)
    assert markers[["core", "step", "start_ps", "dur_ps"]].to_numpy().tolist() == [[0, 0, 0, 40], [0, 1, 100, 40]]


def test_without_markers_or_modules_there_are_no_steps():
    host = _host(_events(EVENTS), _markers([]).iloc[:0],
                 _modules([(SC0, 0, 3, "jit_sc", 0, 900)]))
    steps, source = build_steps(host)
    assert source.kind is StepKind.NONE and steps.empty and list(steps.columns) == schemas.STEPS.names


def test_steps_with_no_op_in_the_capture_are_all_idle():
    steps, _ = build_steps(_host(_events(EVENTS).iloc[:0], _markers([(TPU0, 0, 0, 0, 100), (TPU0, 0, 1, 100, 50)])))
    assert steps[COLUMNS].to_numpy().tolist() == [[0, 0, 100, 0, 0, 0, 0, 0, 100], [1, 100, 50, 0, 0, 0, 0, 0, 50]]


def test_a_recompiled_module_of_the_same_name_is_another_program():
    # jit_train as program 1 runs at 0 and 100; recompiled as program 7 it runs once at 200: the steps
    # are program 1's executions only
    modules = _modules([(TPU0, 0, 1, "jit_train", 0, 40), (TPU0, 0, 1, "jit_train", 100, 40),
                        (TPU0, 0, 7, "jit_train", 200, 30)])
    markers, source = step_markers(_host(_events(EVENTS), _markers([]).iloc[:0], modules))
    assert (source.program_id, source.left_out) == (1, 0)
    assert markers[["step", "start_ps"]].to_numpy().tolist() == [[0, 0], [1, 100]]


def test_a_gpu_collective_counts_what_compute_leaves_when_they_differ_in_length():
    # fusion.1 [0, 60), all-reduce.1 [30, 80): busy 80; compute covers 30 of the collective's 50, so the
    # collective alone is 20, compute 60, idle 20
    events = _events([("/device:GPU:0", 0, "fusion.1", "loop fusion", 0, 60, 0),
                      ("/device:GPU:0", 0, "all-reduce.1", "all-reduce", 30, 80, 0)])
    gpu, _ = build_steps(_host(events, _markers([("/device:GPU:0", 0, 0, 0, 100)]), platform=Platform.GPU))
    assert gpu[COLUMNS].to_numpy().tolist() == [[0, 0, 100, 80, 60, 20, 0, 0, 20]]


def test_collectives_by_name_or_by_category_and_an_op_at_a_steps_end():
    # all-reduce.5 [0, 10) is one by its name (its category says nothing); fusion.12 [10, 30) by its
    # category; fusion.1 [30, 40) is compute; fusion.2 starts exactly where the last step ends: no step's
    events = _events([(TPU0, 0, "all-reduce.5", "custom", 0, 10, 0),
                      (TPU0, 0, "fusion.12", "all-reduce-scatter fusion", 10, 30, 0),
                      (TPU0, 0, "fusion.1", "loop fusion", 30, 40, 0),
                      (TPU0, 0, "fusion.2", "loop fusion", 50, 60, 0)])
    host = _host(events, _markers([(TPU0, 0, 0, 0, 50)]))
    steps, _ = build_steps(host)
    assert steps[COLUMNS].to_numpy().tolist() == [[0, 0, 50, 40, 10, 30, 0, 0, 10]]
    assert host.events["step"].tolist() == [0, 0, 0, -1]


def test_one_reference_execution_reaches_as_far_as_the_longest_execution():
    # each core ran the program once; core 1 started 5 ps after core 0: within the longest execution
    # (100 ps), so it is the same step (the docstring: "than its longest execution when the reference
    # ran once"); 150 ps after would be too far
    from tpudiag.analysis.steps import aligned_executions
    near = pd.DataFrame({"device": [TPU0, "/device:TPU:1"], "core": [0, 1], "start_ps": [0, 5], "dur_ps": [100, 90]})
    kept, left_out = aligned_executions(near)
    assert kept[["core", "step", "start_ps"]].to_numpy().tolist() == [[0, 0, 0], [1, 0, 5]] and left_out == 0
    far = near.assign(start_ps=[0, 150])
    kept, left_out = aligned_executions(far)
    assert kept.empty and left_out == 2


def test_cores_whose_events_interleave_are_each_read_whole():
    # The events of two cores alternate in the table (core 0 at rows 0, 2, 4; core 1 at rows 1, 3), so
    # neither core's events are one block. One step [0, 100) on each core:
    #   core 0: fusion.1 [0, 10), fusion.2 [20, 30), all-reduce.1 [40, 50): busy 30, collective 10, compute 20
    #   core 1: fusion.1 [0, 40), fusion.2 [50, 60): busy 50, all compute
    tpu1 = "/device:TPU:1"
    events = _events([(TPU0, 0, "fusion.1", "loop fusion", 0, 10, 0), (tpu1, 1, "fusion.1", "loop fusion", 0, 40, 0),
                      (TPU0, 0, "fusion.2", "loop fusion", 20, 30, 0), (tpu1, 1, "fusion.2", "loop fusion", 50, 60, 0),
                      (TPU0, 0, "all-reduce.1", "all-reduce", 40, 50, 0)])
    host = _host(events, _markers([(TPU0, 0, 0, 0, 100), (tpu1, 1, 0, 0, 100)]))
    steps, _ = build_steps(host)
    assert steps[["core", *COLUMNS]].to_numpy().tolist() == [[0, 0, 0, 100, 30, 20, 10, 0, 0, 70],
                                                             [1, 0, 0, 100, 50, 50, 0, 0, 0, 50]]
    assert host.events["step"].tolist() == [0, 0, 0, 0, 0]


def test_a_block_is_a_slice_only_when_the_positions_are_contiguous():
    from tpudiag.analysis.steps import _block

    # the docstring's contract: one contiguous block is read as a view (a slice), anything else as it is
    block = _block(np.array([3, 4, 5]))
    assert isinstance(block, slice) and block == slice(3, 6)
    assert _block(np.array([0])) == slice(0, 1)
    for gapped in ([0, 2, 4], [0, 1, 3], [2, 5]):  # a gap of one row, or more
        assert _block(np.array(gapped)).tolist() == gapped
    assert _block(np.array([], dtype=np.int64)).tolist() == []
