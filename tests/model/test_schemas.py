"""`TableSchema.frame`: an `owned` frame keeps its new columns as they are, and equals the frame
pandas' constructor builds from the same columns, dtypes and categories included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpudiag.model import schemas


def _columns(n: int) -> dict[str, object]:
    rng = np.random.default_rng(5)
    return {"step": rng.integers(-1, 50, n), "program_id": rng.integers(0, 2**63, n).astype(np.uint64),
            "name": pd.Categorical.from_codes(rng.integers(0, 3, n), categories=["a", "b", "c"]),
            "self_ps": rng.integers(0, 10**9, n)}


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_owned_frame_equals_the_constructors(n):
    owned = schemas.OP_STEP_SUMS.frame(_columns(n), owned=True)
    pd.testing.assert_frame_equal(owned, schemas.OP_STEP_SUMS.frame(_columns(n)), check_exact=True)
    schemas.OP_STEP_SUMS.require(owned)


def test_owned_frame_does_not_copy_its_columns():
    cols = _columns(1000)
    owned = schemas.OP_STEP_SUMS.frame(cols, owned=True)
    if schemas._blocks_constructor() is None:
        pytest.skip("pandas without pandas.api.internals (before 3.0) copies, as the constructor does")
    for name in ("step", "program_id", "self_ps"):
        assert np.shares_memory(owned[name].to_numpy(), cols[name])


def test_only_numeric_and_categorical_columns_are_kept_as_blocks():
    # An object array of strings is inferred by the constructor (pandas 3: `str`), and a string
    # array is an extension array of its own: frames with either take the constructor.
    n = np.arange(3)
    assert schemas._blockable({"a": n, "b": pd.Categorical(["x", "y", "x"])})
    assert not schemas._blockable({"a": n, "b": np.array(["x", "y", "x"], dtype=object)})
    assert not schemas._blockable({"a": n, "b": pd.array(["x", "y", "x"], dtype="string")})
    assert not schemas._blockable({"a": n, "b": np.arange(4)})  # lengths differ: the constructor says so


T = schemas.TableSchema("t", (schemas.Column("host", "category", "host"), schemas.Column("core", "int32", "core"),
                              schemas.Column("name", "string", "name"), schemas.Column("dur_ps", "float64", "time")))
NO_HOST = schemas.TableSchema("u", T.columns[1:])


def _dtypes(frame: pd.DataFrame) -> list[str]:
    return [str(d) if not isinstance(d, pd.CategoricalDtype) else "category" for d in frame.dtypes]


def test_a_frame_has_exactly_the_declared_columns_and_dtypes():
    frame = T.frame({"dur_ps": [1, 2], "name": ["fusion.1", None], "core": [3, 4], "host": ["h", "h"], "extra": [0, 0]})
    assert T.names == ["host", "core", "name", "dur_ps"] and list(frame.columns) == T.names
    assert _dtypes(frame) == ["category", "int32", "string", "float64"]
    assert frame["name"].dtype == pd.StringDtype("python") and pd.isna(frame["name"].iloc[1])
    assert frame["core"].tolist() == [3, 4] and frame["dur_ps"].tolist() == [1.0, 2.0]
    # A categorical column is kept as given, its categories in their own order
    kept = T.frame({"host": pd.Categorical(["a"], categories=["b", "a"]), "core": [0], "name": ["x"], "dur_ps": [0]})
    assert kept["host"].cat.categories.tolist() == ["b", "a"]


def test_a_missing_column_is_an_error_unless_the_table_is_empty():
    with pytest.raises(ValueError) as info:
        T.frame({"host": ["h"], "core": [0]})
    assert str(info.value) == "t table: missing columns ['name', 'dur_ps']"
    with pytest.raises(ValueError, match=r"^t table: missing columns \['host', 'core', 'name', 'dur_ps'\]$"):
        T.frame()
    for empty in (T.empty(), T.frame({"core": []}, length=0), T.frame(None, length=0)):
        assert len(empty) == 0 and list(empty.columns) == T.names
        assert _dtypes(empty) == ["category", "int32", "string", "float64"]
    assert _dtypes(T.frame({"core": np.array([], dtype=np.int64)}, length=0, owned=True)) == [
        "category", "int32", "string", "float64"]


def test_an_owned_frame_of_numbers_and_categories_has_its_declared_dtypes():
    owned = NO_HOST.frame({"core": np.array([1, 2], dtype=np.int64), "name": ["a", "b"], "dur_ps": [1, 2]}, owned=True)
    assert _dtypes(owned) == ["int32", "string", "float64"] and owned.index.tolist() == [0, 1]
    numeric = schemas.TableSchema("n", (schemas.Column("a", "int64", ""), schemas.Column("b", "category", "")))
    frame = numeric.frame({"a": np.arange(3), "b": pd.Categorical(["x", "y", "x"])}, owned=True)
    assert list(frame.columns) == ["a", "b"] and frame.index.equals(pd.RangeIndex(3))
    assert frame["a"].tolist() == [0, 1, 2] and frame["b"].tolist() == ["x", "y", "x"]


def test_a_hosts_table_from_another_frame():
    source = pd.DataFrame({"core": np.array([0, 1], dtype=np.int32), "name": ["a", "b"], "dur_ps": [5.0, 6.0],
                           "host": ["old", "old"], "other": [1, 2]})
    source["name"] = pd.Categorical(["a", "b"], categories=["b", "a"])
    mixed = schemas.TableSchema("m", (T.columns[0], T.columns[1], schemas.Column("name", "category", ""),
                                      T.columns[3]))
    frame = mixed.of_host(source, "host-7")
    assert frame["host"].tolist() == ["host-7", "host-7"] and frame["host"].cat.categories.tolist() == ["host-7"]
    assert frame["name"].cat.categories.tolist() == ["b", "a"]  # kept, not re-encoded
    assert frame["core"].tolist() == [0, 1] and frame["dur_ps"].tolist() == [5.0, 6.0]
    plain = NO_HOST.of_host(source.assign(name=["a", "b"]))
    assert list(plain.columns) == ["core", "name", "dur_ps"] and plain["name"].tolist() == ["a", "b"]


def test_tables_stacked_with_their_hosts():
    one = T.frame({"host": ["x", "x"], "core": [0, 1], "name": ["a", "b"], "dur_ps": [1, 2]})
    one = one.assign(host=pd.Categorical(["x", "x"]))
    cat = schemas.TableSchema("c", (T.columns[0], schemas.Column("name", "category", ""), T.columns[3]))
    first = cat.frame({"host": ["x", "x"], "name": pd.Categorical(["a", "b"], categories=["b", "a"]),
                       "dur_ps": [1, 2]})
    second = cat.frame({"host": ["y"], "name": ["c"], "dur_ps": [3]})
    # An object column where the schema says category (a hand-built table) is made categorical
    third = pd.DataFrame({"host": ["z"], "name": pd.Series(["a"], dtype=object), "dur_ps": [4.0]})
    stacked = cat.stack([first, cat.empty(), second, third], hosts=["h0", "h1", "h2", "h3"])
    assert stacked["host"].tolist() == ["h0", "h0", "h2", "h3"]
    assert stacked["host"].cat.categories.tolist() == ["h0", "h2", "h3"]  # the empty table's host is dropped
    assert stacked["name"].tolist() == ["a", "b", "c", "a"]
    # merged by their categories in the order they come (the first table's own order kept), not re-sorted
    assert stacked["name"].cat.categories.tolist() == ["b", "a", "c"]
    # An ordered categorical from another host merges all the same
    ordered = cat.frame({"host": ["w"], "name": pd.Categorical(["d"], ordered=True), "dur_ps": [5]})
    assert cat.stack([first, ordered], hosts=["h0", "h1"])["name"].tolist() == ["a", "b", "d"]
    assert stacked["dur_ps"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert cat.stack([first])["host"].tolist() == ["", ""]  # no hosts given
    assert len(cat.stack([])) == 0 and len(cat.stack([cat.empty()], hosts=["h"])) == 0
    assert _dtypes(cat.stack([])) == ["category", "category", "float64"]
    assert NO_HOST.stack([one[NO_HOST.names], one[NO_HOST.names]])["name"].tolist() == ["a", "b", "a", "b"]


def test_require_names_the_missing_and_the_mistyped_columns():
    good = T.empty()
    T.require(good)
    with pytest.raises(ValueError) as info:
        T.require(good.drop(columns=["name", "dur_ps"]))
    assert str(info.value) == "t table lacks columns ['name', 'dur_ps']"
    T.require(good.drop(columns=["dur_ps"]), columns=["host", "core"])  # only those asked for
    bad = pd.DataFrame({"host": ["h"], "core": np.array([1], dtype=np.int64), "name": [7], "dur_ps": [1.0]})
    with pytest.raises(ValueError) as info:
        T.require(bad)
    assert str(info.value) == ("t table has mistyped columns: host (str, want category), core (int64, want int32), "
                               "name (int64, want string)")
    with pytest.raises(ValueError, match=r"mistyped columns: core \(int64, want int32\)$"):
        T.require(bad, columns=["core", "dur_ps"])
    T.require(bad.assign(host=pd.Categorical(["h"]), core=np.int32(1), name=pd.Series(["x"], dtype=object)))


def test_a_frame_not_owned_copies_its_columns():
    # Without `owned` the caller may go on writing its arrays: the table must not change with them
    cols = _columns(100)
    frame = schemas.OP_STEP_SUMS.frame(cols)
    for name in ("step", "program_id", "self_ps"):
        assert not np.shares_memory(frame[name].to_numpy(), cols[name])
    cols["self_ps"][:] = -1
    assert (frame["self_ps"] >= 0).all()


def test_an_empty_tables_categories_are_strings():
    # As a filled table's are: an empty table concatenates or unions with a filled one
    empty = T.empty()
    assert empty["host"].cat.categories.dtype == object
    filled = T.frame({"host": ["h"], "core": [0], "name": ["x"], "dur_ps": [1.0]})
    both = pd.concat([empty, filled], ignore_index=True)
    assert both["host"].tolist() == ["h"] and both["name"].dtype == pd.StringDtype("python")
