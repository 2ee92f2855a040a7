"""Interval arithmetic on int64 picosecond arrays: nesting, self time, unions and overlaps."""

from __future__ import annotations

import numpy as np


def nest(start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Self time and depth of events on one line, in the given order (sorted by start, parents first).

    Self time is the duration minus the directly nested children (XProf's definition). Events
    that only partially overlap a predecessor (which XProf's format forbids) are counted as
    children for the overlapping part only; their number is returned so callers can warn.
    Most TPU op lines are flat, so the stack walk runs only over the clusters that nest.
    """
    n = len(start)
    self_ps = dur.astype(np.int64, copy=True)
    depth = np.zeros(n, dtype=np.int16)
    if n < 2:
        return self_ps, depth, 0
    end = start + dur
    prev_max_end = np.maximum.accumulate(end)[:-1]
    nested = np.zeros(n, dtype=bool)
    nested[1:] = start[1:] < prev_max_end
    if not nested.any():
        return self_ps, depth, 0
    cluster = np.cumsum(~nested)
    heads = np.flatnonzero(~nested)
    partial = 0
    for c in np.unique(cluster[nested]):
        lo = heads[c - 1]
        hi = heads[c] if c < len(heads) else n
        stack: list[int] = []
        for i in range(lo, hi):
            s_i = int(start[i])
            while stack and s_i >= int(end[stack[-1]]):
                stack.pop()
            if stack:
                parent = stack[-1]
                e_i = int(end[i])
                e_p = int(end[parent])
                if e_i > e_p:
                    partial += 1
                self_ps[parent] -= min(e_i, e_p) - s_i
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
    order = np.argsort(start, kind="stable")
    s = start[order].astype(np.int64)
    e = np.maximum.accumulate(end[order].astype(np.int64))
    new_run = np.empty(len(s), dtype=bool)
    new_run[0] = True
    new_run[1:] = s[1:] > e[:-1]
    run_id = np.cumsum(new_run) - 1
    run_end = np.zeros(int(new_run.sum()), dtype=np.int64)
    np.maximum.at(run_end, run_id, e)
    return s[new_run], run_end


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
