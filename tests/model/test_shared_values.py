"""`SharedValues`: a pod's second host's tables point at the first host's equal categories and strings,
their values unchanged; what differs, and what is measured, stays each host's own. And
`host_frames`: every table a host holds but its events, its digest's nested tables included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from tpudiag.model.profile import HostTrace
from tpudiag.model.shared_values import SharedValues, host_frames


def _new(text: str) -> str:
    """An equal string that is not the same object (as each host's unpickled copy is)."""
    return "".join(list(text))


def _ops(names: list[str], times: list[int], shapes: list[str | None], ordered: bool = False) -> pd.DataFrame:
    return pd.DataFrame({
        "name": pd.Categorical([_new(n) for n in names], categories=[_new(n) for n in sorted(set(names))],
                               ordered=ordered),
        "self_time_ps": np.array(times, dtype=np.int64),
        "shape": pd.array([_new(s) if s is not None else None for s in shapes], dtype=pd.StringDtype("python")),
        "label": pd.Series([_new(n) for n in names], dtype=object),  # an object column is not shared
        # pandas' own string dtype (`str`: NaN for missing), as a table built without a schema has it
        "plain": pd.Series([_new(s) if s is not None else None for s in shapes], dtype=pd.StringDtype("python", np.nan)),
    })


def test_the_second_hosts_equal_values_point_at_the_firsts():
    first = _ops(["fusion.1", "dot.2"], [10, 20], ["f32[8]", "bf16[4,4]"])
    second = _ops(["dot.2", "fusion.1"], [7, 9], ["bf16[4,4]", None])
    shared = SharedValues()
    shared._share_frame(first)
    before = first["name"].dtype
    shared._share_frame(second)
    assert first["name"].dtype is before  # the first copy is the one kept
    assert second["name"].dtype is first["name"].dtype
    assert second["name"].cat.categories is first["name"].cat.categories
    assert second["name"].tolist() == ["dot.2", "fusion.1"]  # values unchanged, codes re-pointed
    assert second["shape"].iloc[0] is first["shape"].iloc[1]
    assert pd.isna(second["shape"].iloc[1]) and second["shape"].dtype == pd.StringDtype("python")
    assert second["self_time_ps"].tolist() == [7, 9]  # measured values are each host's own
    assert second["label"].iloc[0] is not first["label"].iloc[1]
    assert first["shape"].tolist() == ["f32[8]", "bf16[4,4]"] and second["shape"].iloc[0] == "bf16[4,4]"
    assert second["plain"].iloc[0] is first["plain"].iloc[1]
    assert second["plain"].dtype == pd.StringDtype("python", np.nan) and second["plain"].dtype.na_value is np.nan
    assert first["plain"].tolist()[0] == "f32[8]" and pd.isna(second["plain"].iloc[1])


def test_categories_that_differ_are_not_shared():
    shared = SharedValues()
    first = _ops(["fusion.1", "dot.2"], [1, 2], ["a", "b"])
    other = _ops(["fusion.1", "copy.3"], [1, 2], ["a", "b"])
    ordered = _ops(["fusion.1", "dot.2"], [1, 2], ["a", "b"], ordered=True)
    for frame in (first, other, ordered):
        shared._share_frame(frame)
    assert other["name"].dtype is not first["name"].dtype
    assert ordered["name"].dtype is not first["name"].dtype and ordered["name"].dtype.ordered
    assert ordered["name"].tolist() == ["fusion.1", "dot.2"]
    again = _ops(["copy.3"], [5], ["a"])
    again["name"] = again["name"].cat.set_categories(["copy.3", "fusion.1"])
    shared._share_frame(again)
    assert again["name"].dtype is other["name"].dtype and again["name"].tolist() == ["copy.3"]


@dataclasses.dataclass
class _Inner:
    windows: pd.DataFrame
    count: int = 0


@dataclasses.dataclass
class _Digest:
    """A digest's shape (`HostDigest`): tables, a nested table holder, a class and a plain value."""

    ops: pd.DataFrame
    inner: _Inner
    kind: type = int
    steps: int = 3


def _host(digest) -> HostTrace:
    tables = [pd.DataFrame({"t": [i]}) for i in range(4)]
    return HostTrace(host="h", path="h.xplane.pb", device=None, events=pd.DataFrame({"e": [0]}),
                     op_metadata=tables[0], step_markers=tables[1], modules=tables[2], async_windows=tables[3],
                     digest=digest)


def test_a_hosts_frames_are_its_tables_and_its_digests():
    bare = _host(None)
    assert [f["t"].iloc[0] for f in host_frames(bare)] == [0, 1, 2, 3]  # not the events
    digest = _Digest(ops=pd.DataFrame({"t": [4]}), inner=_Inner(pd.DataFrame({"t": [5]})))
    assert sorted(f["t"].iloc[0] for f in host_frames(_host(digest))) == [0, 1, 2, 3, 4, 5]


def test_share_reaches_every_table_of_a_host():
    def host():
        digest = _Digest(ops=_ops(["a.1"], [1], ["s"]), inner=_Inner(_ops(["b.2"], [2], ["t"])))
        h = _host(digest)
        h.op_metadata = _ops(["c.3"], [3], ["u"])
        return h
    shared = SharedValues()
    first, second = host(), host()
    shared.share(first)
    shared.share(second)
    assert second.op_metadata["name"].dtype is first.op_metadata["name"].dtype
    assert second.digest.ops["name"].dtype is first.digest.ops["name"].dtype
    assert second.digest.inner.windows["name"].dtype is first.digest.inner.windows["name"].dtype
    assert second.digest.inner.windows["shape"].iloc[0] is first.digest.inner.windows["shape"].iloc[0]
