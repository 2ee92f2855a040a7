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

def _analysis(lanes: dict[str, list[tuple[int, int, int, list[tuple[str, str, int, int]]]]]):
    """An analysis-like value of hosts -> [(core, step, step start, [(op, category, start, end)])]: the
    steps table and each host's top-level events, all that `step_timeline` reads."""
    from types import SimpleNamespace

    import numpy as np

    from tpudiag.model import schemas

    hosts, step_rows = [], []
    for host, rows in lanes.items():
        ev = [(core, name, cat, s, e) for core, _, _, ops in rows for name, cat, s, e in ops]
        n = len(ev)
        events = schemas.EVENTS.frame({
            "host": [host] * n, "device": [f"/device:TPU:{c}" for c, *_ in ev], "core": [c for c, *_ in ev],
            "chip": [c for c, *_ in ev], "program_id": [1] * n, "module": ["m"] * n,
            "name": [x[1] for x in ev], "category": [x[2] for x in ev], "start_ps": [x[3] for x in ev],
            "dur_ps": [x[4] - x[3] for x in ev], "self_ps": [x[4] - x[3] for x in ev], "depth": [0] * n,
            "step": [0] * n})
        hosts.append(SimpleNamespace(host=host, events=events, async_windows=schemas.ASYNC_WINDOWS.empty()))
        step_rows += [(host, core, step, start) for core, step, start, _ in rows]
    n = len(step_rows)
    zeros = np.zeros(n, dtype=np.int64)
    steps = schemas.STEPS.frame({
        "host": [r[0] for r in step_rows], "device": [f"/device:TPU:{r[1]}" for r in step_rows],
        "core": [r[1] for r in step_rows], "step": [r[2] for r in step_rows], "start_ps": [r[3] for r in step_rows],
        "dur_ps": np.full(n, 100), "busy_ps": zeros, "compute_ps": zeros, "collective_ps": zeros, "io_ps": zeros,
        "host_transfer_ps": zeros, "idle_ps": zeros})
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
