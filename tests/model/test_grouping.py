"""`model.grouping.group_sums`: each of its three paths (dense table, stable sort of packed keys,
lexicographic sort) gives pandas' groupby sums, exactly, in key order; `factorize_runs` gives `pd.factorize`'s
codes and values; `worst_of_sums` gives pandas' largest per-inner-key sum per key, by both of its
paths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpudiag.model.grouping import factorize_runs, group_sums, sorted_groups, worst_of_sums


def _reference(keys, values):
    frame = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)} | {"v": values})
    out = frame.groupby([f"k{i}" for i in range(len(keys))], sort=True)["v"].sum().reset_index()
    return [out[f"k{i}"].to_numpy() for i in range(len(keys))], out["v"].to_numpy()


@pytest.mark.parametrize("case", ["dense", "sparse", "sparse repeated", "negative", "time-ordered"])
def test_group_sums_equal_pandas(case):
    rng = np.random.default_rng(7)
    n = 5_000
    if case == "dense":  # steps x ops x cores, most tuples present: the dense table
        keys = [rng.integers(0, 20, n), rng.integers(0, 30, n).astype(np.int32), rng.integers(0, 4, n)]
    elif case == "sparse":  # a packed range far above the rows: the sort of packed keys
        keys = [rng.integers(0, 10**6, n), rng.integers(0, 10**5, n)]
    elif case == "sparse repeated":  # the sort of packed keys, 50 distinct tuples each on many rows
        pick = rng.integers(0, 50, n)
        keys = [rng.integers(0, 10**6, 50)[pick], rng.integers(0, 10**5, 50)[pick]]
    elif case == "negative":  # not packable: the lexicographic sort
        keys = [rng.integers(-5, 5, n), rng.integers(0, 3, n)]
    else:  # rows in time order: steps ascending, ops in any order inside a step
        keys = [np.sort(rng.integers(0, 10**5, n)), rng.integers(0, 10**4, n)]
    values = rng.integers(0, 2**50, n)  # sums past 2**53: float arithmetic would not be exact
    got_keys, got = group_sums(keys, values)
    want_keys, want = _reference(keys, values)
    for g, w, k in zip(got_keys, want_keys, keys):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == k.dtype
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64


def test_sorted_groups_number_as_pandas_ngroup():
    rng = np.random.default_rng(5)
    n = 5_000
    keys = [rng.integers(0, 3, n), rng.integers(0, 40, n).astype(np.int8), rng.integers(0, 2, n)]
    frame = pd.DataFrame({"a": keys[0], "b": keys[1], "c": keys[2]})
    by = frame.groupby(["a", "b", "c"], sort=True)
    (a, b, c), group = sorted_groups(keys)
    np.testing.assert_array_equal(group, by.ngroup().to_numpy())
    first = by.head(1).sort_values(["a", "b", "c"])
    for got, col, k in zip((a, b, c), "abc", keys):
        np.testing.assert_array_equal(got, first[col].to_numpy())
        assert got.dtype == k.dtype
    assert sorted_groups([rng.integers(0, 10**6, n), rng.integers(0, 10**5, n)]) is None  # not dense
    assert sorted_groups([rng.integers(-1, 3, n)]) is None  # a code below 0


@pytest.mark.parametrize("case", ["dense", "sparse", "negative", "float", "many cores"])
def test_worst_of_sums_equal_pandas(case):
    # The worst core of each (step, op): per (step, op, core) sums, then the largest over the cores.
    rng = np.random.default_rng(11)
    n = 5_000
    outer = [rng.integers(0, 20, n), rng.integers(0, 30, n).astype(np.int16)]
    if case == "sparse":  # a packed range far above the rows: group_sums, then a maximum per run
        outer = [rng.integers(0, 10**6, n), rng.integers(0, 10**5, n)]
    elif case == "negative":
        outer[0] = rng.integers(-5, 5, n)
    inner = rng.integers(0, 20 if case == "many cores" else 4, n).astype(np.int32)  # over 16: a maximum along rows
    # Negative values: a core absent from a (step, op) is not a zero that could beat them
    values = rng.normal(size=n) if case == "float" else rng.integers(-2**50, 2**50, n)
    frame = pd.DataFrame({"a": outer[0], "b": outer[1], "c": inner, "v": values})
    want = frame.groupby(["a", "b", "c"])["v"].sum().groupby(level=["a", "b"]).max().reset_index()
    (a, b), got = worst_of_sums(outer, inner, values)
    np.testing.assert_array_equal(a, want["a"].to_numpy())
    np.testing.assert_array_equal(b, want["b"].to_numpy())
    assert a.dtype == outer[0].dtype and b.dtype == outer[1].dtype and got.dtype == values.dtype
    if case == "float":  # pandas adds floats with compensation, numpy in row order
        np.testing.assert_allclose(got, want["v"].to_numpy(), rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(got, want["v"].to_numpy())


def test_group_sums_empty():
    keys, sums = group_sums([np.zeros(0, np.int64), np.zeros(0, np.int64)], np.zeros(0, np.int64))
    assert [len(k) for k in keys] == [0, 0] and len(sums) == 0


@pytest.mark.parametrize("case", ["sorted", "ties", "unsorted", "unsorted-minor-key", "one", "empty"])
def test_lexsort_order_equals_numpy(case):
    from tpudiag.model.grouping import lexsort_order

    rng = np.random.default_rng(3)
    start = np.sort(rng.integers(0, 50, 400))
    depth = rng.integers(0, 3, 400)
    if case == "sorted":  # in (start, depth) order already: the identity
        keys = (np.zeros(400, np.int64), start)
        depth = keys[0]
    elif case == "ties":  # equal rows keep their order (a stable sort)
        keys = (np.zeros(400, np.int64), np.zeros(400, np.int64))
    elif case == "unsorted":
        keys = (depth, rng.permutation(start))
    elif case == "unsorted-minor-key":  # primary key sorted, the minor key not
        keys = (depth, start)
    elif case == "one":
        keys = (np.array([3]),)
    else:
        keys = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    np.testing.assert_array_equal(lexsort_order(keys), np.lexsort(keys))


@pytest.mark.parametrize("case", ["few", "many", "many repeated", "wide", "huge first key", "empty"])
def test_first_appearance_groups_number_as_pandas_groupby_unsorted(case):
    from tpudiag.model.grouping import first_appearance_groups, sums_by_group

    rng = np.random.default_rng(11)
    n = 0 if case == "empty" else 4_000
    if case == "few":  # devices x programs x ops of a host: few distinct tuples
        keys = [rng.integers(0, 2, n), rng.integers(0, 3, n), rng.integers(0, 50, n).astype(np.int16)]
    elif case == "many":
        keys = [rng.integers(0, 10**4, n), rng.integers(0, 10**4, n)]
    elif case == "many repeated":  # too many possible tuples for a table; 60 of them, each on many rows
        pick = rng.integers(0, 60, n)
        keys = [rng.integers(0, 10**4, 60)[pick], rng.integers(0, 10**4, 60)[pick]]
    elif case == "wide":  # radices whose product passes int64: the codes are renumbered before packing
        keys = [rng.integers(0, 2**40, n), rng.integers(0, 2**40, n), rng.integers(0, 2**20, n)]
    else:  # renumbered (over 2^61 x 2 passes 2^62), after which few tuples remain: the table by packed key
        keys = [rng.integers(2**61, 2**62, n), rng.integers(0, 2, n)]
    values = rng.integers(0, 2**50, n)
    group, first = first_appearance_groups(keys)
    frame = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)} | {"v": values})
    grouped = frame.groupby([f"k{i}" for i in range(len(keys))], sort=False)
    np.testing.assert_array_equal(group, grouped.ngroup().to_numpy())
    want = grouped["v"].agg(["sum", "size"]).reset_index()
    for i, k in enumerate(keys):  # each group's first row holds its keys, groups in pandas' order
        np.testing.assert_array_equal(k[first], want[f"k{i}"].to_numpy())
    np.testing.assert_array_equal(sums_by_group(group, len(first), values), want["sum"].to_numpy())


def test_lexsort_order_of_no_keys_is_empty():
    from tpudiag.model.grouping import lexsort_order
    assert lexsort_order(()).tolist() == []


@pytest.mark.parametrize("case", ["runs", "interleaved", "one", "empty", "nan", "distinct", "first returns"])
def test_factorize_runs_equals_pandas(case):
    # Runs (a program per execution) take the run-heads path; rows changing often, pandas'.
    rng = np.random.default_rng(3)
    pids = np.array([2**63 + 5, 7, 2**40, 0], dtype=np.uint64)
    if case == "runs":
        values = np.repeat(pids[rng.integers(0, 4, 50)], rng.integers(1, 400, 50))
    elif case == "interleaved":
        values = pids[rng.integers(0, 4, 5_000)]
    elif case == "one":
        values = pids[:1]
    elif case == "empty":
        values = pids[:0]
    elif case == "distinct":  # every row its own value: no runs at all
        values = rng.permutation(np.arange(100, dtype=np.uint64) * 3)
    elif case == "first returns":  # long runs of the first value around two short ones
        values = np.repeat(pids[[0, 1, 0, 2]], [1000, 10, 1000, 10])
    else:  # NaN is never equal to itself: pandas' sentinel -1 either way
        values = np.repeat([1.5, np.nan, 1.5, np.nan, 2.0], [300, 3, 100, 1, 400])
    codes, uniques = factorize_runs(values)
    want_codes, want_uniques = pd.factorize(values)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(uniques, want_uniques)
    assert uniques.dtype == want_uniques.dtype


def test_heads_are_where_any_key_changes():
    from tpudiag.model.grouping import heads

    # Rows sorted by (a, b): a new run at 1 (b 0 -> 1), at 2 (a 1 -> 2, b stays 1), at 4 (b 1 -> 3)
    a, b = np.array([1, 1, 2, 2, 2]), np.array([0, 1, 1, 1, 3])
    assert heads([a, b]).tolist() == [0, 1, 2, 4]
    assert heads([a]).tolist() == [0, 2] and heads([b]).tolist() == [0, 1, 4]
    assert heads([a[:1], b[:1]]).tolist() == [0]
    assert heads([a[:0], b[:0]]).tolist() == [] and heads([]).tolist() == []


@pytest.mark.parametrize("values, want", [
    (np.array([5, 3, 5, 0, 3], dtype=np.int32), [0, 3, 5]),  # small codes: counted
    (np.array([7], dtype=np.uint8), [7]),
    (np.array([4 * 3 + 1024, 2, 2], dtype=np.int64), [2, 4 * 3 + 1024]),  # at the counting limit
    (np.array([10**12, 2, 10**12], dtype=np.int64), [2, 10**12]),  # too large to count: sorted
    (np.array([-1, 4, -1], dtype=np.int64), [-1, 4]),  # negative: sorted
    (np.array([2.5, 1.0, 2.5]), [1.0, 2.5]),
    (np.zeros(0, dtype=np.int64), []),
])
def test_dense_unique_is_numpys_unique(values, want):
    from tpudiag.model.grouping import dense_unique

    got = dense_unique(values)
    assert got.tolist() == want and got.dtype == values.dtype


def test_reordering_is_none_for_rows_already_in_order():
    from tpudiag.model.grouping import reordering

    step, start = np.array([0, 0, 1, 1]), np.array([5, 9, 1, 3])  # by step, then start: in order
    assert reordering((start, step)) is None
    assert reordering((np.array([1, 1]), np.array([0, 0]))) is None  # equal rows stay as they are
    assert reordering((start[::-1].copy(), step)).tolist() == [1, 0, 3, 2]  # starts reversed within each step
    assert reordering((start, step[::-1].copy())).tolist() == [2, 3, 0, 1]
    assert reordering((np.array([3]),)) is None and reordering(()) is None
    assert reordering((np.array([2, 1]),)).tolist() == [1, 0]  # two rows out of order
    assert reordering((np.array([1, 3, 2]),)).tolist() == [0, 2, 1]  # each row after the first, but not in order


def test_worst_of_sums_by_hand_where_the_largest_tuple_never_occurs():
    # (step, op, core) rows: step 0 op 1 on cores 0 and 1, step 1 op 0 on core 1 only. Per (step, op)
    # the busier core: step 0 op 1 -> core 1's 7 + 2 = 9 over core 0's 5; step 1 op 0 -> 4.
    # (The last possible tuple, step 1 op 1 core 1, has no row.)
    step, op = np.array([0, 0, 0, 1]), np.array([1, 1, 1, 0])
    core = np.array([0, 1, 1, 1])
    (s, o), worst = worst_of_sums([step, op], core, np.array([5, 7, 2, 4]))
    assert (s.tolist(), o.tolist(), worst.tolist()) == ([0, 1], [1, 0], [9, 4])


def test_group_sums_by_hand_on_the_lexicographic_path():
    # Negative codes are not packed: rows sorted by (a, b); (-1, 1) and (0, 1) share b but not a
    (a, b), sums = group_sums([np.array([0, -1, 0, -1, 0]), np.array([1, 0, 2, 1, 1])], np.array([1, 2, 3, 4, 5]))
    assert (a.tolist(), b.tolist(), sums.tolist()) == ([-1, -1, 0, 0], [0, 1, 1, 2], [2, 4, 6, 3])


def test_first_appearance_groups_of_codes_whose_packing_would_wrap_around():
    # Packed as they are, 2^24 x 2^40 is 2^64: the second row's key would wrap to the first's.
    # They are renumbered first, so the two rows stay two groups.
    from tpudiag.model.grouping import first_appearance_groups

    group, first = first_appearance_groups([np.array([0, 2**24]), np.array([2**40 - 1, 2**40 - 1])])
    assert group.tolist() == [0, 1] and first.tolist() == [0, 1]
    group, first = first_appearance_groups([])
    assert group.tolist() == [] and first.tolist() == []


def test_first_appearance_groups_by_hand():
    from tpudiag.model.grouping import first_appearance_groups

    # Codes 2, 0, 2: code 1 never occurs. Groups in order of first appearance: 2 -> 0 (row 0), 0 -> 1 (row 1)
    group, first = first_appearance_groups([np.array([2, 0, 2])])
    assert group.tolist() == [0, 1, 0] and first.tolist() == [0, 1]


def test_group_sums_of_codes_whose_product_passes_int64():
    # Radices 2^32 + 1 and 2^32 multiply past 2^63: packed, (2^32, 5) would wrap onto (0, 5). Not packed,
    # the three rows stay three groups.
    keys = [np.array([0, 2**32, 1]), np.array([5, 5, 2**32 - 1])]
    (a, b), sums = group_sums(keys, np.array([1, 2, 4]))
    assert (a.tolist(), b.tolist(), sums.tolist()) == ([0, 1, 2**32], [5, 2**32 - 1, 5], [1, 4, 2])
