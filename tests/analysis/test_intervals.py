from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpudiag.model.intervals import count_at_or_before, covered, merge, nest, nest_walk, union_length


def test_nest_subtracts_direct_children_only():
    # while [0,100) holds fusion [10,60) which holds a tiny op [20,30); then a sibling [100,120).
    start = np.array([0, 10, 20, 100], dtype=np.int64)
    dur = np.array([100, 50, 10, 20], dtype=np.int64)
    self_ps, depth, partial = nest(start, dur)
    assert self_ps.tolist() == [50, 40, 10, 20]
    assert depth.tolist() == [0, 1, 2, 0]
    assert partial == 0


def test_nest_is_exact_ten_hours_into_a_capture():
    # At 2^55 ps (10 hours) a float64 holds only every 8th ps: a 1 ps op starting 9 ps into a 10 ps
    # parent would start where the parent ends (both round to t + 8). In int64 ps it nests: the
    # parent keeps 9 ps.
    t = 2**55
    self_ps, depth, partial = nest(np.array([t, t + 9], dtype=np.int64), np.array([10, 1], dtype=np.int64))
    assert self_ps.tolist() == [9, 1] and depth.tolist() == [0, 1] and partial == 0


def test_nest_flat_line_is_untouched():
    start = np.array([0, 10, 30], dtype=np.int64)
    dur = np.array([10, 20, 5], dtype=np.int64)
    self_ps, depth, partial = nest(start, dur)
    assert self_ps.tolist() == dur.tolist() and depth.tolist() == [0, 0, 0] and partial == 0


def test_nest_counts_partial_overlap():
    start = np.array([0, 50], dtype=np.int64)
    dur = np.array([100, 100], dtype=np.int64)
    self_ps, _, partial = nest(start, dur)
    assert partial == 1
    assert self_ps.tolist() == [50, 100]


intervals = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 1_000)), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_union_is_at_most_the_sum_and_at_least_the_longest(ivs):
    s = np.array([a for a, _ in ivs], dtype=np.int64)
    e = s + np.array([d for _, d in ivs], dtype=np.int64)
    u = union_length(s, e)
    assert u <= int((e - s).sum())
    if len(ivs):
        assert u >= int((e - s).max())


@settings(max_examples=200, deadline=None)
@given(intervals, st.integers(0, 11_000), st.integers(0, 3_000))
def test_covered_matches_a_brute_force_count(ivs, w0, wlen):
    s = np.array([a for a, _ in ivs], dtype=np.int64)
    e = s + np.array([d for _, d in ivs], dtype=np.int64)
    ms, me = merge(s, e)
    got = covered(np.array([w0]), np.array([w0 + wlen]), ms, me)[0]
    mask = np.zeros(14_000, dtype=bool)
    for a, b in zip(s, e):
        mask[a:b] = True
    assert got == int(mask[w0:w0 + wlen].sum())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200)), min_size=1, max_size=40))
def test_self_times_of_a_properly_nested_line_sum_to_the_union(raw):
    # Build a properly nested line: each event either follows or fits inside the previous one.
    start, dur = [0], [raw[0][1] * 10]
    for gap, d in raw[1:]:
        ps, pd = start[-1], dur[-1]
        if gap % 2 and pd > 2:
            start.append(ps + 1)
            dur.append(max(1, min(d, pd - 2)))
        else:
            start.append(max(ps + pd, max(a + b for a, b in zip(start, dur))) + gap)
            dur.append(d)
    s = np.array(start, dtype=np.int64)
    d = np.array(dur, dtype=np.int64)
    order = np.lexsort((-d, s))
    self_ps, _, partial = nest(s[order], d[order])
    if partial == 0:
        assert int(self_ps.sum()) == union_length(s, s + d)


def _line(ivs):
    """Events sorted as a line is read: by start, longer first."""
    ivs = sorted(ivs, key=lambda t: (t[0], -t[1]))
    return (np.array([a for a, _ in ivs], dtype=np.int64), np.array([d for _, d in ivs], dtype=np.int64))


def test_nest_whole_steps_inside_a_while_loop():
    # A step: while.1 [0,1000) holding 3 layers, each a fusion holding a nested op, then an all-reduce.
    start, dur = _line([(0, 1000), (10, 300), (20, 100), (310, 300), (320, 50), (620, 300), (630, 10),
                        (1000, 50)])
    self_ps, depth, partial = nest(start, dur)
    assert depth.tolist() == [0, 1, 2, 1, 2, 1, 2, 0]
    assert self_ps.tolist() == [100, 200, 100, 250, 50, 290, 10, 50]
    assert partial == 0
    # The stack walk (the reference, and the path for partial overlaps) gives the events table's dtypes too
    walked = nest_walk(start, dur)
    assert walked[0].tolist() == self_ps.tolist() and walked[1].tolist() == depth.tolist() and walked[2] == 0
    assert (self_ps.dtype, depth.dtype, walked[0].dtype, walked[1].dtype) == (np.int64, np.int16, np.int64, np.int16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 600)), min_size=0, max_size=80))
def test_nest_equals_the_stack_walk(ivs):
    # Random lines: nested, disjoint, zero-length, equal and partially overlapping events.
    start, dur = _line(ivs)
    got, want = nest(start, dur), nest_walk(start, dur)
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()
    assert got[2] == want[2]


@pytest.mark.parametrize("case", ["sorted", "unsorted", "unsorted after the smallest", "ties", "few bounds", "empty"])
def test_count_at_or_before_is_searchsorted_right(case):
    # A core's events by start against its steps' starts: counted when the times are sorted,
    # searched otherwise; the same either way, ties (a time equal to a bound counts it) included.
    rng = np.random.default_rng(3)
    bounds = np.sort(rng.integers(0, 10_000, 200))
    times = {"sorted": np.sort(rng.integers(-100, 10_100, 5_000)),
             "unsorted": rng.integers(-100, 10_100, 5_000),
             # the first time is the smallest, the rest in any order: still not sorted
             "unsorted after the smallest": np.concatenate([[-200], rng.integers(-100, 10_100, 5_000)]),
             "ties": np.sort(np.concatenate([bounds, bounds, rng.integers(0, 10_000, 100)])),
             "few bounds": np.sort(rng.integers(0, 10_000, 50)),
             "empty": np.zeros(0, dtype=np.int64)}[case]
    if case == "few bounds":
        bounds = bounds[:3]
    got = count_at_or_before(bounds, times)
    np.testing.assert_array_equal(got, np.searchsorted(bounds, times, side="right"))
    assert got.dtype == np.intp


def test_covered_by_no_intervals_is_zero_picoseconds():
    empty = np.zeros(0, dtype=np.int64)
    got = covered(np.array([0, 5]), np.array([10, 20]), empty, empty)
    assert got.tolist() == [0, 0] and got.dtype == np.int64
    s, e = merge(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))  # no intervals: an empty int64 union
    assert (len(s), len(e), s.dtype, e.dtype) == (0, 0, np.int64, np.int64)
