"""`plausible_spans`: the guards that keep an event's end inside int64 picoseconds.

A damaged timestamp near 2^63 ps with an ordinary duration has an end that wraps around to a large
negative time once the two are added in int64: such an event must be dropped at the parser, before
any interval arithmetic sees it."""

from __future__ import annotations

import numpy as np

from tpudiag.parsers.device_trace import MAX_EVENT_PS, plausible_spans

INT64_MAX = (1 << 63) - 1


def test_an_event_whose_end_would_pass_int64_is_dropped():
    starts = np.array([INT64_MAX - 10, 1_000], dtype=np.int64)
    durs = np.array([100, 100], dtype=np.int64)
    assert plausible_spans(starts, durs).tolist() == [False, True]


def test_every_kept_event_ends_within_int64():
    rng = np.random.default_rng(0)
    starts = rng.integers(INT64_MAX - 4 * MAX_EVENT_PS, INT64_MAX, size=1000, dtype=np.int64)
    durs = rng.integers(0, MAX_EVENT_PS, size=1000, dtype=np.int64)
    keep = plausible_spans(starts, durs)
    ends = [int(s) + int(d) for s, d in zip(starts[keep], durs[keep])]  # Python integers: no wrap
    assert all(e <= INT64_MAX for e in ends)
    assert keep.any() and not keep.all()


def test_negative_and_day_long_durations_are_dropped():
    starts = np.zeros(3, dtype=np.int64)
    durs = np.array([-1, MAX_EVENT_PS + 1, MAX_EVENT_PS], dtype=np.int64)
    assert plausible_spans(starts, durs).tolist() == [False, False, True]
