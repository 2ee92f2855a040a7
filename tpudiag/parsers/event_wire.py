"""Trace events read straight from their wire bytes, by the compiled `_wire` module.

Reading events through protobuf objects costs 1.5-2 µs each (an object per event and per stat);
a TPU host of millions of op events spent most of its parse there. `_wire` (C, built with the
package where a compiler is found) splits an XSpace into planes and a plane into lines without
copying them (`split_field`), reads the few fields the parser needs of each event (`metadata_id`,
`offset_ps`, `duration_ps`, the device timespan stats and the `hlo_op` key of async events) from
the serialized XLine in one pass, into numpy columns (`decode_line`), reads chosen stats of every
event the same way (`decode_stats`, for the allocator's events of `tpudiag memory`), nests a
line's events (`nest`) and finds which events hold others or lie inside a collective (`nesting`,
for the digest's collective windows).

It is exact, not approximate: it reads only what it can read as upb would, and answers None (the
caller then reads the line through protobuf, the reference path in `device_trace`) on anything
else: damaged framing, a known field with another wire type, a group, a timespan stat past
int64, a start that overflows int64, a non-ASCII string (upb checks UTF-8 in proto3 strings and
rejects the file) or a non-string key. Its semantics are the reference readers': last value wins
for a scalar; `offset_ps` and `num_occurrences` share a oneof, as do a stat's values; a stat's
integer is `uint64_value or int64_value`. `tests/parsers/test_event_wire.py` checks that both
paths give equal columns, on healthy and on mutated lines.

Without the module (no compiler at install) or with TPUDIAG_NO_WIRE=1, every line takes the
reference path.
"""

from __future__ import annotations

import os

import numpy as np

from tpudiag.parsers.xspace import parse_message
from tpudiag.proto import XLine, XLineHead

try:
    from tpudiag.parsers import _wire
except ImportError:  # built without a C compiler: protobuf reads every line
    _wire = None

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def available() -> bool:
    """Whether lines are read from their wire bytes (the module is built and not switched off)."""
    return _wire is not None and os.environ.get("TPUDIAG_NO_WIRE", "") in ("", "0")


def split_field(data, number: int) -> tuple[list[memoryview], bytes] | None:
    """The values of the length-delimited field `number` of the message in `data`, as views into
    `data` (no copy), and the message's other fields as bytes, to parse with protobuf as the
    message without that field. None where the framing is not plain, or without the module.

    An XSpace's planes and an XPlane's lines are most of a trace file: protobuf would copy each
    of them (once per level) before the events are read from them.
    """
    if not available():
        return None
    out = _wire.split_field(data, number)
    if out is None:
        return None
    spans, rest = out
    view = memoryview(data)
    return [view[a:b] for a, b in spans], rest


class RawLine:
    """A serialized XLine (an element of `XPlaneRawLines.lines`, or a view of one in its plane's
    bytes from `split_field`) that reads like an XLine: its
    header from the wire bytes (or through protobuf where they are not plain), its events as
    columns (`decode_line`) or, on first use of `events`, as protobuf objects.

    Errors name no file (`path` None); the host boundary in `parsers.capture` adds it.
    """

    __slots__ = ("data", "name", "timestamp_ns", "n_events", "_line")

    def __init__(self, data: bytes | memoryview):
        self.data = data
        self._line = None
        head = _wire.scan_line(data) if available() else None
        if head is None:
            line = parse_message(XLineHead(), data, None)
            self.name, self.timestamp_ns, self.n_events = line.name, line.timestamp_ns, -1
        else:
            self.n_events, self.name, self.timestamp_ns = head

    @property
    def events(self):
        if self._line is None:
            self._line = parse_message(XLine(), self.data, None)
        return self._line.events


def decode_line(line: RawLine, off_id: int | None, dur_id: int | None, key_id: int | None, base_ps: int):
    """(metadata ids, starts, durations, key kinds, key hashes, key starts, key lengths) of the
    events of `line`, or None where only protobuf may read them. Without `key_id` the key columns
    are empty.

    Starts are `base_ps` plus the event's offset, or its `device_offset_ps` stat (`off_id`) when
    both timespan stats (`off_id`, `dur_id`) exist in the plane. Key kind 1 marks an event whose first `key_id` stat is a non-empty
    string, `data[key_start:key_start + key_len]`; kind 0 events are keyed by their metadata id.
    """
    n = line.n_events
    ids = [-1 if i is None else i for i in (off_id, dur_id, key_id)]
    if n < 0 or not available() or not all(_INT64_MIN <= i <= _INT64_MAX for i in (*ids, base_ps)):
        return None
    # Without a key the module reads no key columns (one built before that needs them whole).
    k = n if key_id is not None or not getattr(_wire, "KEYLESS_COLUMNS", 0) else 0
    cols = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64), np.empty(k, np.int8),
            np.empty(k, np.uint64), np.empty(k, np.int64), np.empty(k, np.int64))
    timed = off_id is not None and dur_id is not None
    if not _wire.decode_events(line.data, n, *cols, timed, ids[0], ids[1], key_id is not None, ids[2], base_ps):
        return None
    return cols


def decode_stats(line: RawLine, stat_ids: np.ndarray):
    """(metadata ids, offsets, values, lengths, kinds, seqs) of the events of `line` and, per event
    (row) and stat id of `stat_ids` (column), the stat's value as `_wire.decode_stats` gives it:
    kinds are the XStat value's field number (2 double bits, 3 uint64, 4 int64, 5 string at
    `data[value:value + length]`, 7 ref id), seqs its 1-based position among the event's stats
    (0: absent). Offsets are `offset_ps`, 0 where `num_occurrences` replaced it. None where only
    protobuf may read the line.
    """
    n = line.n_events
    # A module built before decode_stats existed (an in-place build not redone) reads through protobuf.
    if n < 0 or not available() or not hasattr(_wire, "decode_stats"):
        return None
    k = len(stat_ids)
    cols = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty((n, k), np.int64), np.empty((n, k), np.int64),
            np.empty((n, k), np.int8), np.empty((n, k), np.int32))
    ids = np.ascontiguousarray(stat_ids, dtype=np.int64)
    if not _wire.decode_stats(line.data, n, ids, *cols):
        return None
    return cols


def intern_keys(data: bytes, mids: np.ndarray, kinds: np.ndarray, hashes: np.ndarray, starts: np.ndarray,
                lengths: np.ndarray):
    """(codes, keys) of the events' keys (`decode_line`): keys in order of first appearance, each
    an event's string (kind 1) or else its metadata id. None when two different strings share a
    hash (the caller then takes the reference path)."""
    n = len(mids)
    if len(kinds) != n:  # read without a key (empty key columns): every event is keyed by its metadata id
        kinds, hashes = np.zeros(n, np.int8), np.zeros(n, np.uint64)
        starts = lengths = np.zeros(n, np.int64)
    value = np.where(kinds == 1, hashes, mids.view(np.uint64))
    order = np.lexsort((value, kinds))  # stable: the first of each group is its first appearance
    sorted_kinds, sorted_values = kinds[order], value[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (sorted_kinds[1:] != sorted_kinds[:-1]) | (sorted_values[1:] != sorted_values[:-1])
    first = order[new]
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    codes = np.empty(n, dtype=np.int64)
    codes[order] = rank[np.cumsum(new) - 1]
    rep = first[np.argsort(rank)]  # the first event of each code, by code
    if not _wire.same_strings(data, kinds, starts, lengths, np.ascontiguousarray(rep[codes])):
        return None
    keys = [bytes(data[starts[i]:starts[i] + lengths[i]]).decode("ascii") if kinds[i] == 1 else int(mids[i])
            for i in rep.tolist()]
    return codes, keys


def nest(starts: np.ndarray, durs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """`model.intervals.nest` of one line (self time, depth, partial overlaps) by the compiled
    stack walk; None where it declines (no module, an end past int64, nesting deeper than int16)."""
    if not available():
        return None
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    durs = np.ascontiguousarray(durs, dtype=np.int64)
    self_ps = np.empty(len(starts), dtype=np.int64)
    depth = np.empty(len(starts), dtype=np.int16)
    partial = _wire.nest(starts, durs, self_ps, depth)
    return None if partial < 0 else (self_ps, depth, partial)


def nesting(device_codes: np.ndarray, depth: np.ndarray, is_coll: np.ndarray,
            order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """`analysis.collective_windows.nesting_facts`' (has a nested event, lies inside a collective)
    per event by one compiled walk in `order` (None: the rows' own); None where it declines (no
    module, or an index or depth out of range)."""
    if not available() or not hasattr(_wire, "nesting"):
        return None
    for codes, dtype in ((device_codes, np.int32), (depth, np.int16)):  # cast below without wrapping around
        if codes.dtype.itemsize > np.dtype(dtype).itemsize and len(codes) and not (
                np.iinfo(dtype).min <= codes.min() and codes.max() <= np.iinfo(dtype).max):
            return None
    n = len(depth)
    has_child = np.zeros(n, dtype=bool)
    in_coll = np.zeros(n, dtype=bool)
    walk = np.zeros(0, dtype=np.int64) if order is None else np.ascontiguousarray(order, dtype=np.int64)
    if not _wire.nesting(np.ascontiguousarray(device_codes, dtype=np.int32), np.ascontiguousarray(depth, dtype=np.int16),
                         np.ascontiguousarray(is_coll, dtype=bool), walk, has_child, in_coll):
        return None
    return has_child, in_coll
