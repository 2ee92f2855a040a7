"""The allocator's events of a host file: the `/host:CPU` events XProf builds its memory profile from.

TSL's allocators trace each allocation and deallocation as a TraceMe named `MemoryAllocation` /
`MemoryDeallocation` on a host thread, with stats (names as in openxla/xla
`xla/tsl/profiler/utils/xplane_schema.cc`): `allocator_name` (or `index_on_host` /
`device_ordinal`) naming the memory space, `bytes_allocated`, `bytes_reserved`,
`bytes_available`, `fragmentation`, `peak_bytes_in_use` (the allocator's state after the event),
`requested_bytes`, `allocation_bytes`, `addr`, and where the producer knows them `tf_op`,
`group_id`, `region_type`, `data_type`, `shape`. XProf reads them in
`ConvertXPlaneToMemoryProfile` (openxla/xprof `xprof/convert/xplane_to_memory_profile.cc`).

Only `tpudiag memory` reads them, so the normal parse does not: this reads the file's plane
headers (for the host's time axis, docs/time-axis.md, so that times read as `tpudiag report`
places host events), then only the `/host:CPU` plane. Each line's events and the stats above are read from
their wire bytes by the compiled reader (`event_wire.decode_stats`: 200k events in about 2 s on a
loaded 2-core machine, where protobuf objects took 6.5 s), else through protobuf
(`_line_from_protobuf`, the reference `tests/parsers/test_allocator_events.py` holds it to).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.errors import InputError
from tpudiag.model import schemas
from tpudiag.model.allocator import HostAllocatorEvents
from tpudiag.model.units import MAX_PLAUSIBLE_BYTES, MAX_PLAUSIBLE_TEXT
from tpudiag.parsers import event_wire
from tpudiag.parsers.capture import PlaneRoles, plane_roles, read_location_bytes, split_lines, split_planes
from tpudiag.parsers.capture_files import HostUrl
from tpudiag.parsers.time_axis import TimeAxis, unplaceable
from tpudiag.parsers.xspace import check_trace_bytes

HOST_PLANE = "/host:CPU"
ALLOCATION, DEALLOCATION = "MemoryAllocation", "MemoryDeallocation"
_INT64_MAX = (1 << 63) - 1

# Stat name -> column, for the integer stats; XProf reads each with `IntValue` (int64 or uint64).
_INT_STATS = {
    "bytes_allocated": "heap_bytes", "bytes_reserved": "stack_bytes", "bytes_available": "free_bytes",
    "peak_bytes_in_use": "lifetime_peak_bytes", "requested_bytes": "requested_bytes",
    "allocation_bytes": "allocation_bytes", "addr": "address", "group_id": "step_id",
    "data_type": "data_type",
}
_STR_STATS = {"tf_op": "op", "region_type": "region_type", "shape": "shape"}
_MEMORY_ID_INT_STATS = ("index_on_host", "device_ordinal")
_BYTE_COLUMNS = ("heap_bytes", "stack_bytes", "free_bytes", "lifetime_peak_bytes", "requested_bytes",
                 "allocation_bytes")
# The wire reader's columns grow with the stat ids it reads: past this many (several stat metadata
# entries sharing a name) a line is read through protobuf, whose cost is its stats, not events x ids.
_MAX_WIRE_STAT_IDS = 2 * (len(_INT_STATS) + len(_STR_STATS) + len(_MEMORY_ID_INT_STATS) + 2)


def read_allocator_events(path: Path | HostUrl) -> HostAllocatorEvents:
    """The allocator events of one host file (an empty table when it has none)."""
    try:
        return _read(path)
    except InputError as exc:
        if exc.path is not None:
            raise
        raise InputError(exc.message, path=path, hint=exc.hint) from exc  # raised below the file's level


def _read(path: Path | HostUrl) -> HostAllocatorEvents:
    data = [read_location_bytes(path)]
    check_trace_bytes(data[0], path)
    planes, host = split_planes(data.pop(), path)
    return allocator_events_of_planes(planes, plane_roles(planes, path), path, host)


def allocator_events_of_planes(planes: list, roles: PlaneRoles, path: Path | HostUrl,
                               host: str) -> HostAllocatorEvents:
    """The allocator events of a host file already split into planes, on the host's time axis
    (`roles.axis`, as `tpudiag report` places host events): what the parse of the file reads in
    the same pass when `tpudiag memory` asks (`parsers.capture.PlaneReader`)."""
    at = next((i for i, name in enumerate(roles.names) if name == HOST_PLANE), None)
    if at is None:
        return HostAllocatorEvents(host=host, path=str(path), events=schemas.ALLOCATOR_EVENTS.empty())
    events, warnings = _host_plane_events(planes[at], path, roles.axis)
    return HostAllocatorEvents(host=host, path=str(path), events=events, warnings=tuple(warnings))


# How each stat is read: as XProf's `IntValue` (int64 or uint64, the same 64 bits read signed;
# 0 for other kinds), `StrOrRefValue` (a string, or the name of the stat metadata a ref names;
# "" for other kinds) and `DoubleValue`. `_ID` is an integer memory id, kept as its decimal text.
_INT, _TEXT, _ID, _ID_TEXT, _DOUBLE = range(5)
_COLUMNS = [c for c in schemas.ALLOCATOR_EVENTS.names if c not in ("allocation", "time_ps", "thread", "annotation")]
_TEXT_COLUMNS = (*_STR_STATS.values(), "allocator")
_DEFAULTS = [{"step_id": -1, "fragmentation": 0.0}.get(c, "" if c in _TEXT_COLUMNS else 0) for c in _COLUMNS]
_DTYPES = [object if c in _TEXT_COLUMNS else (np.float64 if c == "fragmentation" else np.int64) for c in _COLUMNS]


def _stat_readers(stat_names: dict[int, str]) -> dict[int, tuple[int, int]]:
    """Stat metadata id -> (column index, how to read it), for the stats tpudiag reads."""
    out = {}
    for sid, name in stat_names.items():
        if name in _INT_STATS:
            out[sid] = (_COLUMNS.index(_INT_STATS[name]), _INT)
        elif name in _STR_STATS:
            out[sid] = (_COLUMNS.index(_STR_STATS[name]), _TEXT)
        elif name == "allocator_name":
            out[sid] = (_COLUMNS.index("allocator"), _ID_TEXT)
        elif name in _MEMORY_ID_INT_STATS:
            out[sid] = (_COLUMNS.index("allocator"), _ID)
        elif name == "fragmentation":
            out[sid] = (_COLUMNS.index("fragmentation"), _DOUBLE)
    return out


class _Plane:
    """What reading a line's allocator events needs of its plane."""

    def __init__(self, kinds: dict[int, bool], stat_names: dict[int, str]):
        self.kinds = kinds  # event metadata id -> True for an allocation, False for a deallocation
        self.wanted = np.fromiter(kinds, dtype=np.int64, count=len(kinds))
        self.allocation_ids = np.array([m for m, alloc in kinds.items() if alloc], dtype=np.int64)
        self.stat_names = stat_names
        self.readers = _stat_readers(stat_names)
        self.stat_ids = np.fromiter(self.readers, dtype=np.int64, count=len(self.readers))


def _host_plane_events(plane_bytes, path, axis: TimeAxis) -> tuple[pd.DataFrame, list[str]]:
    """The plane's allocator events on `axis`, and warnings for what could not be placed on it."""
    plane, lines = split_lines(plane_bytes, path)
    kinds = {mid: md.name == ALLOCATION for mid, md in plane.event_metadata.items()
             if md.name in (ALLOCATION, DEALLOCATION)}
    if not kinds:
        return schemas.ALLOCATOR_EVENTS.empty(), []
    p = _Plane(kinds, {sid: md.name for sid, md in plane.stat_metadata.items()})
    parts, warnings, dropped, implausible = [], [], 0, 0
    for line in lines:
        part = _line_from_wire(line, p)
        if part is None:
            part = _line_from_protobuf(line, p)
        if not len(part["allocation"]):
            continue
        part["annotation"] = _annotations(line, plane.event_metadata, p, part["offsets"])
        base = axis.base_ps(line.timestamp_ns)
        if base is None:
            warnings.append(unplaceable(line.name, HOST_PLANE))
            continue
        # base is within ±2^62, so these bounds fit int64: events whose time would not are dropped.
        offsets = part.pop("offsets")
        keep = (offsets <= _INT64_MAX - base) & (offsets >= -_INT64_MAX - 1 - base)
        dropped += int((~keep).sum())
        # A negative byte count, or one past any memory (INT64_MAX, a uint64 read signed), is damage:
        # shown, it would make a negative or wrapped peak.
        plausible = np.logical_and.reduce([(part[c] >= 0) & (part[c] <= MAX_PLAUSIBLE_BYTES) for c in _BYTE_COLUMNS])
        implausible += int((keep & ~plausible).sum())
        keep &= plausible
        part = {c: v[keep] for c, v in part.items()}
        part["time_ps"] = offsets[keep] + np.int64(base)
        parts.append(part)
    if dropped:
        warnings.append(f"{dropped} allocator events dropped: their offset puts them beyond the int64 "
                        "picosecond range (damaged timestamps)")
    if implausible:
        warnings.append(f"{implausible} allocator events dropped: a byte count negative or past "
                        f"{MAX_PLAUSIBLE_TEXT} (damaged stats)")
    if not parts:
        return schemas.ALLOCATOR_EVENTS.empty(), warnings
    return schemas.ALLOCATOR_EVENTS.frame({c: np.concatenate([part[c] for part in parts])
                                           for c in schemas.ALLOCATOR_EVENTS.names}), warnings


# The enclosing event that names the program an allocation was made for (JAX: `PjitFunction(f)`).
_PROGRAM_EVENT = re.compile(r"^(PjitFunction\(|jit_|pjit)")


def _annotations(line, event_metadata, p: _Plane, offsets: np.ndarray) -> np.ndarray:
    """Per allocator event of `line` (at `offsets`), the host events enclosing it on the same line:
    the jit function it ran in and the innermost (`PjitFunction(loss_fn) › Build buffer
    allocations`); '' where none encloses it. One sweep over the line's events in time order."""
    decoded = event_wire.decode_line(line, None, None, None, 0) if isinstance(line, event_wire.RawLine) else None
    if decoded is not None:
        mids, starts, durs = decoded[0], decoded[1], decoded[2]
    else:
        evs = list(line.events)
        mids = np.fromiter((e.metadata_id for e in evs), dtype=np.int64, count=len(evs))
        starts = np.fromiter((e.offset_ps for e in evs), dtype=np.int64, count=len(evs))
        durs = np.fromiter((e.duration_ps for e in evs), dtype=np.int64, count=len(evs))
    keep = (durs > 0) & ~np.isin(mids, p.wanted)
    mids, starts, ends = mids[keep], starts[keep], starts[keep] + durs[keep]
    order = np.argsort(starts, kind="stable")
    names = {int(m): event_metadata[int(m)].name if int(m) in event_metadata else "" for m in np.unique(mids)}
    out = np.full(len(offsets), "", dtype=object)
    stack: list[tuple[int, str]] = []  # (end, name) of the events open at the sweep's time
    i = 0
    for k in np.argsort(offsets, kind="stable").tolist():
        t = int(offsets[k])
        while i < len(order) and starts[order[i]] <= t:
            j = int(order[i])
            i += 1
            while stack and stack[-1][0] < starts[j]:
                stack.pop()
            stack.append((int(ends[j]), names[int(mids[j])]))
        while stack and stack[-1][0] < t:
            stack.pop()
        if stack:
            program = next((name for end, name in stack if end >= t and _PROGRAM_EVENT.match(name)), "")
            inner = stack[-1][1]
            out[k] = f"{program} › {inner}" if program and program != inner else inner
    return out


def _line_part(line, columns: list, allocation, offsets) -> dict:
    part = dict(zip(_COLUMNS, columns))
    part.update(allocation=np.asarray(allocation, dtype=bool), offsets=np.asarray(offsets, dtype=np.int64),
                thread=np.full(len(allocation), line.name, dtype=object))
    return part


def _line_from_protobuf(line, p: _Plane) -> dict:
    """The reference reader: the line's events as protobuf objects."""
    rows, allocation, offsets = [], [], []
    for ev in line.events:
        kind = p.kinds.get(ev.metadata_id)
        if kind is None:
            continue
        row = _DEFAULTS.copy()
        for stat in ev.stats:  # the last of repeated stats wins, as in XProf's pass over them
            reader = p.readers.get(stat.metadata_id)
            if reader is None:
                continue
            col, how = reader
            if how == _INT or how == _ID:
                value = stat.int64_value or stat.uint64_value  # unset oneof fields read 0
                if value > _INT64_MAX:
                    value -= 1 << 64
                row[col] = value if how == _INT else str(value)
            elif how == _DOUBLE:
                row[col] = stat.double_value
            else:
                which = stat.WhichOneof("value")
                row[col] = (stat.str_value if which == "str_value"
                            else p.stat_names.get(stat.ref_value, "") if which == "ref_value" else "")
        rows.append(row)
        allocation.append(kind)
        offsets.append(ev.offset_ps)
    columns = [np.array([r[c] for r in rows], dtype=_DTYPES[c]) for c in range(len(_COLUMNS))]
    return _line_part(line, columns, allocation, offsets)


def _line_from_wire(line, p: _Plane) -> dict | None:
    """The same as `_line_from_protobuf`, from the line's wire bytes (`event_wire.decode_stats`);
    None where only protobuf may read the line."""
    if len(p.stat_ids) > _MAX_WIRE_STAT_IDS:
        return None
    decoded = event_wire.decode_stats(line, p.stat_ids)
    if decoded is None:
        return None
    mids, offsets, values, lengths, kinds, seqs = decoded
    rows = np.flatnonzero(np.isin(mids, p.wanted))  # events of other kinds are never looked at
    values, lengths, kinds, seqs = values[rows], lengths[rows], kinds[rows], seqs[rows]
    columns = []
    for c in range(len(_COLUMNS)):
        out = np.full(len(rows), _DEFAULTS[c], dtype=_DTYPES[c])
        last = np.zeros(len(rows), dtype=np.int32)  # of several stats feeding one column, the last wins
        for j, sid in enumerate(p.stat_ids.tolist()):
            col, how = p.readers[sid]
            take = seqs[:, j] > last
            if col != c or not take.any():
                continue
            out[take] = _read_values(how, values[take, j], lengths[take, j], kinds[take, j], line.data, p.stat_names)
            last[take] = seqs[take, j]
        columns.append(out)
    return _line_part(line, columns, np.isin(mids[rows], p.allocation_ids), offsets[rows])


def _read_values(how: int, values: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, data, stat_names):
    """One stat's values, as the reference reader reads them, from `decode_stats` columns."""
    if how in (_INT, _ID):
        ints = np.where((kinds == 3) | (kinds == 4), values, 0)
        return ints if how == _INT else np.array([str(v) for v in ints.tolist()], dtype=object)
    if how == _DOUBLE:
        return np.where(kinds == 2, values.view(np.float64), 0.0)
    out = np.full(len(values), "", dtype=object)
    refs = kinds == 7
    if refs.any():
        ids, inverse = np.unique(values[refs], return_inverse=True)
        out[refs] = np.array([stat_names.get(int(i), "") for i in ids], dtype=object)[inverse]
    for i in np.flatnonzero(kinds == 5).tolist():  # inline strings: ASCII, as `decode_stats` checked
        start = int(values[i])
        out[i] = bytes(data[start:start + int(lengths[i])]).decode("ascii")
    return out
