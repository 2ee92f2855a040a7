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


def _int(stat) -> int:
    kind = stat.WhichOneof("value")
    if kind == "int64_value":
        return stat.int64_value
    if kind == "uint64_value":  # as XProf's IntValue: the same 64 bits, read signed
        v = stat.uint64_value
        return v - (1 << 64) if v > _INT64_MAX else v
    return 0


def _text(stat, stat_names: dict[int, str]) -> str:
    kind = stat.WhichOneof("value")
    if kind == "str_value":
        return stat.str_value
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    return ""


def _host_plane_events(plane_bytes, path):
    plane, lines = split_lines(plane_bytes, path)
    kinds = {mid: md.name == ALLOCATION for mid, md in plane.event_metadata.items()
             if md.name in (ALLOCATION, DEALLOCATION)}
    if not kinds:
        return schemas.ALLOCATOR_EVENTS.empty()
    stat_names = {sid: md.name for sid, md in plane.stat_metadata.items()}
    wanted = np.fromiter(kinds, dtype=np.int64)
    cols: dict[str, list] = {c: [] for c in schemas.ALLOCATOR_EVENTS.names}
    stamps: list[int] = []
    for line in lines:
        decoded = event_wire.decode_line(line, None, None, None, 0)
        if decoded is not None and not np.isin(decoded[0], wanted).any():
            continue  # no allocator event on this thread: its events stay undecoded
        base_ps = line.timestamp_ns * 1000
        for ev in line.events:
            allocation = kinds.get(ev.metadata_id)
            if allocation is None:
                continue
            row = dict.fromkeys(_INT_STATS.values(), 0)
            row.update(dict.fromkeys(_STR_STATS.values(), ""), step_id=-1, fragmentation=0.0, allocator="")
            for stat in ev.stats:  # the last of repeated stats wins, as in XProf's pass over them
                name = stat_names.get(stat.metadata_id)
                if name in _INT_STATS:
                    row[_INT_STATS[name]] = _int(stat)
                elif name in _STR_STATS:
                    row[_STR_STATS[name]] = _text(stat, stat_names)
                elif name == "allocator_name":
                    row["allocator"] = _text(stat, stat_names)
                elif name in _MEMORY_ID_INT_STATS:
                    row["allocator"] = str(_int(stat))
                elif name == "fragmentation" and stat.WhichOneof("value") == "double_value":
                    row["fragmentation"] = stat.double_value
            for key, value in row.items():
                cols[key].append(value)
            cols["allocation"].append(allocation)
            cols["thread"].append(line.name)
            stamps.append(base_ps + ev.offset_ps)
    if not stamps:
        return schemas.ALLOCATOR_EVENTS.empty()
    origin = min(stamps)
    if max(stamps) - origin > _INT64_MAX:
        raise InputError("implausible allocator event times (beyond the int64 picosecond range)", path=path)
    cols["time_ps"] = [t - origin for t in stamps]
    return schemas.ALLOCATOR_EVENTS.frame(cols)
