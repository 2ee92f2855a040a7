"""`OpRows`, the report's op rows made when read, reads like the tuple of rows it replaced."""

from __future__ import annotations

import dataclasses

import pytest

from tpudiag.model.report import OpRow, OpRows


def _row(i: int) -> OpRow:
    values = {f.name: 0 for f in dataclasses.fields(OpRow) if f.default is dataclasses.MISSING}
    return OpRow(**{**values, "host": "h", "name": f"fusion.{i}", "category": "", "program": "", "bound_by": "",
                    "family": "", "shape_with_layout": "", "source": "", "tf_op": "", "self_time_ps": 100 - i})


def _rows(n: int, calls: list | None = None) -> OpRows:
    def make(start: int, stop: int) -> list[OpRow]:
        if calls is not None:
            calls.append((start, stop))
        return [_row(i) for i in range(start, stop)]
    return OpRows(n, make)


def test_rows_read_like_a_tuple(monkeypatch):
    monkeypatch.setattr(OpRows, "BLOCK", 3)
    calls: list = []
    rows, expected = _rows(7, calls), tuple(_row(i) for i in range(7))
    assert len(rows) == 7 and bool(rows) and not _rows(0)
    assert list(rows) == list(expected)
    assert calls == [(0, 3), (3, 6), (6, 7)]  # made a block at a time, in order
    assert rows[0] == expected[0] and rows[-1] == expected[-1] and rows[4] == expected[4]
    assert rows[2:5] == expected[2:5] and rows[::2] == expected[::2] and rows[5:2] == ()
    assert rows == expected and expected == rows and rows != expected[:-1] and rows == _rows(7)
    assert hash(rows) == hash(expected)
    # As a tuple: never equal to a string (not even an empty table to ''), nor to a number
    assert _rows(0) == () and _rows(0) != "" and rows != "fusion.0" and rows != 7
    for bad in (7, -8):
        with pytest.raises(IndexError, match="^op row index out of range$"):
            rows[bad]
    calls.clear()
    assert rows[6] == expected[6] and rows[-7] == expected[0] and rows[3:3] == ()
    assert calls == [(6, 7), (0, 1)]  # an index makes its one row; an empty slice none


def test_what_is_shown_is_read_in_one_pass():
    # The terminal and markdown reports read a pod's rows once (each read makes them again).
    from tpudiag.model.report import OpsShown

    calls: list = []
    rows = [*_rows(5, calls)]
    rows[1] = dataclasses.replace(rows[1], family="all-reduce")
    rows[3] = dataclasses.replace(rows[3], family="all-gather", step_self_time_ps=1.0)
    calls.clear()
    lazy = OpRows(5, lambda start, stop: calls.append((start, stop)) or rows[start:stop])
    shown = OpsShown.of(lazy, top=2)
    assert len(calls) == 1
    assert [o.name for o in shown.compute] == ["fusion.0", "fusion.2"] and shown.n_compute == 3
    assert [o.name for o in shown.collectives] == ["fusion.1", "fusion.3"] and shown.n_collectives == 2
    assert shown.per_step
    assert not OpsShown.of(rows[:1], top=2).per_step
