"""The compiled event reader (`parsers.event_wire`, C module `_wire`) against the protobuf reference.

For any bytes, reading a line from its wire bytes (`RawLine`) must give what protobuf objects
give (`XLine`): equal columns, or the same failure. The reader may decline (then the reference
reads the line), never differ. Checked on lines of a realistic capture, on hand-made edge cases
of the wire format, and on thousands of mutated lines.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rules import scenarios as sc
from tpudiag.errors import InputError
from tpudiag.model.intervals import nest_walk
from tpudiag.parsers import event_wire
from tpudiag.parsers.capture import _parse_file
from tpudiag.parsers.device_trace import _read_async_line, _read_line
from tpudiag.parsers.event_wire import RawLine
from tpudiag.proto import XLine, XPlaneRawLines, XSpaceRawPlanes

OFF, DUR, HLO_OP = 18, 19, 21  # stat metadata ids of device_offset_ps, device_duration_ps, hlo_op

pytestmark = pytest.mark.skipif(
    not event_wire.available() and not os.environ.get("TPUDIAG_REQUIRE_WIRE"),
    reason="the compiled event reader `tpudiag.parsers._wire` is not built here (no C compiler at install)")


def test_module_is_built_where_required():
    # CI sets TPUDIAG_REQUIRE_WIRE: there the fast path must exist, or every test here would be moot.
    assert event_wire.available(), "tpudiag.parsers._wire did not build; is a C compiler installed?"


def _outcome(read):
    try:
        return "ok", read()
    except (InputError, DecodeError, OverflowError) as exc:
        return "error", type(exc).__name__


def _reference_line(data: bytes):
    line = XLine()
    line.ParseFromString(data)
    return line


def _both(data: bytes, reader, *args):
    """(wire outcome, reference outcome) of `reader` on the line `data`."""
    wire = _outcome(lambda: reader(RawLine(data), *args))
    ref = _outcome(lambda: reader(_reference_line(data), *args))
    return wire, ref


def _assert_same(wire, ref):
    assert wire[0] == ref[0], (wire, ref)
    if wire[0] == "error":
        return
    for got, want in zip(wire[1], ref[1]):
        if isinstance(want, dict):
            assert got == want and list(got) == list(want)
        else:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype


def _check(data: bytes) -> None:
    for args in ((OFF, DUR, 0), (None, None, 7), (OFF, None, 0)):
        _assert_same(*_both(data, _read_line, *args))
    for args in ((OFF, DUR, HLO_OP, 0), (None, None, HLO_OP, 3), (OFF, DUR, None, 0)):
        _assert_same(*_both(data, _read_async_line, *args))


# -- a tiny wire encoder, for lines protobuf's own serializer would never write -------------------

def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    tag = _varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + _varint(payload)
    if wire_type == 2:
        return tag + _varint(len(payload)) + payload
    return tag + payload


def _stat(mid: int, *value: bytes) -> bytes:
    return _field(4, 2, _field(1, 0, mid) + b"".join(value))


def _event(*fields: bytes) -> bytes:
    return _field(4, 2, b"".join(fields))


def _line(*events: bytes, timestamp_ns: int = 5) -> bytes:
    return _field(2, 2, b"XLA Ops") + _field(3, 0, timestamp_ns) + b"".join(events)


def _timed(mid, off, dur, *more):
    return _event(_field(1, 0, mid), _stat(OFF, _field(3, 0, off)), _stat(DUR, _field(3, 0, dur)), *more)


EDGE_CASES = {
    "plain": _line(_timed(1, 10, 5), _timed(2, 20, 5)),
    "no stats: own offset and duration": _line(_event(_field(1, 0, 3), _field(2, 0, 40), _field(3, 0, 9))),
    "num_occurrences clears offset_ps": _line(_event(_field(2, 0, 40), _field(5, 0, 2), _field(3, 0, 9))),
    "offset_ps after num_occurrences": _line(_event(_field(5, 0, 2), _field(2, 0, 40), _field(3, 0, 9))),
    "timespan stats not first: the last of each wins": _line(_event(
        _field(1, 0, 4), _stat(99, _field(4, 0, 1)), _stat(OFF, _field(3, 0, 7)), _stat(DUR, _field(4, 0, 3)),
        _stat(OFF, _field(4, 0, 11)))),
    "first two stats win over later ones": _line(_timed(1, 10, 5, _stat(OFF, _field(3, 0, 99)))),
    "negative device offset: own timespan": _line(_event(
        _field(2, 0, 40), _field(3, 0, 9), _stat(99, b""), _stat(OFF, _field(4, 0, -5)), _stat(DUR, _field(3, 0, 2)))),
    "negative duration": _line(_timed(1, 10, -5)),
    "uint64 past int64 in a timespan stat": _line(_timed(1, 1 << 63, 5)),
    "uint64 past int64 elsewhere": _line(_timed(1, 10, 5, _stat(77, _field(3, 0, (1 << 64) - 1)))),
    "start overflows int64": _line(_timed(1, (1 << 63) - 10, 5), timestamp_ns=1),
    "a double replaces the uint64 (one oneof)": _line(_event(
        _stat(OFF, _field(3, 0, 7), _field(2, 1, b"\0" * 8)), _stat(DUR, _field(3, 0, 2)))),
    "string hlo_op keys": _line(_timed(1, 1, 1, _stat(HLO_OP, _field(5, 2, b"all-gather-start.1"))),
                                _timed(2, 2, 1, _stat(HLO_OP, _field(5, 2, b"all-gather-done.1"))),
                                _timed(1, 3, 1, _stat(HLO_OP, _field(5, 2, b"all-gather-start.1")))),
    "empty hlo_op: keyed by metadata": _line(_timed(5, 1, 1, _stat(HLO_OP, _field(5, 2, b""))), _timed(5, 2, 1)),
    "only the first hlo_op counts": _line(_timed(1, 1, 1, _stat(HLO_OP, _field(5, 2, b"a")),
                                                 _stat(HLO_OP, _field(5, 2, b"b")))),
    "integer hlo_op": _line(_timed(1, 1, 1, _stat(HLO_OP, _field(4, 0, 42)))),
    "non-ASCII hlo_op": _line(_timed(1, 1, 1, _stat(HLO_OP, _field(5, 2, "é".encode())))),
    "invalid UTF-8 in a stat": _line(_timed(1, 1, 1, _stat(33, _field(5, 2, b"\xff\xfe")))),
    "unknown fields of every wire type": _line(_event(
        _field(1, 0, 2), _field(9, 0, 1), _field(10, 1, b"\0" * 8), _field(11, 5, b"\0" * 4), _field(12, 2, b"xy"),
        _stat(OFF, _field(3, 0, 1), _field(15, 2, b"z")), _stat(DUR, _field(3, 0, 1)))),
    "a group": _line(_event(_field(1, 0, 2), _varint(13 << 3 | 3) + _varint(13 << 3 | 4))),
    "a known field with another wire type": _line(_event(_field(1, 2, b"ab"))),
    "events with another wire type": _line(_field(4, 0, 5)),
    "truncated": _line(_timed(1, 10, 5))[:-3],
    "length past the end": _line(_timed(1, 10, 5)) + _varint(4 << 3 | 2) + _varint(50),
    "field number 0": _line(_timed(1, 10, 5)) + _varint(0) + _varint(1),
    "10-byte varint beyond 64 bits": _line(_event(_varint(1 << 3) + b"\xff" * 9 + b"\x7f")),
    "non-ASCII line name": _field(2, 2, "Opé".encode()) + _timed(1, 1, 1),
    "no events": _line(),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_cases_read_as_protobuf_reads_them(name):
    _check(EDGE_CASES[name])


def test_string_keys_interned_in_order_of_first_appearance():
    starts, durs, codes, index = _read_async_line(RawLine(EDGE_CASES["string hlo_op keys"]), OFF, DUR, HLO_OP, 0)
    assert list(index) == ["all-gather-start.1", "all-gather-done.1"]
    assert codes.tolist() == [0, 1, 0]


def test_the_fast_path_is_taken_on_plain_lines():
    # If it always declined, every equality above would hold trivially.
    line = RawLine(EDGE_CASES["string hlo_op keys"])
    assert line.n_events == 3 and line.name == "XLA Ops" and line.timestamp_ns == 5
    assert event_wire.decode_line(line, OFF, DUR, HLO_OP, 0) is not None


def _write_capture(tmp_path: Path) -> Path:
    """One host of 2 chips x 3 steps: a layer loop (a `while` holding fusions and async all-gathers,
    one hidden, one adjacent) and a synchronous all-reduce; the writers add the `Async XLA Ops`,
    `Steps` and `XLA Modules` lines."""
    us = sc.US

    def schedule(chip: int, step: int) -> list[sc.Placed]:
        out = [sc.Placed(sc.LOOP_OP.name, 0, 4_000 * us)]
        for layer in range(4):
            t = layer * 1_000 * us
            out += [sc.Placed("all-gather-start.2", t, 10 * us), sc.Placed("fusion.2", t + 10 * us, 500 * us),
                    sc.Placed("all-gather-done.2", t + 510 * us, 10 * us),
                    sc.Placed("all-gather-start.1", t + 520 * us, 10 * us),
                    sc.Placed("all-gather-done.1", t + 530 * us, 200 * us),
                    sc.Placed("fusion.1", t + 730 * us, 250 * us)]
        return out + [sc.Placed("all-reduce.4", 4_100 * us, 600 * us)]

    design = sc.design(sc.COLLECTIVE_OPS + (sc.LOOP_OP,), schedule, step_ps=6_000 * us, line_timestamp_ns=1_000)
    return next(sc.write_run(design, tmp_path).glob("*.xplane.pb"))


def _capture_lines(tmp_path: Path) -> list[tuple[bytes, dict[str, int]]]:
    raw = XSpaceRawPlanes.FromString(_write_capture(tmp_path).read_bytes())
    out = []
    for plane_bytes in raw.planes:
        plane = XPlaneRawLines.FromString(plane_bytes)
        ids = {md.name: k for k, md in plane.stat_metadata.items()}
        out.extend((line, ids) for line in plane.lines)
    return out


def test_capture_lines_and_their_mutations(tmp_path):
    lines = _capture_lines(tmp_path)
    assert sum(RawLine(data).n_events for data, _ in lines) > 200
    rng = random.Random(12)
    taken = 0
    for data, ids in lines:
        off, dur, hlo_op = ids.get("device_offset_ps"), ids.get("device_duration_ps"), ids.get("hlo_op")
        _assert_same(*_both(data, _read_line, off, dur, 0))
        _assert_same(*_both(data, _read_async_line, off, dur, hlo_op, 0))
        taken += event_wire.decode_line(RawLine(data), off, dur, hlo_op, 0) is not None
        for _ in range(150):  # flipped bytes, cuts and splices: all must read as protobuf reads them
            mutated = bytearray(data[:4000])
            how = rng.random()
            if how < 0.6:
                for _ in range(rng.randint(1, 4)):
                    mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            elif how < 0.8:
                mutated = mutated[:rng.randrange(len(mutated))]
            else:
                at = rng.randrange(len(mutated))
                mutated[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
            _assert_same(*_both(bytes(mutated), _read_line, off, dur, 0))
            _assert_same(*_both(bytes(mutated), _read_async_line, off, dur, hlo_op, 0))
    assert taken == len(lines)  # every healthy line took the fast path


def test_host_tables_equal_with_and_without_the_reader(tmp_path, monkeypatch):
    path = _write_capture(tmp_path)
    fast = _parse_file(path)
    monkeypatch.setenv("TPUDIAG_NO_WIRE", "1")
    assert not event_wire.available()
    slow = _parse_file(path)
    for table in ("events", "op_metadata", "step_markers", "modules", "async_windows"):
        a, b = getattr(fast, table), getattr(slow, table)
        assert a.columns.tolist() == b.columns.tolist()
        assert a.dtypes.tolist() == b.dtypes.tolist()
        assert a.equals(b), table
    assert fast.warnings == slow.warnings


def test_a_hash_collision_declines_to_the_reference():
    line = RawLine(EDGE_CASES["string hlo_op keys"])
    mids, starts, durs, kinds, hashes, key_starts, key_lengths = event_wire.decode_line(line, OFF, DUR,
                                                                                        HLO_OP, 0)
    assert event_wire.intern_keys(line.data, mids, kinds, hashes, key_starts, key_lengths) is not None
    hashes[:] = 1  # as if the two different names had one hash
    assert event_wire.intern_keys(line.data, mids, kinds, hashes, key_starts, key_lengths) is None


def test_op_lines_are_read_without_key_columns():
    # Op lines are read without a key: the module fills only the first three columns (the key ones
    # are empty), and they equal what a read with a key gives; the async reader keys them by id.
    line = RawLine(EDGE_CASES["string hlo_op keys"])
    keyed = event_wire.decode_line(line, OFF, DUR, HLO_OP, 0)
    keyless = event_wire.decode_line(line, OFF, DUR, None, 0)
    for got, want in zip(keyless[:3], keyed[:3]):
        np.testing.assert_array_equal(got, want)
    if event_wire._wire is not None and getattr(event_wire._wire, "KEYLESS_COLUMNS", 0):
        assert [len(c) for c in keyless[3:]] == [0, 0, 0, 0]
    codes, keys = event_wire.intern_keys(line.data, keyless[0], *keyless[3:])
    assert keys == list(dict.fromkeys(keyless[0].tolist()))  # metadata ids, in order of appearance


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 600)), min_size=0, max_size=80))
def test_compiled_nest_equals_the_stack_walk(ivs):
    # Random lines, sorted as a line is read: nested, disjoint, zero-length, equal and partial events.
    ivs = sorted(ivs, key=lambda t: (t[0], -t[1]))
    start = np.array([a for a, _ in ivs], dtype=np.int64)
    dur = np.array([d for _, d in ivs], dtype=np.int64)
    got, want = event_wire.nest(start, dur), nest_walk(start, dur)
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype
    assert got[2] == want[2]


def test_compiled_nest_declines_what_python_must_judge():
    deep = 40_000  # deeper than int16 depths hold
    assert event_wire.nest(np.arange(deep, dtype=np.int64), np.arange(2 * deep, deep, -1, dtype=np.int64)) is None
    assert event_wire.nest(np.array([2**62, 2**62 + 1]), np.array([2**62, 5])) is None  # an end past int64


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(-1, 4), st.booleans()), max_size=60),
       st.randoms(use_true_random=False))
def test_compiled_nesting_equals_the_level_passes(rows, rnd):
    # Random events in any row order: devices, tied starts, depths with gaps and below 0, collectives.
    from tpudiag.analysis.collective_windows import nesting_facts

    rnd.shuffle(rows)
    dev, start, depth, coll = (np.array(c) for c in zip(*rows)) if rows else (np.zeros(0, int),) * 4
    args = (dev.astype(np.int8), start.astype(np.int64), depth.astype(np.int16), coll.astype(bool))
    compiled = nesting_facts(*args)
    os.environ["TPUDIAG_NO_WIRE"] = "1"
    try:
        levels = nesting_facts(*args)
    finally:
        del os.environ["TPUDIAG_NO_WIRE"]
    for got, want in zip(compiled, levels):
        np.testing.assert_array_equal(got, want)


def test_compiled_nesting_declines_what_it_cannot_index():
    one = np.zeros(2, dtype=bool)
    assert event_wire.nesting(np.zeros(2, np.int32), np.array([0, 40_000]), one, None) is None  # past int16
    assert event_wire.nesting(np.zeros(2, np.int32), np.array([0, 1], np.int16), one, np.array([0, 2])) is None
    assert event_wire.nesting(np.zeros(2, np.int32), np.array([0, 1], np.int16), one, np.array([-1, 0])) is None


def test_op_metadata_decoded_once_are_the_same_as_decoded_anew(tmp_path, monkeypatch):
    # Metadata are cached per process across cores and hosts; a cold cache must give equal tables.
    from tpudiag.parsers import device_trace

    path = _write_capture(tmp_path)
    _parse_file(path)  # fills the cache
    assert device_trace._META_CACHE
    warm = _parse_file(path)
    monkeypatch.setattr(device_trace, "_META_CACHE", {})
    cold = _parse_file(path)
    assert warm.op_metadata.equals(cold.op_metadata) and warm.warnings == cold.warnings


def _split_outcome(data: bytes, number: int, message):
    """What protobuf makes of `data` read whole, and of its split (None where the reader declines):
    both must succeed or fail alike, and the split values must be the field's values."""
    whole = _outcome(lambda: list(getattr(message.FromString(data), "planes" if number == 1 else "lines")))
    split = event_wire.split_field(data, number)
    if split is None:
        return whole, None
    views, rest = split
    parsed = _outcome(lambda: message.FromString(rest))
    return whole, (parsed[0], [bytes(v) for v in views])


def test_split_planes_and_lines_equal_protobufs(tmp_path):
    data = _write_capture(tmp_path).read_bytes()
    whole, split = _split_outcome(data, 1, XSpaceRawPlanes)
    assert whole[0] == "ok" and split == ("ok", whole[1])
    for plane in whole[1]:
        lines_whole, lines_split = _split_outcome(plane, 3, XPlaneRawLines)
        assert lines_split == ("ok", lines_whole[1])
        rest = XPlaneRawLines.FromString(event_wire.split_field(plane, 3)[1])
        full = XPlaneRawLines.FromString(plane)
        assert rest.name == full.name and dict(rest.stat_metadata) == dict(full.stat_metadata)
        assert not rest.lines


def test_split_of_mutated_planes_fails_as_protobuf_fails(tmp_path):
    data = _write_capture(tmp_path).read_bytes()
    planes = list(XSpaceRawPlanes.FromString(data).planes)
    rng = random.Random(5)
    split_ok = 0
    for i in range(600):
        number, message, source = (1, XSpaceRawPlanes, data) if i % 2 else (3, XPlaneRawLines, rng.choice(planes))
        mutated = bytearray(source)
        for _ in range(rng.randint(1, 3)):  # flipped bytes: in a length, a tag, a name or a value
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        if rng.random() < 0.2:
            mutated = mutated[:rng.randrange(len(mutated))]
        whole, split = _split_outcome(bytes(mutated), number, message)
        if split is None:
            continue
        split_ok += split[0] == "ok"
        assert split[0] == whole[0], (whole, split)
        if whole[0] == "ok":
            assert split[1] == whole[1]
    assert split_ok > 100  # had the reader always declined, this would prove nothing
