"""Exact sums per distinct key tuple over whole arrays: one sort instead of a pandas groupby.

Digests and rules group millions of rows by small integer codes (step, op name, core); packing
the codes into one int64 and sorting once is several times faster than pandas' multi-key
groupby on categoricals, and the sums stay exact integers.
"""

from __future__ import annotations

import math

import numpy as np


def group_sums(keys: list[np.ndarray], values: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Sums of `values` per distinct tuple of `keys`, sorted by the keys: (each key at the groups, sums).

    Keys of non-negative integer codes whose ranges multiply to under 2**62 are packed into one
    int64. When the packed range is no larger than a few times the rows (steps x ops x cores on a
    host: most tuples occur), the sums go straight into a dense table; otherwise the packed keys
    are sorted once, stably (rows come in time order, so they are nearly sorted by step, where a
    stable sort is several times faster). Anything else takes a lexicographic sort of the keys.
    """
    n = len(values)
    radix = _radix(keys, n)
    if _packable(keys, radix, n):
        packed = _pack(keys, radix, n)
        if _dense(radix, n):
            return _dense_sums(packed, values, radix, [k.dtype for k in keys])
        order = np.argsort(packed, kind="stable")
        ordered = packed[order]
        change = np.ones(n, dtype=bool)
        change[1:] = ordered[1:] != ordered[:-1]
    else:
        order = np.lexsort(keys[::-1])
        change = np.zeros(n, dtype=bool)
        if n:
            change[0] = True
            for k in keys:
                ordered_key = k[order]
                change[1:] |= ordered_key[1:] != ordered_key[:-1]
    starts = np.flatnonzero(change)
    sums = np.add.reduceat(values[order], starts) if len(starts) else values[:0]
    return [k[order[starts]] for k in keys], sums


def _dense_sums(packed: np.ndarray, values: np.ndarray, radix: list[int], dtypes: list) -> tuple[list[np.ndarray],
                                                                                              np.ndarray]:
    """`group_sums` through a table indexed by the packed key: exact (integer values add as
    integers), already in key order, and without a sort."""
    totals, seen = _dense_totals(packed, values, math.prod(radix))
    present = np.flatnonzero(seen)
    return _unpacked(present, radix, dtypes), totals[present]


def _radix(keys: list[np.ndarray], n: int) -> list[int]:
    """The number of codes each key may take (its largest + 1), the base it is packed in."""
    return [int(k.max()) + 1 if n else 1 for k in keys]


def _packable(keys: list[np.ndarray], radix: list[int], n: int) -> bool:
    """Keys of non-negative integer codes whose ranges multiply to under 2**62 (one int64 holds them)."""
    return bool(n) and all(k.dtype.kind in "iu" for k in keys) and min(int(k.min()) for k in keys) >= 0 \
        and math.prod(radix) < 2 ** 62


def _dense(radix: list[int], n: int) -> bool:
    """A table of every packed key is no larger than a few times the rows (most tuples occur)."""
    return math.prod(radix) <= 4 * n + 1024


def _pack(keys: list[np.ndarray], radix: list[int], n: int) -> np.ndarray:
    """Each of the `n` rows' key tuple as one int64, the first key most significant (packed order is
    key order)."""
    packed = np.zeros(n, dtype=np.int64)
    for k, r in zip(keys, radix):
        packed = packed * r + k.astype(np.int64)
    return packed


def _dense_totals(packed: np.ndarray, values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(the sum of `values` at each packed key in range(size), whether any row has that key)."""
    totals = np.zeros(size, dtype=values.dtype)
    np.add.at(totals, packed, values)
    return totals, np.bincount(packed, minlength=size).astype(bool)


def _unpacked(packed: np.ndarray, radix: list[int], dtypes: list) -> list[np.ndarray]:
    """The key codes packed into `packed` (`group_sums`' packing): a division by each radix and a
    multiply-subtract, several times faster than `np.divmod` on a million keys."""
    out = []
    rest = packed
    for r, dtype in zip(radix[::-1], dtypes[::-1]):
        quotient = rest // r
        out.append((rest - quotient * r).astype(dtype))
        rest = quotient
    return out[::-1]


def sorted_groups(keys: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray] | None:
    """(each key at the groups, group of each row) of the distinct tuples of `keys` (non-negative
    integer codes), groups numbered in key order, as a sorted groupby's `ngroup` numbers them:
    through a table by packed key. None when the keys do not pack densely (`group_sums`' test)."""
    n = len(keys[0]) if keys else 0
    radix = _radix(keys, n)
    if not (_packable(keys, radix, n) and _dense(radix, n)):
        return None
    packed = _pack(keys, radix, n)
    seen = np.bincount(packed, minlength=math.prod(radix)) > 0
    group_of = np.cumsum(seen) - 1
    return _unpacked(np.flatnonzero(seen), radix, [k.dtype for k in keys]), group_of[packed]


def worst_of_sums(keys: list[np.ndarray], inner: np.ndarray, values: np.ndarray) -> tuple[list[np.ndarray],
                                                                                         np.ndarray]:
    """The largest over `inner` of the sums of `values` per (`keys`..., `inner`), per distinct tuple of
    `keys`, sorted by the keys: (each key at the groups, largest sums), as `group_sums` over
    `keys + [inner]` then a maximum over each run of the keys gives them (the worst core of each
    step and op). With few possible tuples (a dense table, as `group_sums` takes) the sums go into
    a table of one row per key tuple and one column per `inner` code, and each row's maximum is
    taken over the columns that occur, without unpacking every (keys, inner) group."""
    n = len(values)
    all_keys = [*keys, inner]
    radix = _radix(all_keys, n)
    if not (_packable(all_keys, radix, n) and _dense(radix, n) and values.dtype.kind in "iuf"):
        (*outer, _), sums = group_sums(all_keys, values)
        first = heads(outer)
        return [k[first] for k in outer], np.maximum.reduceat(sums, first) if len(first) else sums
    outer = _pack(keys, radix[:-1], n)
    columns, size = radix[-1], math.prod(radix)
    totals, seen = _dense_totals(outer * columns + inner.astype(np.int64), values, size)
    lowest = np.iinfo(values.dtype).min if values.dtype.kind in "iu" else -np.inf
    table = np.where(seen, totals, lowest).reshape(-1, columns)
    present = np.flatnonzero(np.bincount(outer, minlength=size // columns))
    if columns > 16:
        worst = table.max(axis=1)
    else:  # a few cores: one pass per core beats a maximum along short rows
        worst = table[:, 0].copy()
        for column in range(1, columns):
            np.maximum(worst, table[:, column], out=worst)
    return _unpacked(present, radix[:-1], [k.dtype for k in keys]), worst[present]


def first_appearance_groups(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row, first row of each group) of the distinct tuples of `keys` (non-negative
    integer codes), groups numbered in the order they first appear, as pandas' `groupby(sort=False)`
    numbers them: one hash pass over the packed codes instead of a groupby."""
    import pandas as pd  # not at import: a host file's parse uses this module before pandas is loaded

    n = len(keys[0]) if keys else 0
    if not n:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    packed = keys[0].astype(np.int64)
    for k in keys[1:]:
        radix = int(k.max()) + 1
        if (int(packed.max()) + 1) * radix >= 2 ** 62:  # renumber densely first (codes under n)
            packed = pd.factorize(packed)[0].astype(np.int64)
        packed = packed * radix + k.astype(np.int64)
    size = int(packed.max()) + 1
    if size <= 4 * n + 1024:  # few possible tuples (ops x cores): a table by packed key, no hashing
        first_row = np.full(size, n, dtype=np.int64)
        np.minimum.at(first_row, packed, np.arange(n, dtype=np.int64))
        present = np.flatnonzero(first_row < n)
        by_appearance = present[np.argsort(first_row[present], kind="stable")]
        group_of = np.empty(size, dtype=np.intp)
        group_of[by_appearance] = np.arange(len(by_appearance))
        return group_of[packed], first_row[by_appearance].astype(np.intp)
    group, _ = pd.factorize(packed)
    seen = np.maximum.accumulate(group)  # a group's first row is where the running maximum grows
    return group, np.flatnonzero(np.append(True, seen[1:] > seen[:-1]))


def factorize_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`pd.factorize(values)`: (the code of each row, numbered in order of first appearance; the
    distinct values), for a column that mostly comes in long runs of one value, such as the
    program of each event (a line runs one program's ops for a whole execution): only each run's
    first row is factorized, and its code repeated over the run. Other columns go to pandas."""
    import pandas as pd  # not at import: a host file's parse uses this module before pandas is loaded

    n = len(values)
    if n < 2:
        return pd.factorize(values)
    starts = np.flatnonzero(values[1:] != values[:-1]) + 1  # NaN != NaN: each NaN a run of its own
    if len(starts) > n // 8:
        return pd.factorize(values)
    heads = np.concatenate(([0], starts))
    codes, uniques = pd.factorize(values[heads])
    return np.repeat(codes, np.diff(np.append(heads, n))), uniques


def sums_by_group(group: np.ndarray, n_groups: int, values: np.ndarray) -> np.ndarray:
    """Exact sums of `values` per group id (`first_appearance_groups`), integers added as integers."""
    out = np.zeros(n_groups, dtype=values.dtype)
    np.add.at(out, group, values)
    return out


def heads(keys: list[np.ndarray]) -> np.ndarray:
    """Indices where the tuple of (sorted) `keys` changes: the first row of each run."""
    n = len(keys[0]) if keys else 0
    change = np.ones(n, dtype=bool)
    if n:
        change[1:] = False
        for k in keys:
            change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def lexsort_order(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """`np.lexsort(keys)` (the last key primary), in one linear pass when the rows already are in
    that order, as trace events mostly are (time order per line): the sort is then the identity."""
    order = reordering(keys)
    return np.arange(len(keys[0]) if keys else 0) if order is None else order


def reordering(keys: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """`lexsort_order(keys)`, or None when it is the identity: the rows need no reordering."""
    n = len(keys[0]) if keys else 0
    if n > 1:
        later = np.zeros(n - 1, dtype=bool)  # row i+1 sorts strictly after row i on a key seen so far
        tied = np.ones(n - 1, dtype=bool)  # rows i, i+1 equal on every key seen so far
        for k in keys[::-1]:
            a, b = k[:-1], k[1:]
            later |= tied & (b > a)
            tied &= b == a
            if not (later | tied).all():
                return np.lexsort(keys)
    return None


def dense_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of small non-negative integers (ids, codes) by counting, not sorting."""
    if len(values) and values.dtype.kind in "iu" and values.min() >= 0 and values.max() <= 4 * len(values) + 1024:
        return np.flatnonzero(np.bincount(values)).astype(values.dtype)
    return np.unique(values)
