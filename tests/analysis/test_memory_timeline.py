"""Memory over time from the allocator's events, against XProf's memory profile on the same files.

The oracle is the installed xprof's `memory_profile` tool (`xprof.convert.raw_to_tool_data`), run
in a child process on a copy of each capture. Inputs: a capture written here with a played
allocator (`writers.allocator_trace`: known sizes, steps, ops, more events than XProf's graph
keeps), and the two real GPU captures in ../shared (TSL's own allocator events).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.memory_captures import played_capture
from tpudiag.analysis.memory_timeline import XPROF_MAX_SNAPSHOTS, capture_memory_timelines, host_memory_timeline, sampled
from tpudiag.errors import InputError
from tpudiag.model.allocator import UNATTRIBUTED
from tpudiag.parsers.allocator_events import read_allocator_events
from tpudiag.parsers.capture import plane_roles, split_planes
from tpudiag.proto import XSpace

REAL = SHARED / "data" / "real-captures"
GIB = 1 << 30

_ORACLE = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "memory_profile", {})
sys.stdout.write(data.decode() if isinstance(data, bytes) else data)
"""


def xprof_memory_profile(path: Path, tmp: Path) -> dict:
    copy = tmp / "oracle" / path.name  # xprof may write beside its input: never in ours or ../shared
    copy.parent.mkdir(exist_ok=True)
    shutil.copy(path, copy)
    proc = subprocess.run([sys.executable, "-c", _ORACLE, str(copy)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _xprof_rows(allocator: dict) -> list[tuple]:
    """XProf's active allocations at the peak as (bytes, requested, count, op, region, dtype, shape, attributed)."""
    rows = []
    for a in allocator["activeAllocations"]:
        special = int(a["specialIndex"])
        meta = (allocator["specialAllocations"][special] if special >= 0
                else allocator["memoryProfileSnapshots"][int(a["snapshotIndex"])]["activityMetadata"])
        op = {"unused preallocated device memory": UNATTRIBUTED}.get(meta["tfOpName"], meta["tfOpName"])
        shape = "" if special >= 0 else meta["tensorShape"]
        rows.append((int(meta["allocationBytes"]), int(meta["requestedBytes"]), int(a["numOccurrences"]), op,
                     "" if op == UNATTRIBUTED else meta["regionType"], meta["dataType"], shape, special < 0))
    return rows


def _ours_rows(timeline) -> list[tuple]:
    return [(a.allocation_bytes, a.requested_bytes, a.occurrences, a.op, a.region_type, a.data_type_name, a.shape,
             a.attributed)
            for a in timeline.at_peak]


def assert_agrees(ours, oracle: dict, shift_ps: int, *, at_peak: bool = True) -> None:
    """Every allocator's summary, sampled timeline and (when `at_peak`) live set equal XProf's.
    `shift_ps` maps our times (from the first allocator event) to XProf's (offsets in the line)."""
    assert sorted(oracle["memoryIds"]) == [a.allocator for a in ours.allocators]
    for a in ours.allocators:
        x = oracle["memoryProfilePerAllocator"][a.allocator]
        summary, peak = x["profileSummary"], x["profileSummary"]["peakStats"]
        assert a.peak_bytes == int(peak["peakBytesInUse"]), a.allocator
        assert (a.peak_heap_bytes, a.peak_stack_bytes) == (int(peak["heapAllocatedBytes"]),
                                                            int(peak["stackReservedBytes"]))
        assert a.peak_time_ps + shift_ps == int(summary["peakStatsTimePs"])
        assert a.capacity_bytes == int(summary["memoryCapacity"])
        assert a.lifetime_peak_bytes == int(summary["peakBytesUsageLifetime"])
        assert a.fragmentation_at_peak == pytest.approx(peak["fragmentation"], abs=1e-6)
        theirs = [(int(s["timeOffsetPs"]), int(s["aggregationStats"]["heapAllocatedBytes"])
                   + int(s["aggregationStats"]["stackReservedBytes"])) for s in x["sampledTimelineSnapshots"]]
        graph = sampled(a.timeline)
        assert list(zip(graph["time_ps"] + shift_ps, graph["in_use_bytes"])) == theirs
        if at_peak:
            assert _ours_rows(a) == _xprof_rows(x)


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("played")
    return played_capture(root / "host0.xplane.pb"), root


@pytest.mark.xprof
def test_played_allocators_agree_with_xprof(played):
    path, root = played
    ours = host_memory_timeline(read_allocator_events(path))
    assert_agrees(ours, xprof_memory_profile(path, root), xprof_shift(path))


def test_played_allocators_give_what_was_played(played):
    path, _ = played
    ours = {a.allocator: a for a in host_memory_timeline(read_allocator_events(path)).allocators}
    hbm = ours["TPU_0_bfc"]
    assert hbm.events == 1500
    assert len(sampled(hbm.timeline)) == XPROF_MAX_SNAPSHOTS
    assert sampled(hbm.timeline)["in_use_bytes"].max() == hbm.peak_bytes  # sampling keeps the peak
    assert hbm.capacity_bytes == 16 * GIB
    assert hbm.lifetime_peak_bytes == 3 * GIB  # set before the capture, above anything in it
    # Everything live at the peak adds up to the peak: heap (attributed + before the capture) + stack.
    assert sum(a.total_bytes for a in hbm.at_peak) == hbm.peak_bytes
    assert ("stack", 64 << 10) in [(a.op, a.total_bytes) for a in hbm.at_peak if not a.attributed]
    assert ours["TPU_1_bfc"].peak_step == 0 and ours["TPU_1_bfc"].events == 40


@pytest.mark.xprof
@pytest.mark.skipif(not REAL.is_dir(), reason="the real captures live in ../shared, absent from a bare clone")
def test_real_single_thread_capture_agrees_with_xprof(tmp_path):
    path = REAL / "jax-gpu-te-fused-attn" / "plugins" / "profile" / "run" / "934987a2fc2f.xplane.pb"
    ours = host_memory_timeline(read_allocator_events(path))
    oracle = xprof_memory_profile(path, tmp_path)
    assert_agrees(ours, oracle, xprof_shift(path))
    (gpu0,) = ours.allocators
    assert (gpu0.allocator, gpu0.peak_bytes, gpu0.events) == ("GPU_0_bfc", 663_228_416, 59)


def _on_one_clock(src: Path, dst: Path) -> Path:
    """`src` with every /host:CPU line's timestamp folded into its events' offsets (all lines at 0):
    the same times, but now XProf's in-line offsets are absolute too."""
    space = XSpace()
    space.ParseFromString(src.read_bytes())
    for plane in space.planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                for ev in line.events:
                    ev.offset_ps += line.timestamp_ns * 1000
                line.timestamp_ns = 0
    dst.write_bytes(space.SerializeToString())
    return dst


@pytest.mark.xprof
@pytest.mark.skipif(not REAL.is_dir(), reason="the real captures live in ../shared, absent from a bare clone")
def test_real_multi_thread_capture_differs_from_xprof_only_by_thread_clock(tmp_path):
    path = REAL / "jax-gpu-conv3d-8gpu" / "plugins" / "profile" / "run" / "tw003.xplane.pb"
    ours = host_memory_timeline(read_allocator_events(path))
    # On one clock, XProf and we agree on everything.
    folded = _on_one_clock(path, tmp_path / "folded.xplane.pb")
    assert_agrees(host_memory_timeline(read_allocator_events(folded)), xprof_memory_profile(folded, tmp_path),
                  xprof_shift(folded))
    # As written, its `python` thread's line starts 868.6 µs before the `py_xla_execute` threads'.
    # XProf orders events by their offset in their own line, so on GPUs 1-7 it places a 655,360-byte
    # allocation made on `python` after the peak, and leaves it out of the live set; by time it
    # came before the peak. The peaks, capacities and lifetime peaks are the same.
    oracle = xprof_memory_profile(path, tmp_path)
    for a in ours.allocators:
        x = oracle["memoryProfilePerAllocator"][a.allocator]["profileSummary"]
        assert a.peak_bytes == int(x["peakStats"]["peakBytesInUse"])
        assert a.capacity_bytes == int(x["memoryCapacity"])
        assert a.lifetime_peak_bytes == int(x["peakBytesUsageLifetime"])
    gpu1 = next(a for a in ours.allocators if a.allocator == "GPU_1_bfc")
    assert (655_360, 1) in [(a.allocation_bytes, a.occurrences) for a in gpu1.at_peak if a.attributed]
    assert (655_360, 1) not in [(r[0], r[2]) for r in _xprof_rows(oracle["memoryProfilePerAllocator"]["GPU_1_bfc"])
                                if r[-1]]


def xprof_shift(path: Path) -> int:
    """What maps our times to XProf's: ours are on the host's time axis (line base + offset), XProf's
    are the offsets in their line, so the shift is minus the base of the allocator lines (one here)."""
    space = XSpace()
    space.ParseFromString(path.read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    ids = {k for k, v in plane.event_metadata.items() if v.name in ("MemoryAllocation", "MemoryDeallocation")}
    (stamp,) = {line.timestamp_ns for line in plane.lines if any(ev.metadata_id in ids for ev in line.events)}
    planes, _ = split_planes(path.read_bytes(), path)
    return -plane_roles(planes, path).axis.base_ps(stamp)


def test_a_capture_without_allocator_events_gives_none(small_capture):
    host = read_allocator_events(next(small_capture.rglob("*.xplane.pb")))
    assert host.events.empty and host_memory_timeline(host).allocators == ()


def test_a_damaged_file_is_one_input_error_naming_it(tmp_path, played):
    path, _ = played
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with pytest.raises(InputError) as err:
        read_allocator_events(bad)
    assert err.value.path == str(bad)


def test_the_front_door_gives_the_same_timelines(played):
    import tpudiag

    path, _ = played
    d = tpudiag.diagnose(path)
    [host] = d.memory_over_time()
    assert [(a.allocator, a.peak_bytes, a.events) for a in host.allocators] == [
        (a.allocator, a.peak_bytes, a.events) for a in host_memory_timeline(read_allocator_events(path)).allocators]


def test_hosts_read_in_parallel_equal_hosts_read_one_by_one_and_a_bad_one_stays_apart(tmp_path):
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    for name in ("a", "b"):
        played_capture(run / f"{name}.xplane.pb")
    (run / "c.xplane.pb").write_bytes(b"\x0a\xff\xff")  # damaged: its own failure
    one, failures_one = capture_memory_timelines(tmp_path / "logdir", jobs=1)
    two, failures_two = capture_memory_timelines(tmp_path / "logdir", jobs=2)
    assert [Path(h.path).name for h in one] == ["a.xplane.pb", "b.xplane.pb"]
    assert [(h.path, [(a.allocator, a.peak_bytes, a.at_peak) for a in h.allocators]) for h in one] == \
        [(h.path, [(a.allocator, a.peak_bytes, a.at_peak) for a in h.allocators]) for h in two]
    assert [Path(f.path).name for f in failures_one] == [Path(f.path).name for f in failures_two] == ["c.xplane.pb"]


def test_gpu_rows_at_the_peak_name_the_jit_function_they_were_made_in():
    """JAX's GPU allocator names no op (`tf_op`): the host events enclosing each allocation on its
    line do. Established by hand from the capture: the 305 MiB allocation at the peak lies inside
    `PjitFunction(loss_fn)` and, innermost, `Build buffer allocations` on the `python3` line."""
    from tests.conftest import REPO
    from tpudiag.analysis.memory_timeline import capture_memory_timelines

    capture = REPO.parent / "shared" / "data" / "real-captures" / "jax-gpu-te-fused-attn"
    if not capture.exists():
        pytest.skip("the shared real captures are not beside the repository")
    [host], _ = capture_memory_timelines(capture)
    [gpu] = [a for a in host.allocators if a.allocator == "GPU_0_bfc"]
    top = max((r for r in gpu.at_peak if r.attributed), key=lambda r: r.total_bytes)
    assert top.allocation_bytes == 319_293_440
    assert top.annotation == "PjitFunction(loss_fn) › Build buffer allocations"
