"""Build XSpace protos event by event, following XProf's TPU conventions.

Used by the example generator, the tests (small traces with known values), the benchmark and the
simulator. Stat values are typed by their Python type; wrap a value in `U64` where XProf's
producers write uint64 (ids and device times).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.proto import XSpace


@dataclass(frozen=True)
class U64:
    """A stat value to be written as uint64_value."""

    value: int


@dataclass(frozen=True)
class Ref:
    """A string stat value written as ref_value: the id of the stat metadata named by it, as TSL
    writes strings that repeat (`allocator_name`, `tf_op`)."""

    value: str


StatValue = str | int | float | bytes | U64 | Ref


def _set_stat(stat, value: StatValue) -> None:
    if isinstance(value, U64):
        stat.uint64_value = value.value
    elif isinstance(value, bool):
        stat.int64_value = int(value)
    elif isinstance(value, int):
        stat.int64_value = value
    elif isinstance(value, float):
        stat.double_value = value
    elif isinstance(value, str):
        stat.str_value = value
    elif isinstance(value, bytes):
        stat.bytes_value = value
    else:
        raise TypeError(f"unsupported stat value {value!r}")


class LineBuilder:
    def __init__(self, plane: "PlaneBuilder", proto):
        self._plane = plane
        self.proto = proto

    def event(self, metadata_id: int, offset_ps: int, duration_ps: int,
              stats: dict[str, StatValue] | None = None) -> None:
        ev = self.proto.events.add(metadata_id=metadata_id, offset_ps=offset_ps, duration_ps=duration_ps)
        if stats:
            for name, value in stats.items():
                stat = ev.stats.add(metadata_id=self._plane.stat_id(name))
                if isinstance(value, Ref):
                    stat.ref_value = self._plane.stat_id(value.value)
                else:
                    _set_stat(stat, value)


class PlaneBuilder:
    def __init__(self, proto):
        self.proto = proto
        self._stat_ids: dict[str, int] = {}
        self._event_ids: dict[tuple[str, str], int] = {}

    def stat_id(self, name: str) -> int:
        sid = self._stat_ids.get(name)
        if sid is None:
            sid = len(self._stat_ids) + 1
            self._stat_ids[name] = sid
            md = self.proto.stat_metadata[sid]
            md.id = sid
            md.name = name
        return sid

    def set_stat(self, name: str, value: StatValue) -> None:
        _set_stat(self.proto.stats.add(metadata_id=self.stat_id(name)), value)

    def event_metadata(self, name: str, display_name: str = "",
                       stats: dict[str, StatValue] | None = None, metadata_id: int | None = None) -> int:
        """The id of the metadata named (name, display_name), created with `stats` on first use."""
        key = (name, display_name)
        mid = self._event_ids.get(key)
        if mid is not None:
            return mid
        mid = metadata_id if metadata_id is not None else len(self._event_ids) + 1
        self._event_ids[key] = mid
        md = self.proto.event_metadata[mid]
        md.id = mid
        md.name = name
        if display_name:
            md.display_name = display_name
        for stat_name, value in (stats or {}).items():
            _set_stat(md.stats.add(metadata_id=self.stat_id(stat_name)), value)
        return mid

    def line(self, name: str, line_id: int, timestamp_ns: int = 0) -> LineBuilder:
        proto = self.proto.lines.add(id=line_id, display_id=line_id, name=name, timestamp_ns=timestamp_ns)
        return LineBuilder(self, proto)


class XSpaceBuilder:
    def __init__(self, hostname: str):
        self.proto = XSpace()
        self.proto.hostnames.append(hostname)

    def plane(self, name: str, plane_id: int) -> PlaneBuilder:
        return PlaneBuilder(self.proto.planes.add(id=plane_id, name=name))

    def serialize(self) -> bytes:
        return self.proto.SerializeToString()

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.serialize())
        return path
