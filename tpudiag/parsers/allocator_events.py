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
headers, then only the `/host:CPU` plane, and only the lines that hold such events (the compiled
reader finds them from the events' metadata ids without decoding the rest).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpudiag.errors import InputError
from tpudiag.model import schemas
from tpudiag.model.allocator import HostAllocatorEvents
from tpudiag.parsers import event_wire
from tpudiag.parsers.capture import HostUrl, read_location_bytes, split_lines, split_planes
from tpudiag.parsers.xspace import check_trace_bytes, parse_message
from tpudiag.proto import XPlaneHead

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


def read_allocator_events(path: Path | HostUrl) -> HostAllocatorEvents:
    """The allocator events of one host file (an empty table when it has none)."""
    try:
        return _read(path)
    except InputError as exc:
        if exc.path is not None:
            raise
        raise InputError(exc.message, path=path, hint=exc.hint) from exc  # raised below the file's level
    except OverflowError as exc:
        raise InputError("implausible allocator event times (beyond the int64 picosecond range)", path=path) from exc


def _read(path: Path | HostUrl) -> HostAllocatorEvents:
    data = [read_location_bytes(path)]
    check_trace_bytes(data[0], path)
    planes, host = split_planes(data.pop(), path)
    plane_bytes = next((pb for pb in planes if _plane_name(pb, path) == HOST_PLANE), None)
    events = schemas.ALLOCATOR_EVENTS.empty() if plane_bytes is None else _host_plane_events(plane_bytes, path)
    return HostAllocatorEvents(host=host, path=str(path), events=events)


def _plane_name(plane_bytes, path) -> str:
    split = event_wire.split_field(plane_bytes, 3)  # XPlane.lines, left unread
    return parse_message(XPlaneHead(), plane_bytes if split is None else split[1], path).name


# How each stat is read (as XProf's `IntValue`, `StrOrRefValue`, `DoubleValue`). Oneof fields
# that are not set read as 0 or "", so `int64_value or uint64_value` is the one that is set.
_INT, _TEXT, _ID, _ID_TEXT, _DOUBLE = range(5)
_COLUMNS = [c for c in schemas.ALLOCATOR_EVENTS.names if c not in ("allocation", "time_ps", "thread")]
_DEFAULTS = [{"step_id": -1, "fragmentation": 0.0}.get(c, "" if c in (*_STR_STATS.values(), "allocator") else 0)
             for c in _COLUMNS]


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


def _host_plane_events(plane_bytes, path):
    plane, lines = split_lines(plane_bytes, path)
    kinds = {mid: md.name == ALLOCATION for mid, md in plane.event_metadata.items()
             if md.name in (ALLOCATION, DEALLOCATION)}
    if not kinds:
        return schemas.ALLOCATOR_EVENTS.empty()
    stat_names = {sid: md.name for sid, md in plane.stat_metadata.items()}
    readers = _stat_readers(stat_names)
    wanted = np.fromiter(kinds, dtype=np.int64)
    rows: list[list] = []
    allocation: list[bool] = []
    threads: list[str] = []
    stamps: list[int] = []
    for line in lines:
        decoded = event_wire.decode_line(line, None, None, None, 0)
        if decoded is not None and not np.isin(decoded[0], wanted).any():
            continue  # no allocator event on this thread: its events stay undecoded
        base_ps = line.timestamp_ns * 1000
        for ev in line.events:
            kind = kinds.get(ev.metadata_id)
            if kind is None:
                continue
            row = _DEFAULTS.copy()
            for stat in ev.stats:  # the last of repeated stats wins, as in XProf's pass over them
                reader = readers.get(stat.metadata_id)
                if reader is None:
                    continue
                col, how = reader
                if how == _INT or how == _ID:
                    value = stat.int64_value or stat.uint64_value
                    if value > _INT64_MAX:  # XProf reads a uint64 as the same 64 bits, signed
                        value -= 1 << 64
                    row[col] = value if how == _INT else str(value)
                elif how == _DOUBLE:
                    row[col] = stat.double_value
                else:
                    row[col] = stat.str_value or stat_names.get(stat.ref_value, "")
            rows.append(row)
            allocation.append(kind)
            threads.append(line.name)
            stamps.append(base_ps + ev.offset_ps)
    if not stamps:
        return schemas.ALLOCATOR_EVENTS.empty()
    origin = min(stamps)
    if max(stamps) - origin > _INT64_MAX:
        raise InputError("implausible allocator event times (beyond the int64 picosecond range)", path=path)
    cols = dict(zip(_COLUMNS, map(list, zip(*rows))))
    cols.update(allocation=allocation, thread=threads, time_ps=[t - origin for t in stamps])
    return schemas.ALLOCATOR_EVENTS.frame(cols)
