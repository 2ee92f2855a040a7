"""`analysis.memory_timeline` on allocator events written here, one event a row as
`parsers.allocator_events` reads them (`schemas.ALLOCATOR_EVENTS`): the peak, what was live at it
and the sampled graph, each worked by hand from XProf's definitions (module docstring)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from tpudiag.analysis.memory_timeline import (_steps, allocator_timeline, host_memory_timeline, sampled,
                                              timeline_of_planes)
from tpudiag.model.allocator import UNATTRIBUTED, ActiveAllocation, HostAllocatorEvents
from tpudiag.model.profile import HostFailure
from tpudiag.model.schemas import ALLOCATOR_EVENTS

PRE = 1000  # heap bytes allocated before the capture


def _events(rows, allocator="TPU_0_bfc"):
    """rows: (time_ps, allocation, address, bytes, step, heap after, op, shape)."""
    n = len(rows)
    return ALLOCATOR_EVENTS.frame({
        "allocator": [allocator] * n, "allocation": [r[1] for r in rows], "time_ps": [r[0] for r in rows],
        "heap_bytes": [r[5] for r in rows], "stack_bytes": [20] * n, "free_bytes": [5000 - r[5] for r in rows],
        "fragmentation": [r[0] / 1000 for r in rows], "lifetime_peak_bytes": [3000] * n,
        "requested_bytes": [r[3] - 1 for r in rows], "allocation_bytes": [r[3] for r in rows],
        "address": [r[2] for r in rows], "step_id": [r[4] for r in rows], "op": [r[6] for r in rows],
        "region_type": ["temp"] * n, "data_type": [1] * n, "shape": [r[7] for r in rows],
        "thread": ["t"] * n, "annotation": [""] * n})


# time, alloc?, address, bytes, step (-1: not given), heap after, op, shape
ROWS = [
    (10, True, 1, 100, -1, PRE + 100, "init", "f32[25]"),  # before any step: step 0
    (30, False, 1, 100, -1, PRE + 200, "init", "f32[25]"),  # freed in step 6 (after 5), made in step 0
    (20, True, 2, 200, 5, PRE + 300, "fwd", "f32[50]"),  # written after the event at 30: placed by time
    (40, True, 3, 200, 6, PRE + 400, "dot", "f32[50]"),
    (50, True, 4, 200, 6, PRE + 600, "dot", "f32[50]"),  # alike the one at 40: one row, 2 occurrences
    (60, True, 5, 50, 6, PRE + 650, "add", "f32[12]"),
    (70, False, 5, 50, 6, PRE + 600, "add", "f32[12]"),  # made and freed in the step: not live
    (80, True, 7, 100, 6, PRE + 700, "mul", "f32[25]"),  # the peak: 1,700 heap + 20 stack
    (90, False, 3, 200, 6, PRE + 500, "dot", "f32[50]"),  # after the peak: still live at it
    (100, True, 8, 50, 7, PRE + 550, "sub", "f32[12]"),
]


def test_the_peak_its_step_and_what_was_live_at_it():
    a = allocator_timeline("TPU_0_bfc", _events(ROWS))
    assert (a.allocator, a.events, a.peak_bytes, a.peak_time_ps) == ("TPU_0_bfc", 10, 1720, 80)
    assert (a.peak_heap_bytes, a.peak_stack_bytes, a.peak_step) == (1700, 20, 6)
    assert a.capacity_bytes == 1720 + (5000 - 1700)  # in use + free at the peak
    assert a.fragmentation_at_peak == pytest.approx(0.08) and a.lifetime_peak_bytes == 3000
    # the heap at the peak, 1,700 B: 1,000 before the capture and step 5's 200 are not the step's (1,200)
    assert a.at_peak == (
        ActiveAllocation(1200, 1200, 1, UNATTRIBUTED, "", 0, "", attributed=False),
        ActiveAllocation(200, 199, 2, "dot", "temp", 1, "f32[50]"),
        ActiveAllocation(100, 99, 1, "mul", "temp", 1, "f32[25]"),
        ActiveAllocation(20, 20, 1, "stack", "stack", 0, "", attributed=False))
    t = a.timeline
    assert t["time_ps"].tolist() == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert t["in_use_bytes"].tolist()[:3] == [PRE + 120, PRE + 320, PRE + 220]
    assert t["step_id"].tolist() == [0, 5, 6, 6, 6, 6, 6, 6, 6, 7]
    assert t["free_bytes"].iat[7] == 5000 - 1700 and t["allocation"].tolist()[:3] == [True, True, False]
    assert t["allocation_bytes"].tolist()[:3] == [100, 200, 100]


def test_of_two_equal_peaks_the_later_counts_and_a_heap_fully_attributed_has_no_remainder():
    rows = [(10, True, 1, 100, 3, 100, "a", "f32[25]"), (20, False, 1, 100, 3, 0, "a", "f32[25]"),
            (30, True, 2, 100, 4, 100, "b", "f32[25]")]
    a = allocator_timeline("x", _events(rows))
    assert (a.peak_time_ps, a.peak_step) == (30, 4)
    assert [r.op for r in a.at_peak] == ["b", "stack"]  # 100 B heap, all of it step 4's `b`


def test_missing_steps_take_the_step_after_the_last_one_seen():
    import numpy as np

    assert _steps(np.array([-1, -1, 4, -1, 2, -1])).tolist() == [0, 0, 4, 5, 2, 3]


def test_hosts_allocators_in_name_order():
    events = pd.concat([_events(ROWS[:3], "TPU_1_bfc"), _events(ROWS[:1], "TPU_0_bfc")], ignore_index=True)
    events["allocator"] = events["allocator"].astype("category")
    host = host_memory_timeline(HostAllocatorEvents("h", "h.xplane.pb", events, ("w",)))
    assert [(a.allocator, a.events) for a in host.allocators] == [("TPU_0_bfc", 1), ("TPU_1_bfc", 3)]
    assert (host.host, host.path, host.warnings) == ("h", "h.xplane.pb", ("w",))


def test_sampling_keeps_the_highest_of_each_box():
    # 10 points into 4 boxes: 10 // 4 = 2 wide, 4 x 3 - 10 = 2 boxes of 2 then 2 boxes of 3:
    # [0, 2), [2, 4), [4, 7), [7, 10)
    timeline = pd.DataFrame({"time_ps": range(10), "in_use_bytes": [5, 1, 2, 9, 3, 8, 4, 7, 7, 6]})
    assert sampled(timeline, 4)["time_ps"].tolist() == [0, 3, 5, 7]  # a tie keeps the first
    assert sampled(timeline, 10) is timeline and sampled(timeline, 11) is timeline
    # 10 into 9: 8 boxes of 1, then [8, 10) keeps 8 (7 over 6)
    assert sampled(timeline, 9)["time_ps"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert sampled(timeline, 9).index.tolist() == list(range(9))
    assert list(sampled(timeline, 4).columns) == ["time_ps", "in_use_bytes"]  # the old positions are not kept


def test_a_host_whose_planes_cannot_be_read_is_its_failure_naming_the_file(monkeypatch):
    from tpudiag.analysis import memory_timeline
    from tpudiag.errors import InputError

    def damaged(planes, roles, path, host):
        raise InputError("damaged allocator line", hint="h")

    monkeypatch.setattr(memory_timeline, "allocator_events_of_planes", damaged)
    failure = timeline_of_planes([], None, "/c/host0.xplane.pb", "host0")
    assert failure == HostFailure("/c/host0.xplane.pb", InputError("damaged allocator line", path="/c/host0.xplane.pb",
                                                                   hint="h").one_line(), "h")  # the hint kept
    planes, roles = ["plane"], {"plane": "host"}

    def events(got_planes, got_roles, path, host):
        assert (got_planes, got_roles) == (planes, roles)  # the host's own planes and roles are read
        return HostAllocatorEvents(host, str(path), _events(ROWS))

    monkeypatch.setattr(memory_timeline, "allocator_events_of_planes", events)
    read = timeline_of_planes(planes, roles, "/c/host0.xplane.pb", "host0")
    assert (read.host, read.path, [a.peak_bytes for a in read.allocators]) == ("host0", "/c/host0.xplane.pb", [1720])
