"""The allocator events' two readers: from wire bytes (`_wire.decode_stats`) and through protobuf.

For any line, the wire reader gives what the protobuf reference gives, or declines (then the
reference reads the line); it never differs. Checked on the lines of a played capture and of the
real GPU captures, on hand-made edge cases of how stats can be written, and on mutated lines.
What the stats mean (XProf's readings of them), damaged files and epoch clocks are checked on
whichever reader is there.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SHARED
from tests.memory_captures import played_capture
from tpudiag.errors import InputError
from tpudiag.parsers import event_wire
from tpudiag.parsers.allocator_events import _line_from_protobuf, _line_from_wire, _Plane, read_allocator_events
from tpudiag.parsers.event_wire import RawLine
from tpudiag.proto import XLine, XSpace
from tpudiag.writers.allocator_trace import TracedAllocator, write_allocator_line
from tpudiag.writers.xspace_builder import U64, Ref, XSpaceBuilder

needs_wire = pytest.mark.skipif(
    not (event_wire.available() and hasattr(event_wire._wire, "decode_stats"))
    and not os.environ.get("TPUDIAG_REQUIRE_WIRE"),
    reason="the compiled event reader `tpudiag.parsers._wire` is not built here, or was built before "
           "decode_stats (rebuild: `python setup.py build_ext --inplace`)")

REAL = sorted((SHARED / "data" / "real-captures").rglob("*.xplane.pb"))


def _host_lines(path: Path) -> tuple[_Plane, list[bytes]]:
    space = XSpace()
    space.ParseFromString(path.read_bytes())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    kinds = {mid: md.name == "MemoryAllocation" for mid, md in plane.event_metadata.items()
             if md.name in ("MemoryAllocation", "MemoryDeallocation")}
    return (_Plane(kinds, {sid: md.name for sid, md in plane.stat_metadata.items()}),
            [line.SerializeToString() for line in plane.lines])


def _equal(a: dict, b: dict) -> bool:
    """Equal values and dtypes, column by column (NaN equal to NaN)."""
    def same(x, y) -> bool:
        if not isinstance(x, np.ndarray):
            return x == y
        if x.dtype != y.dtype or len(x) != len(y):
            return False
        return list(x) == list(y) if x.dtype == object else np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def _assert_same(data: bytes, plane: _Plane) -> str:
    """'wire' when the wire reader read the line (and agreed), else 'declined'."""
    try:
        ref = ("ok", _line_from_protobuf(RawLine(data), plane))
    except (InputError, DecodeError, OverflowError) as exc:
        ref = ("error", type(exc).__name__)
    try:
        wire = _line_from_wire(RawLine(data), plane)
    except InputError:
        wire = None  # the line header itself did not read: both readers fail alike
    if wire is None:
        return "declined"
    assert ref[0] == "ok", f"the wire reader read a line protobuf rejects ({ref[1]})"
    assert _equal(wire, ref[1])
    return "wire"


@needs_wire
@pytest.mark.parametrize("source", ["played", *[p.parent.parent.parent.parent.name for p in REAL]])
def test_lines_of_captures_read_the_same_both_ways(source, tmp_path):
    path = (played_capture(tmp_path / "h.xplane.pb") if source == "played"
            else next(p for p in REAL if p.parent.parent.parent.parent.name == source))
    plane, lines = _host_lines(path)
    assert {_assert_same(data, plane) for data in lines} == {"wire"}


@needs_wire
def test_whole_file_reads_the_same_with_and_without_the_wire_reader(tmp_path, monkeypatch):
    path = played_capture(tmp_path / "h.xplane.pb")
    wire = read_allocator_events(path).events
    monkeypatch.setenv("TPUDIAG_NO_WIRE", "1")
    pd.testing.assert_frame_equal(read_allocator_events(path).events, wire)


def _edge_capture(path: Path) -> Path:
    """Stats written every way a producer may: refs and inline strings, uint64 past int64, an
    integer memory id, repeated stats (the last wins), two metadata entries with one name, a
    double written as an integer, a stat without a value, num_occurrences in place of offset_ps."""
    space = XSpaceBuilder("h")
    plane = space.plane("/host:CPU", 1)
    line = plane.line("t", 1, 123)
    alloc, free = plane.event_metadata("MemoryAllocation"), plane.event_metadata("MemoryDeallocation")
    other = plane.event_metadata("PjitFunction(f)")
    line.event(alloc, 10, 0, {"allocator_name": Ref("HBM_0"), "bytes_allocated": 4096, "addr": U64((1 << 64) - 5),
                              "tf_op": "jit(f)/add", "shape": Ref("[8,128]"), "fragmentation": 0.25})
    line.event(other, 11, 5, {"bytes_allocated": 99})  # not an allocator event: never read
    line.event(alloc, 20, 0, {"device_ordinal": 3, "bytes_allocated": U64(8192), "bytes_allocated#2": 1,
                              "fragmentation": 7, "group_id": 4})
    line.event(free, 30, 0, {"index_on_host": 1, "allocator_name": "HBM_1", "region_type": "temp"})
    line.event(free, 40, 0, {"allocator_name": "HBM_1", "index_on_host": 2, "bytes_allocated": 5})
    line.proto.events[-1].stats.add(metadata_id=plane.stat_id("bytes_allocated"))  # a stat with no value: 0
    line.event(alloc, 50, 0, {"allocator_name": "HBM_0", "allocation_bytes": 256})
    line.proto.events[-1].stats.add(metadata_id=plane.stat_id("allocation_bytes"), int64_value=512)  # last wins
    line.proto.events[-1].ClearField("offset_ps")
    line.proto.events[-1].num_occurrences = 2
    # A second stat metadata named like the first: both feed the column, the later one wins.
    plane.proto.stat_metadata[plane.stat_id("bytes_allocated#2")].name = "bytes_allocated"
    return space.write(path)


@needs_wire
def test_edge_cases_read_the_same_both_ways(tmp_path):
    plane, lines = _host_lines(_edge_capture(tmp_path / "e.xplane.pb"))
    assert [_assert_same(data, plane) for data in lines] == ["wire"]


def test_edge_cases_read_as_xprof_would(tmp_path):
    ev = read_allocator_events(_edge_capture(tmp_path / "e.xplane.pb")).events
    assert list(ev["allocator"]) == ["HBM_0", "3", "HBM_1", "2", "HBM_0"]  # the last memory-id stat wins
    assert list(ev["heap_bytes"]) == [4096, 1, 0, 0, 0]
    assert ev["address"].iat[0] == -5  # uint64 read as the same 64 bits, signed, as XProf's IntValue
    assert list(ev["fragmentation"]) == [0.25, 0.0, 0.0, 0.0, 0.0]
    assert list(ev["step_id"]) == [-1, 4, -1, -1, -1]
    assert list(ev["op"])[0] == "jit(f)/add" and list(ev["shape"])[0] == "[8,128]"
    assert ev["allocation_bytes"].iat[4] == 512
    assert list(ev["allocation"]) == [True, True, False, False, True]
    assert list(ev["time_ps"]) == [10, 20, 30, 40, 0]  # num_occurrences: no offset, at the line's start


@needs_wire
def test_mutated_lines_never_read_differently(tmp_path):
    plane, lines = _host_lines(played_capture(tmp_path / "h.xplane.pb"))
    rng = random.Random(3)
    line = XLine()
    line.ParseFromString(max(lines, key=len))
    del line.events[30:]  # a short line, so that each mutation is quick to read both ways
    source = line.SerializeToString()
    outcomes = []
    for _ in range(1500):
        mutated = bytearray(source)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        outcomes.append(_assert_same(bytes(mutated), plane))
    assert "wire" in outcomes  # many mutations leave a readable line; those must agree


def test_damaged_files_are_an_input_error_or_read_never_another_exception(tmp_path):
    source = played_capture(tmp_path / "h.xplane.pb").read_bytes()
    rng = random.Random(11)
    bad = tmp_path / "bad.xplane.pb"
    for _ in range(200):
        data = bytearray(source)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data))]
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        bad.write_bytes(bytes(data))
        try:
            read_allocator_events(bad)
        except InputError as exc:
            assert exc.path == str(bad)


def test_lines_on_an_epoch_clock_are_placed_on_the_host_time_axis(tmp_path):
    # Host lines may carry epoch timestamps (~1.76e18 ns): their picoseconds do not fit int64.
    alloc = TracedAllocator("HBM_0", 1 << 30)
    address = alloc.allocate(5_000, 4096)
    alloc.free(9_000, address)
    space = XSpaceBuilder("h")
    plane = space.plane("/host:CPU", 1)
    epoch_ns = 1_764_000_000_000_000_000
    write_allocator_line(plane, "a", 1, 0, [r for r in alloc.records if r.allocation])  # at 5,000 ps
    write_allocator_line(plane, "b", 2, 0, [r for r in alloc.records if not r.allocation])  # at 9,000 ps
    plane.proto.lines[0].timestamp_ns = epoch_ns
    plane.proto.lines[1].timestamp_ns = epoch_ns + 1  # 1 ns later: the free comes 5,000 ps after the allocation
    ev = read_allocator_events(space.write(tmp_path / "e.xplane.pb")).events
    assert list(ev["time_ps"]) == [5_000, 10_000]  # from the earliest line: a host-only file's axis


def test_an_epoch_line_beside_a_relative_one_is_rebased_on_profile_start_time(tmp_path):
    # TSL made one thread's line relative to the profile start and left another on the epoch clock.
    alloc = TracedAllocator("HBM_0", 1 << 30)
    address = alloc.allocate(5_000, 4096)
    alloc.free(9_000, address)
    start_ns = 1_764_000_000_000_000_000
    space = XSpaceBuilder("h")
    space.plane("Task Environment", 2).set_stat("profile_start_time", U64(start_ns))
    plane = space.plane("/host:CPU", 1)
    write_allocator_line(plane, "epoch", 1, 0, [r for r in alloc.records if r.allocation])
    write_allocator_line(plane, "relative", 2, 0, [r for r in alloc.records if not r.allocation])
    plane.proto.lines[0].timestamp_ns = start_ns + 3  # 3 ns after the profile started
    plane.proto.lines[1].timestamp_ns = 10  # 10 ns after it
    host = read_allocator_events(space.write(tmp_path / "m.xplane.pb"))
    assert host.warnings == ()
    assert list(host.events["time_ps"]) == [3_000 + 5_000 - 3_000, 10_000 + 9_000 - 3_000]


def _one_stat_events(path: Path, values: list[int], n_names: int = 1) -> Path:
    """Allocation events of HBM_0, each with `bytes_allocated` = its value; with `n_names` > 1 that
    many stat metadata entries are all named `bytes_allocated`, event i using entry i mod n."""
    space = XSpaceBuilder("h")
    plane = space.plane("/host:CPU", 1)
    line = plane.line("t", 1, 0)
    alloc = plane.event_metadata("MemoryAllocation")
    names = ["bytes_allocated"] + [f"bytes_allocated#{i}" for i in range(1, n_names)]
    for i, value in enumerate(values):
        line.event(alloc, 10 * (i + 1), 0, {"allocator_name": Ref("HBM_0"), names[i % n_names]: value,
                                            "bytes_available": 1 << 30})
    for name in names[1:]:
        plane.proto.stat_metadata[plane.stat_id(name)].name = "bytes_allocated"
    return space.write(path)


@pytest.mark.parametrize("bad", [(1 << 63) - 1, -1, U64((1 << 64) - 1), 1 << 51])
def test_impossible_byte_counts_are_dropped_with_a_warning_naming_the_count(tmp_path, bad):
    # Regression (issue 33): bytes_allocated = INT64_MAX printed "peak in use -2 B" (bytes_reserved
    # added to it wrapped), a negative one a negative peak.
    from tpudiag.analysis.memory_timeline import host_memory_timeline

    host = read_allocator_events(_one_stat_events(tmp_path / "h.xplane.pb", [4096, bad, bad, 8192]))
    assert list(host.events["heap_bytes"]) == [4096, 8192]
    assert any(w.startswith("2 allocator events dropped: a byte count negative") for w in host.warnings)
    [timeline] = host_memory_timeline(host).allocators
    assert timeline.peak_bytes == 8192 and timeline.capacity_bytes == 8192 + (1 << 30)


def test_many_stat_entries_of_one_name_cost_the_stats_not_events_times_entries(tmp_path, monkeypatch):
    # Regression (issue 33): 20,000 events with 2,000 stat metadata entries all named
    # `bytes_allocated` (341 KB) took 8.5 s and 1.75 GB: the wire reader keeps a column per stat id
    # for every event. Past a few ids per read name the line is read through protobuf instead.
    widths = []
    real = event_wire.decode_stats
    monkeypatch.setattr(event_wire, "decode_stats", lambda line, ids: widths.append(len(ids)) or real(line, ids))
    n_events, n_names = 4000, 400
    path = _one_stat_events(tmp_path / "h.xplane.pb", list(range(n_events)), n_names)
    host = read_allocator_events(path)
    assert list(host.events["heap_bytes"]) == list(range(n_events))
    assert all(w <= 40 for w in widths)  # never 400 columns per event


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                                 st.sampled_from([0, -1, (1 << 63) - 1, 1 << 50, (1 << 50) + 1])),
                       min_size=1, max_size=12),
       n_names=st.integers(1, 3))
def test_allocator_figures_are_never_negative_or_wrapped(tmp_path, values, n_names):
    # Property: whatever the byte stats, every figure the timeline shows is a plausible byte count.
    from tpudiag.analysis.memory_timeline import host_memory_timeline

    host = read_allocator_events(_one_stat_events(tmp_path / "p.xplane.pb", values, n_names))
    for t in host_memory_timeline(host).allocators:
        assert 0 <= t.peak_bytes <= t.capacity_bytes < 1 << 63
        assert t.peak_heap_bytes >= 0 and t.peak_stack_bytes >= 0
        assert all(a.allocation_bytes >= 0 and a.total_bytes >= 0 for a in t.at_peak)
