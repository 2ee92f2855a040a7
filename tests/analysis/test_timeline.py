"""Step timelines: lanes, spans, gaps and in-flight windows of the small 2-chip design, and rasterizing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import US, small_design
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.analysis.timeline import (COLLECTIVE, COMPUTE, IDLE, KINDS, OUTSIDE, Gap, Lane, Span, find_on_timeline,
                                       name_labels, rasterize, rasterize_in_flight, span_cells, step_numbers,
                                       step_timeline)
from tpudiag.parsers.capture import load_capture
import pytest


@pytest.fixture
def analysis(write_design):
    return analyze(load_capture(write_design(small_design())))


def test_lanes_one_per_core_with_the_steps_breakdown(analysis):
    t = step_timeline(analysis, 2)
    assert t.step == 2 and t.steps == (1, 2, 3, 4, 5)
    assert [lane.label for lane in t.lanes] == ["host0 TPU:0", "host0 TPU:1"]
    for lane in t.lanes:
        assert lane.dur_ps == 10_000 * US == t.span_ps
        assert lane.busy_ps + lane.idle_ps == lane.dur_ps
        assert sum(g.dur_ps for g in lane.gaps) == lane.idle_ps  # invariant: gaps are exactly the idle time


def test_chip0_spans_gaps_and_async_window(analysis):
    lane = step_timeline(analysis, 1).lanes[0]
    # Top level only: fusion.5 is nested inside while.1 and is not a span of its own.
    assert [s.name for s in lane.spans] == ["fusion.1", "all-gather-start.1", "fusion.3", "all-gather-done.1",
                                            "while.1", "all-reduce.2", "copy.1"]
    assert lane.spans[3] == Span(4010 * US, 300 * US, "all-gather-done.1", COLLECTIVE)
    assert lane.collective_ps == (10 + 300 + 500) * US  # start, exposed done tail, sync all-reduce
    assert lane.gaps[0] == Gap(7200 * US, 2800 * US)  # longest first: after copy.1 to the step end
    assert sorted(g.dur_ps for g in lane.gaps) == [90 * US, 100 * US, 1000 * US, 2800 * US]
    assert len(lane.in_flight) == 1 and lane.in_flight[0].offset_ps == 3000 * US
    assert lane.in_flight_ps == 1310 * US  # all-gather-start.1 begins to all-gather-done.1 ends


def test_chip1_waits_longer_in_the_all_reduce(analysis):
    lanes = step_timeline(analysis, 1).lanes
    assert lanes[1].collective_ps - lanes[0].collective_ps == 300 * US


def test_rasterize_one_ms_cells(analysis):
    lane = step_timeline(analysis, 1).lanes[0]
    cells = rasterize(lane, 10, 10_000 * US)
    # cell 4: the 300 µs all-gather wait covers 30 % of the cell, over the 25 % collective threshold;
    # cell 5: all-reduce 500 µs beats while.1 400 µs; cell 7: 200 µs copy, 800 µs idle.
    assert cells == (COMPUTE, COMPUTE, COMPUTE, COMPUTE, COLLECTIVE, COLLECTIVE, IDLE, IDLE, IDLE, IDLE)
    flight = rasterize_in_flight(lane, 10, 10_000 * US)
    assert flight == (False, False, False, True, True, False, False, False, False, False)


def test_rasterize_marks_cells_past_a_shorter_step_outside():
    lane = Lane("h", "/device:TPU:0", 0, 0, 500, 500, 500, 0, 0, 0, 0, (Span(0, 500, "x", COMPUTE),), (), ())
    assert rasterize(lane, 4, 1000) == (COMPUTE, COMPUTE, OUTSIDE, OUTSIDE)
    assert rasterize(lane, 0, 1000) == ()
    assert rasterize(lane, 3, 0) == (OUTSIDE,) * 3


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 300), offsets=st.lists(st.tuples(st.integers(0, 999), st.integers(1, 400)), max_size=8))
def test_rasterize_gives_one_known_kind_per_cell(width, offsets):
    spans = tuple(Span(o, min(d, 1000 - o), f"op{i}", KINDS[i % 3]) for i, (o, d) in enumerate(sorted(offsets)))
    lane = Lane("h", "/device:TPU:0", 0, 0, 1000, 0, 0, 0, 0, 0, 0, spans, (), ())
    cells = rasterize(lane, width, 1000)
    assert len(cells) == width and set(cells) <= set(KINDS)
    if not spans:
        assert set(cells) == {IDLE}


def test_step_navigation(analysis):
    t = step_timeline(analysis)
    assert t.step == 1 and t.neighbour(-1) is None and t.neighbour(1) == 2
    assert step_timeline(analysis, 5).neighbour(1) is None
    with pytest.raises(ValueError, match="step 99 is not in the capture; steps are 1..5"):
        step_timeline(analysis, 99)


def test_no_steps_no_timeline(write_design):
    # Neither a Steps line nor XLA Modules executions: nothing defines a step.
    analysis = analyze(load_capture(write_design(small_design(steps_line=False, modules_line=False))))
    assert step_numbers(analysis) == ()
    assert step_timeline(analysis) is None


def _lane_of(spans) -> Lane:
    return Lane("h", "/device:TPU:0", 0, 0, 1000, 0, 0, 0, 0, 0, 0, tuple(spans), (), ())


def test_op_names_are_placed_only_where_they_fit():
    lane = _lane_of([Span(0, 500, "fusion.1", COMPUTE), Span(500, 30, "copy.2", COMPUTE),
                     Span(530, 470, "all-reduce.3", COLLECTIVE)])
    labels = name_labels(lane, 100, 1000)
    # 50 cells for fusion.1, 3 for copy.2 (too few for 6 letters and a space), 47 for all-reduce.3
    assert [(label.cell, label.text, label.span) for label in labels] == [(0, "fusion.1", 0), (53, "all-reduce.3", 2)]
    assert name_labels(lane, 10, 1000) == ()  # 5 cells: no name fits


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.text(min_size=1, max_size=12)), min_size=1, max_size=12),
       st.integers(5, 200))
def test_op_name_labels_never_overlap_and_stay_inside_their_span(ops, width):
    spans, t = [], 0
    for dur, name in ops:
        spans.append(Span(t, dur, name, COMPUTE))
        t += dur
    lane = _lane_of(spans)
    labels = name_labels(lane, width, t)
    ends = [label.cell + len(label.text) for label in labels]
    assert all(e < label.cell for e, label in zip(ends, labels[1:]))
    for label in labels:
        lo, hi = span_cells(spans[label.span], width, t)
        assert lo <= label.cell and label.cell + len(label.text) <= hi - 1  # a cell to spare


def test_a_findings_op_is_found_on_the_timeline(analysis):
    first = step_timeline(analysis).lanes[0].spans[1].name
    place = find_on_timeline(analysis, (first,))
    assert place is not None and step_timeline(analysis, place.step).lanes[place.lane].spans[place.span].name == first
    assert find_on_timeline(analysis, ("no-such-op",)) is None


def test_neighbours_of_a_middle_step():
    from tpudiag.analysis.timeline import StepTimeline

    t = StepTimeline(step=2, steps=(1, 2, 3), lanes=(), span_ps=0)
    assert (t.neighbour(-1), t.neighbour(1), t.neighbour(-2), t.neighbour(2)) == (1, 3, None, None)


def _flight_lane(flights) -> Lane:
    from tpudiag.analysis.timeline import InFlight

    return Lane("h", "/device:TPU:0", 0, 0, 1000, 0, 0, 0, 0, 0, 0, (),
                tuple(InFlight(o, d, "all-gather-start.1", "all-gather") for o, d in flights), ())


def test_in_flight_cells_edges():
    # four cells of 250 ps; a window [600, 601) covers 1 ps of cell 2: in flight there
    assert rasterize_in_flight(_flight_lane([(600, 1)]), 4, 1000) == (False, False, True, False)
    assert rasterize_in_flight(_flight_lane([(0, 1)]), 1, 1) == (True,)  # one cell of 1 ps
    assert rasterize_in_flight(_flight_lane([]), 3, 1000) == (False, False, False)
    assert rasterize_in_flight(_flight_lane([(0, 1000)]), 0, 1000) == ()


def test_rasterize_edges_of_one_picosecond_cells():
    # a 4 ps lane drawn 4 cells wide: compute [0, 1) and a collective [2, 3); the cells start at 0
    lane = Lane("h", "/device:TPU:0", 0, 0, 4, 2, 1, 1, 0, 2, 0,
                (Span(0, 1, "fusion.1", COMPUTE), Span(2, 1, "all-reduce.1", COLLECTIVE)), (), ())
    assert rasterize(lane, 4, 4) == (COMPUTE, IDLE, COLLECTIVE, IDLE)
    one = Lane("h", "/device:TPU:0", 0, 0, 1, 1, 1, 0, 0, 0, 0, (Span(0, 1, "fusion.1", COMPUTE),), (), ())
    assert rasterize(one, 1, 1) == (COMPUTE,)  # a span of 1 ps is a span


# ---- a timeline of hosts and steps built by hand ------------------------------------------------

def _analysis(lanes: dict[str, list[tuple[int, int, int, list[tuple]]]], windows=None, breakdown=(0, 0, 0, 0, 0),
              dur_ps: int = 100):
    """An analysis-like value of hosts -> [(core, step, step start, [(op, category, start, end[, depth[,
    device]])])]: the steps table (every step `dur_ps` long, with `breakdown` as its busy, compute,
    collective, I/O and idle) and each host's events and async windows (`windows`: host ->
    [(core, name, family, start, end)]), all that `step_timeline` reads."""
    from types import SimpleNamespace

    import numpy as np

    from tpudiag.model import schemas

    hosts, step_rows = [], []
    for host, rows in lanes.items():
        ev = [(core, *op) for core, _, _, ops in rows for op in ops]
        n = len(ev)
        depth = [x[5] if len(x) > 5 else 0 for x in ev]
        device = [x[6] if len(x) > 6 else f"/device:TPU:{x[0]}" for x in ev]
        events = schemas.EVENTS.frame({
            "host": [host] * n, "device": device, "core": [c for c, *_ in ev],
            "chip": [c for c, *_ in ev], "program_id": [1] * n, "module": ["m"] * n,
            "name": [x[1] for x in ev], "category": [x[2] for x in ev], "start_ps": [x[3] for x in ev],
            "dur_ps": [x[4] - x[3] for x in ev], "self_ps": [x[4] - x[3] for x in ev], "depth": depth,
            "step": [0] * n})
        w = (windows or {}).get(host, [])
        async_windows = schemas.ASYNC_WINDOWS.frame({
            "host": [host] * len(w), "device": [f"/device:TPU:{x[0]}" for x in w], "core": [x[0] for x in w],
            "name": [x[1] for x in w], "family": [x[2] for x in w], "start_ps": [x[3] for x in w],
            "end_ps": [x[4] for x in w], "source": ["start/done pair"] * len(w)})
        hosts.append(SimpleNamespace(host=host, events=events, async_windows=async_windows))
        step_rows += [(host, core, step, start) for core, step, start, _ in rows]
    n = len(step_rows)
    busy, compute, collective, io, idle = (np.full(n, v, dtype=np.int64) for v in breakdown)
    steps = schemas.STEPS.frame({
        "host": [r[0] for r in step_rows], "device": [f"/device:TPU:{r[1]}" for r in step_rows],
        "core": [r[1] for r in step_rows], "step": [r[2] for r in step_rows], "start_ps": [r[3] for r in step_rows],
        "dur_ps": np.full(n, dur_ps), "busy_ps": busy, "compute_ps": compute, "collective_ps": collective,
        "io_ps": io, "host_transfer_ps": np.zeros(n, dtype=np.int64), "idle_ps": idle})
    return SimpleNamespace(steps=steps, profile=SimpleNamespace(hosts=hosts))


def test_an_op_is_found_in_the_first_step_that_runs_it_on_the_host_asked():
    from tpudiag.analysis.timeline import OpPlace

    fusion = ("fusion.1", "loop fusion", 0, 10)
    analysis = _analysis({
        # h0 runs fusion.1 in step 1 and fusion.2 in step 2 only; h1 runs fusion.1 in both steps
        "h0": [(0, 1, 0, [fusion]), (0, 2, 100, [("fusion.2", "loop fusion", 120, 130)])],
        "h1": [(0, 1, 0, [("copy.1", "copy", 0, 5), fusion]), (0, 2, 100, [("fusion.1", "loop fusion", 100, 110)])]})
    assert find_on_timeline(analysis, ("fusion.2",)) == OpPlace(2, 0, 0)
    # on h1: its lane (index 1) of the first step, after copy.1 (span 1)
    assert find_on_timeline(analysis, ("fusion.1",), host="h1") == OpPlace(1, 1, 1)
    assert find_on_timeline(analysis, ("fusion.2",), host="h1") is None


def test_the_search_stops_after_max_steps():
    from tpudiag.analysis.timeline import OpPlace

    rows = [(0, step, 100 * step, [("fusion.1", "loop fusion", 100 * step, 100 * step + 10)]) for step in range(9)]
    rows[8][3].append(("late.1", "loop fusion", 820, 830))  # only in the ninth step
    analysis = _analysis({"h0": rows})
    assert find_on_timeline(analysis, ("late.1",)) is None  # 8 steps by default
    assert find_on_timeline(analysis, ("late.1",), max_steps=9) == OpPlace(8, 0, 1)


def test_lanes_in_host_order_then_core_and_hosts_without_the_step_left_out():
    analysis = _analysis({
        "hb": [(1, 1, 0, []), (0, 1, 0, [])],
        "ha": [(0, 1, 0, []), (0, 2, 100, [])],  # ha comes second in the profile: its lanes come second
        "hc": [(0, 2, 100, [])]})  # no step 1
    t = step_timeline(analysis, 1)
    assert [(lane.host, lane.core) for lane in t.lanes] == [("hb", 0), ("hb", 1), ("ha", 0)]
    assert t.steps == (1, 2) and t.span_ps == 100
    assert [(lane.host, lane.core) for lane in step_timeline(analysis, 2).lanes] == [("ha", 0), ("hc", 0)]


def test_a_lane_clips_its_top_level_ops_and_windows_to_the_step():
    from tpudiag.analysis.timeline import IO, InFlight

    # core 3's step 7 runs [1000, 1100); offsets below are from 1000
    ops = [
        ("fusion.9", "loop fusion", 980, 1000),  # ends as the step starts: not in it
        ("outfeed.1", "outfeed", 1090, 1130),  # I/O by its category, clipped at the step end: [90, 100)
        ("fusion.1", "loop fusion", 990, 1020),  # began before the step: [0, 20)
        ("fusion.2", "loop fusion", 1030, 1040, 1),  # nested: inside its parent's span already
        ("all-reduce.1", "all-reduce", 1040, 1060),  # a collective by its name
        ("fusion.3", "loop fusion", 1060, 1070, 0, "/device:TPU:3 SparseCore 0"),  # another plane
        ("fusion.4", "loop fusion", 1100, 1110),  # starts as the step ends: not in it
    ]
    windows = {"h": [(3, "all-gather-start.1", "all-gather", 950, 1030),  # clipped: [0, 30)
                     (3, "all-gather-start.2", "all-gather", 1020, 1050),  # [20, 50): the union is 50
                     (3, "copy-start.1", "copy", 900, 1000),  # ends as the step starts
                     (3, "copy-start.2", "copy", 1100, 1200),  # starts as it ends
                     (2, "copy-start.3", "copy", 1000, 1100)]}  # another core
    analysis = _analysis({"h": [(3, 7, 1000, ops)]}, windows, breakdown=(11, 12, 13, 14, 15))
    (lane,) = step_timeline(analysis, 7).lanes
    assert lane.spans == (Span(0, 20, "fusion.1", COMPUTE), Span(40, 20, "all-reduce.1", COLLECTIVE),
                          Span(90, 10, "outfeed.1", IO))
    assert lane.in_flight == (InFlight(0, 30, "all-gather-start.1", "all-gather"),
                              InFlight(20, 30, "all-gather-start.2", "all-gather"))
    assert lane.in_flight_ps == 50
    # the step's own figures, as the steps table gives them
    assert (lane.host, lane.device, lane.core, lane.step_start_ps, lane.dur_ps) == ("h", "/device:TPU:3", 3, 1000, 100)
    assert (lane.busy_ps, lane.compute_ps, lane.collective_ps, lane.io_ps, lane.idle_ps) == (11, 12, 13, 14, 15)
    # gaps between the spans, longest first: [60, 90) 30, [20, 40) 20
    assert lane.gaps == (Gap(60, 30), Gap(20, 20))


def test_a_lane_whose_first_op_starts_late_has_a_lead_gap():
    analysis = _analysis({"h": [(0, 1, 0, [("fusion.1", "loop fusion", 5, 95)])]})
    (lane,) = step_timeline(analysis, 1).lanes
    assert lane.gaps == (Gap(0, 5), Gap(95, 5))  # equal lengths: the earlier first


def test_a_collective_at_exactly_a_quarter_of_a_cell_shows():
    # one cell of 8 ps: compute [0, 6), a collective [6, 8) covers exactly 25 %
    lane = Lane("h", "/device:TPU:0", 0, 0, 8, 8, 6, 2, 0, 0, 0,
                (Span(0, 6, "fusion.1", COMPUTE), Span(6, 2, "all-reduce.1", COLLECTIVE)), (), ())
    assert rasterize(lane, 1, 8) == (COLLECTIVE,)


def test_a_cell_takes_the_kind_covering_most_of_it_idle_included():
    from tpudiag.analysis.timeline import IO

    def cell(*spans) -> str:
        lane = Lane("h", "/device:TPU:0", 0, 0, 8, 0, 0, 0, 0, 0, 0, tuple(spans), (), ())
        (kind,) = rasterize(lane, 1, 8)
        return kind

    # 8 ps: I/O 4, idle 4: a tie goes to the earlier kind (compute, collective, I/O, idle)
    assert cell(Span(0, 4, "outfeed.1", IO)) == IO
    # compute 4, a collective of 1 (12.5 %, under the quarter), idle 3: compute
    assert cell(Span(0, 4, "fusion.1", COMPUTE), Span(4, 1, "all-reduce.1", COLLECTIVE)) == COMPUTE
    # compute 3, I/O 1, idle 4: idle
    assert cell(Span(0, 3, "fusion.1", COMPUTE), Span(3, 1, "outfeed.1", IO)) == IDLE


def test_a_dropped_hosts_events_are_read_again_and_the_last_four_kept(monkeypatch):
    from collections import OrderedDict
    from types import SimpleNamespace

    import tpudiag.analysis.timeline as timeline
    from tpudiag.errors import InputError
    from tpudiag.model.profile import HostFailure

    reads = []

    def parse(location):
        reads.append(str(location))
        if "bad" in str(location):
            return HostFailure(str(location), "truncated file")
        return SimpleNamespace(events=f"events of {location}", async_windows=f"windows of {location}")

    monkeypatch.setattr(timeline, "parse_file_or_failure", parse)
    monkeypatch.setattr(timeline, "_reread", OrderedDict())
    kept = SimpleNamespace(events="own events", async_windows="own windows", source="", path="kept.pb")
    assert timeline.host_events(kept) == ("own events", "own windows") and reads == []

    def dropped(name: str, source: str = ""):
        return SimpleNamespace(events=None, async_windows=None, source=source, path=name)

    # read from `source` when the host has one (an absolute path), else from its path
    assert timeline.host_events(dropped("a.pb", "/abs/a.pb")) == ("events of /abs/a.pb", "windows of /abs/a.pb")
    for name in ("b.pb", "c.pb", "d.pb"):
        timeline.host_events(dropped(name))
    timeline.host_events(dropped("a.pb", "/abs/a.pb"))  # kept: not read again, and now the most recent
    assert reads == ["/abs/a.pb", "b.pb", "c.pb", "d.pb"]
    timeline.host_events(dropped("e.pb"))  # a fifth host: the least recent (b) goes
    timeline.host_events(dropped("a.pb", "/abs/a.pb"))
    timeline.host_events(dropped("b.pb"))
    assert reads == ["/abs/a.pb", "b.pb", "c.pb", "d.pb", "e.pb", "b.pb"]
    with pytest.raises(InputError, match="^cannot read the host again for its timeline: truncated file$"):
        timeline.host_events(dropped("bad.pb"))


def test_span_cells_edges():
    s = Span(0, 1, "x", COMPUTE)
    assert span_cells(s, 5, 0) == (0, 0) and span_cells(s, 0, 1000) == (0, 0)  # nothing to draw on
    assert span_cells(s, 4, 1) == (0, 4)  # a lane of 1 ps: the span is all of it
    assert span_cells(Span(0, 500, "x", COMPUTE), 1, 1000) == (0, 1)  # one cell
    assert span_cells(s, 4, 3) == (0, 2)  # 4/3 of a cell: rounded up to 2
    assert span_cells(Span(1000, 0, "x", COMPUTE), 4, 1000) == (3, 4)  # at the very end: the last cell
    assert span_cells(Span(500, 0, "x", COMPUTE), 4, 1000) == (2, 3)  # no time: still one cell


def test_a_name_that_fits_exactly_and_the_next_one_cell_after_it():
    # two spans of 5 cells each (100 ps a cell): 4 letters and a spare cell fill each exactly
    lane = _lane_of([Span(0, 500, "abcd", COMPUTE), Span(500, 500, "efgh", COMPUTE)])
    assert [(label.cell, label.text) for label in name_labels(lane, 10, 1000)] == [(0, "abcd"), (5, "efgh")]
