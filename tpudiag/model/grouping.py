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
    int64 and sorted once; anything else takes a lexicographic sort over the key arrays.
    """
    n = len(values)
    radix = [int(k.max()) + 1 if n else 1 for k in keys]
    packable = n and all(k.dtype.kind in "iu" for k in keys) and min(int(k.min()) for k in keys) >= 0 \
        and math.prod(radix) < 2 ** 62
    if packable:
        packed = np.zeros(n, dtype=np.int64)
        for k, r in zip(keys, radix):
            packed = packed * r + k.astype(np.int64)
        order = np.argsort(packed)  # any order within a group: only its sum and its key are kept
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


def heads(keys: list[np.ndarray]) -> np.ndarray:
    """Indices where the tuple of (sorted) `keys` changes: the first row of each run."""
    n = len(keys[0]) if keys else 0
    change = np.ones(n, dtype=bool)
    if n:
        change[1:] = False
        for k in keys:
            change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)
