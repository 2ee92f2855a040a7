"""Interval arithmetic on int64 picosecond arrays: nesting, self time, unions and overlaps."""

from __future__ import annotations

import numpy as np


def nest(start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Self time and depth of events on one line, in the given order (sorted by start, parents first).

    Self time is the duration minus the directly nested children (XProf's definition). Events
    that only partially overlap a predecessor (which XProf's format forbids) are counted as
    children for the overlapping part only; their number is returned so callers can warn.

    Real lines nest whole steps inside a `while` loop, so every event may sit in a nesting
    cluster: the nesting is found level by level over whole arrays (a handful of levels), and only
    the clusters holding a partial overlap are walked event by event (`nest_walk`).
    """
    n = len(start)
    self_ps = dur.astype(np.int64, copy=True)
    depth = np.zeros(n, dtype=np.int16)
    if n < 2:
        return self_ps, depth, 0
    start = start.astype(np.int64, copy=False)
    end = start + dur
    parent = np.full(n, -1, dtype=np.int64)
    cur = np.arange(n)
    level = 0
    while len(cur) > 1:
        # Within the events still unplaced, a cluster head starts after every earlier one ended;
        # for properly nested events the rest of its cluster lies inside it, one level deeper.
        e = end[cur]
        nested = np.zeros(len(cur), dtype=bool)
        nested[1:] = start[cur[1:]] < np.maximum.accumulate(e)[:-1]
        if not nested.any():
            break
        head_pos = np.flatnonzero(~nested)
        cluster = np.cumsum(~nested) - 1
        inner = cur[nested]
        parent[inner] = cur[head_pos[cluster[nested]]]
        level += 1
        depth[inner] = level
        cur = inner
    child = np.flatnonzero(parent >= 0)
    if not len(child):
        return self_ps, depth, 0
    bad = end[child] > end[parent[child]]
    if bad.any():
        # A partial overlap breaks the nesting the levels assume: walk those top-level clusters.
        top = np.zeros(n, dtype=bool)
        top[1:] = start[1:] < np.maximum.accumulate(end)[:-1]
        cluster_of = np.cumsum(~top) - 1
        heads = np.flatnonzero(~top)
        walk = np.zeros(len(heads), dtype=bool)
        walk[cluster_of[child[bad]]] = True
        keep = ~walk[cluster_of[child]]
        np.subtract.at(self_ps, parent[child[keep]], dur[child[keep]])
        partial = 0
        for c in np.flatnonzero(walk):
            lo, hi = heads[c], heads[c + 1] if c + 1 < len(heads) else n
            s_c, d_c, p_c = nest_walk(start[lo:hi], dur[lo:hi])
            self_ps[lo:hi], depth[lo:hi] = s_c, d_c
            partial += p_c
        return self_ps, depth, partial
    np.subtract.at(self_ps, parent[child], dur[child])
    return self_ps, depth, 0


def nest_walk(start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """`nest` by an event-by-event stack walk: the reference, and the path for partial overlaps."""
    n = len(start)
    self_ps = dur.astype(np.int64, copy=True)
    depth = np.zeros(n, dtype=np.int16)
    end = start + dur
    partial = 0
    stack: list[int] = []
    for i in range(n):
        s_i = int(start[i])
        while stack and s_i >= int(end[stack[-1]]):
            stack.pop()
        if stack:
            p = stack[-1]
            e_i = int(end[i])
            e_p = int(end[p])
            if e_i > e_p:
                partial += 1
            self_ps[p] -= min(e_i, e_p) - s_i
            depth[i] = len(stack)
        stack.append(i)
    return self_ps, depth, partial


def union_length(start: np.ndarray, end: np.ndarray) -> int:
    """Total length covered by the union of [start, end) intervals."""
    s, e = merge(start, end)
    return int((e - s).sum())


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    if len(start) == 0:
        return start.astype(np.int64), end.astype(np.int64)
    # Events come in time order (a core's, by start): then no sort and no gathers.
    order = None if (start[1:] >= start[:-1]).all() else np.argsort(start, kind="stable")
    s = (start if order is None else start[order]).astype(np.int64, copy=False)
    e = np.maximum.accumulate((end if order is None else end[order]).astype(np.int64, copy=False))
    new_run = np.empty(len(s), dtype=bool)
    new_run[0] = True
    new_run[1:] = s[1:] > e[:-1]
    # `e` never decreases, so a run's end is the running maximum at its last interval.
    last = np.append(np.flatnonzero(new_run)[1:] - 1, len(s) - 1)
    return s[new_run], e[last]


def count_at_or_before(bounds: np.ndarray, times: np.ndarray) -> np.ndarray:
    """`np.searchsorted(bounds, times, side="right")`: per time, how many of the sorted `bounds` are
    at or before it. When `times` are sorted too (a core's events, by start, against its steps'
    starts) it counts instead of searching: where each bound falls among the times, then a running
    sum, two linear passes where a binary search per time costs log(bounds) steps each."""
    n = len(times)
    if n < 2 or len(bounds) < 16 or not (times[1:] >= times[:-1]).all():
        return np.searchsorted(bounds, times, side="right")
    first_at_or_after = np.searchsorted(times, bounds, side="left")  # bound j counts for times from here on
    return np.cumsum(np.bincount(first_at_or_after, minlength=n + 1)[:n])


def covered(win_start: np.ndarray, win_end: np.ndarray, m_start: np.ndarray, m_end: np.ndarray) -> np.ndarray:
    """For each window, the length covered by disjoint sorted intervals (m_start, m_end)."""
    if len(m_start) == 0:
        return np.zeros(len(win_start), dtype=np.int64)
    seg = m_end - m_start
    prefix = np.concatenate([[0], np.cumsum(seg)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # Length of the union lying before time t.
        k = np.searchsorted(m_start, t, side="right")  # intervals starting before t
        full = prefix[k]
        last = np.clip(k - 1, 0, None)
        overshoot = np.where(k > 0, np.clip(m_end[last] - t, 0, None), 0)
        return full - overshoot

    return covered_before(win_end) - covered_before(win_start)
