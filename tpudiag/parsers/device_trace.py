"""One host's XSpace to a `HostTrace`: device facts, op events, steps, modules, async windows.

Follows XProf's TPU conventions (`shared/reference/xprof-trace-format.md` §2-3): op facts live on
the event metadata of `XLA Ops` lines, `device_offset_ps`/`device_duration_ps` replace an event's
own timespan, step markers are `Steps` events with `group_id`. GPU planes carry their facts on the
events instead. The event loop is the hot path on traces of millions of ops, so it reads only the
fields it needs into compact arrays and does the rest with numpy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tpudiag.model.intervals import nest
from tpudiag.model import schemas
from tpudiag.model.grouping import dense_unique, reordering
from tpudiag.model.hardware import VmemBandwidth, chip_for, gpu_device
from tpudiag.model.hlo_cost import gpu_op_cost
from tpudiag.model.hlo_names import async_role, pair_async, window_family
from tpudiag.model.profile import DeviceInfo, HostTrace, PeaksSource, Platform
from tpudiag.model.program_ids import as_program_id
from tpudiag.parsers import event_wire
from tpudiag.parsers.host_plane import host_events
from tpudiag.parsers.time_axis import (DEVICE_CLOCKS_SPLIT, HOST_NOT_ALIGNED, PROFILE_START_STAT, TimeAxis,
                                       profile_anchor, time_axis, unplaceable)
from tpudiag.parsers.event_wire import RawLine
from tpudiag.parsers.xspace import stat_value, stats_dict
from tpudiag.proto import CoreDetails, MemoryAccessBreakdown, XStat

if TYPE_CHECKING:  # imported where the tables are built: the planes parse before pandas is loaded
    import pandas as pd

TPU_CORE_PLANE = re.compile(r"^/device:TPU:(\d+)$")
TPU_SPARSE_PLANE = re.compile(r"^/device:TPU:(\d+) SparseCore(?: [a-zA-Z]+)? (\d+)$")
GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")
OP_LINES = ("XLA Ops", "Sparse Core Ops")
STEP_LINES = ("Steps",)
MODULE_LINES = ("XLA Modules",)
ASYNC_LINES = ("Async XLA Ops",)
AUX_PLANES = ("/host:CPU", "/host:metadata")  # host planes read beside the device planes
# Lines a GPU plane holds beside its streams: every producer's derived lines, old and new names
# (TSL's `Framework Ops`/`Framework Name Scope` were TensorFlow's `TensorFlow Ops`/`TensorFlow Name
# Scope`; openxla/xla `xla/tsl/profiler/utils/xplane_schema.cc`). Their events are name scopes and
# ops laid over the kernels, not kernels: read as kernels, they count the same time again.
GPU_NON_KERNEL_LINES = frozenset({
    "XLA Modules", "XLA Ops", "Async XLA Ops", "Steps", "Framework Ops", "Framework Name Scope", "TensorFlow Ops",
    "TensorFlow Name Scope", "Source code", "Launch Stats", "_counters_", "XLA TraceMe", "Host Offload Ops",
    "Sparse Core Ops", "Sparse Core Steps", "Sparse Core Modules"})
# Category of a GPU kernel that no HLO op launched (a runtime copy kernel, a library's helper, a
# TensorFlow kernel): listed under its kernel name; XProf's hlo_stats leaves them out.
NON_XLA_KERNEL = "kernel (no HLO op)"
# Stream events that move memory rather than run a kernel (CUPTI/roctracer memcpy and memset).
_TRANSFER_STATS = ("memcpy_details", "memset_details")
_MODULE_NAME = re.compile(r"^(?P<module>.*)\((?P<id>\d+)\)$")
_HLO_TEXT_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=")
HBM_SPACE = 1


@dataclass(frozen=True)
class _OpMeta:
    name: str
    program_id: int
    symbol_id: int
    category: str
    flops: float
    model_flops: float
    bytes_accessed: float
    hbm_bytes: float
    shape_with_layout: str
    source: str
    tf_op: str
    hlo_text: str


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_IMPLAUSIBLE = "negative duration, longer than a day, or a time beyond int64 (damaged timestamps)"
# Longest plausible device event or step: a day. Profiles capture seconds to minutes; a longer
# span (e.g. 2^62 ps, 53 days) is damage, and summing such spans overflows int64.
MAX_EVENT_PS = 86_400 * 10**12


def _as_int(value) -> int | None:
    """A non-negative int64 from a stat value; None when it is not one.

    Strings must be ASCII digits: `str.isdigit` also accepts `²`, which `int()` rejects.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, float):
        if not np.isfinite(value):
            return None
        v = int(value)
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        v = int(value.strip())
    else:
        return None
    return v if 0 <= v <= _INT64_MAX else None


def _as_float(value) -> float | None:
    """A finite, non-negative float from a stat value; None when it is not one."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    v = float(value)
    return v if np.isfinite(v) and v >= 0 else None


def plausible_spans(starts: np.ndarray, durs: np.ndarray) -> np.ndarray:
    """Mask of events whose duration is in [0, MAX_EVENT_PS] and whose end fits in int64."""
    return (durs >= 0) & (durs <= MAX_EVENT_PS) & (starts <= _INT64_MAX - MAX_EVENT_PS)


def _instruction_name(md) -> tuple[str, str]:
    """(op name, HLO text). TPU metadata: name = HLO text, display_name = op name."""
    if md.display_name:
        return md.display_name, md.name
    m = _HLO_TEXT_NAME.match(md.name)
    if m is not None:
        return m.group("name"), md.name
    return md.name, ""


def _hbm_bytes(breakdown: bytes, bytes_accessed: float) -> float:
    """HBM bytes from a serialized MemoryAccessBreakdown; all bytes count as HBM without one."""
    if not breakdown:
        return bytes_accessed
    msg = MemoryAccessBreakdown()
    try:
        msg.ParseFromString(breakdown)
    except Exception:  # a damaged payload inside a valid trace: fall back as XProf does
        return bytes_accessed
    if not msg.memory_accessed:
        return bytes_accessed
    return float(sum(m.bytes_accessed for m in msg.memory_accessed if m.memory_space in (0, HBM_SPACE)))


def _op_meta(md, stat_names: dict[int, str], bad: list[str] | None = None) -> _OpMeta:
    """The op's facts from its metadata; unusable values count as absent and are named in `bad`
    (ids as `id:<key>`, numbers as their key)."""
    name, hlo_text = _instruction_name(md)
    st = stats_dict(md.stats, stat_names)

    def number(key: str, parse, default):
        raw = st.get(key)
        if raw is None:
            return default
        value = parse(raw)
        if value is None:
            if bad is not None:
                bad.append(f"id:{key}" if parse is as_program_id else key)
            return default
        return value

    bytes_accessed = number("bytes_accessed", _as_float, 0.0)
    breakdown = st.get("memory_access_breakdown", b"")
    return _OpMeta(
        name=name,
        program_id=number("program_id", as_program_id, 0),
        symbol_id=number("symbol_id", as_program_id, 0),  # uint64 as well (XProf's op key)
        category=str(st.get("hlo_category", "") or ""),
        flops=number("flops", _as_float, 0.0),
        model_flops=number("model_flops", _as_float, 0.0),
        bytes_accessed=bytes_accessed,
        hbm_bytes=_hbm_bytes(breakdown if isinstance(breakdown, bytes) else b"", bytes_accessed),
        shape_with_layout=str(st.get("shape_with_layout", "") or ""),
        source=str(st.get("source", "") or ""),
        tf_op=str(st.get("tf_op", "") or ""),
        hlo_text=hlo_text,
    )


# Op metadata already decoded in this process, by (stat names, serialized metadata): every core
# of a host, and every host of a pod, carries the same program's metadata again (0.2 s of a
# 244 k-event host's 0.8 s went to decoding it anew for each of its 4 cores).
# Keyed by a digest of the bytes, not the bytes: the metadata hold whole HLO instruction texts.
_META_CACHE: dict[tuple, tuple[_OpMeta, tuple[str, ...]]] = {}
_META_CACHE_MAX = 50_000


def _cached_op_meta(md, stat_names: dict[int, str], names_key: tuple, bad: list[str]) -> _OpMeta:
    """`_op_meta`, decoded once per distinct metadata in this process."""
    key = (names_key, hashlib.blake2b(md.SerializeToString(), digest_size=16).digest())
    hit = _META_CACHE.get(key)
    if hit is None:
        own: list[str] = []
        hit = (_op_meta(md, stat_names, own), tuple(own))
        if len(_META_CACHE) >= _META_CACHE_MAX:
            _META_CACHE.clear()
        _META_CACHE[key] = hit
    bad.extend(hit[1])
    return hit[0]


def _read_line(line, off_id: int | None, dur_id: int | None,
               base_ps: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(metadata ids, starts, durations) of a line's events, device timespans applied.

    Starts are `base_ps` (the line's start on the host's time axis, `parsers.time_axis`) plus the
    event's offset. `device_offset_ps` is taken relative to the line's timestamp; real TPU device
    lines have timestamp 0, where this is XProf's reading (the stat replaces the event's own
    timespan). An event whose start or duration does not fit in int64 reads as (0, -1), which
    `plausible_spans` drops.
    """
    if isinstance(line, RawLine):
        cols = event_wire.decode_line(line, off_id, dur_id, None, base_ps)
        if cols is not None:
            return cols[0], cols[1], cols[2]
    try:
        return _read_line_py(line, off_id, dur_id, base_ps, array("q"), array("q"))
    except OverflowError:  # rare: read again into Python ints, then mark what does not fit
        return _read_line_py(line, off_id, dur_id, base_ps, [], [])


def _read_line_py(line, off_id: int | None, dur_id: int | None, base: int, starts, durs):
    """`_read_line` through protobuf, into `starts` and `durs` (int64 arrays, or lists that take
    any integer)."""
    mids = array("q")
    if off_id is None or dur_id is None:
        for ev in line.events:
            mids.append(ev.metadata_id)
            starts.append(base + ev.offset_ps)
            durs.append(ev.duration_ps)
    else:
        add_mid, add_start, add_dur = mids.append, starts.append, durs.append
        for ev in line.events:
            add_mid(ev.metadata_id)
            stats = ev.stats
            # The hot path: TPU producers write the device offset and duration as the first two
            # stats, so look there before walking every stat (saves ~40 % per event).
            if len(stats) > 1:
                a, b = stats[0], stats[1]
                if a.metadata_id == off_id and b.metadata_id == dur_id:
                    add_start(base + (a.uint64_value or a.int64_value))
                    add_dur(b.uint64_value or b.int64_value)
                    continue
            s = base + ev.offset_ps
            d = ev.duration_ps
            o = dd = -1
            for st in stats:
                sid = st.metadata_id
                if sid == off_id:
                    o = st.uint64_value or st.int64_value
                elif sid == dur_id:
                    dd = st.uint64_value or st.int64_value
            if o >= 0 and dd >= 0:
                s, d = base + o, dd
            add_start(s)
            add_dur(d)
    return (np.frombuffer(mids, dtype=np.int64), *_int64_spans(starts, durs))


def _int64_spans(starts, durs) -> tuple[np.ndarray, np.ndarray]:
    """(starts, durations) as int64 columns; from lists, a pair outside int64 becomes (0, -1)."""
    if isinstance(starts, array):
        return np.frombuffer(starts, dtype=np.int64), np.frombuffer(durs, dtype=np.int64)
    fit = [_INT64_MIN <= s <= _INT64_MAX and _INT64_MIN <= d <= _INT64_MAX for s, d in zip(starts, durs)]
    return (np.array([s if ok else 0 for s, ok in zip(starts, fit)], dtype=np.int64),
            np.array([d if ok else -1 for d, ok in zip(durs, fit)], dtype=np.int64))


def _read_async_line(line, off_id: int | None, dur_id: int | None, hlo_op_id: int | None, base_ps: int):
    """(starts, durations, name codes, {key: code}) of an async line in ONE walk over its events.

    Timespans as `_read_line` reads them; the key of each event is its first `hlo_op` stat's
    string when non-empty, `("stat", serialised stat, metadata id)` for another kind of value,
    else its metadata id. Reading both in one pass halves the per-event protobuf access here.
    """
    if isinstance(line, RawLine):
        cols = event_wire.decode_line(line, off_id, dur_id, hlo_op_id, base_ps)
        interned = cols and event_wire.intern_keys(line.data, cols[0], *cols[3:])
        if interned:
            codes_arr, keys = interned
            return cols[1], cols[2], codes_arr, {key: code for code, key in enumerate(keys)}
    try:
        return _read_async_line_py(line, off_id, dur_id, hlo_op_id, base_ps, array("q"), array("q"))
    except OverflowError:  # as in `_read_line`
        return _read_async_line_py(line, off_id, dur_id, hlo_op_id, base_ps, [], [])


def _read_async_line_py(line, off_id: int | None, dur_id: int | None, hlo_op_id: int | None, base: int,
                        starts, durs):
    """`_read_async_line` through protobuf, into `starts` and `durs` as `_read_line_py` fills them."""
    timed = off_id is not None and dur_id is not None
    codes = array("q")
    add_start, add_dur, add_code = starts.append, durs.append, codes.append
    index: dict[object, int] = {}
    for ev in line.events:
        stats = ev.stats
        key: object = ev.metadata_id  # no `hlo_op` stat: the name comes from the metadata
        found = hlo_op_id is None
        span = None
        if timed and len(stats) > 1:
            a, b = stats[0], stats[1]
            if a.metadata_id == off_id and b.metadata_id == dur_id:
                span = (base + (a.uint64_value or a.int64_value), b.uint64_value or b.int64_value)
        o = dd = -1
        for st in stats:
            sid = st.metadata_id
            if not found and sid == hlo_op_id:
                found = True
                kind = st.WhichOneof("value")
                if kind == "str_value" and st.str_value:
                    key = st.str_value
                elif kind is not None and kind != "str_value":
                    key = ("stat", st.SerializeToString(), ev.metadata_id)
                if span is not None:
                    break
            if span is None and timed:
                if sid == off_id:
                    o = st.uint64_value or st.int64_value
                elif sid == dur_id:
                    dd = st.uint64_value or st.int64_value
        if span is None:
            span = (base + o, dd) if o >= 0 and dd >= 0 else (base + ev.offset_ps, ev.duration_ps)
        add_start(span[0])
        add_dur(span[1])
        code = index.get(key)
        if code is None:
            code = index[key] = len(index)
        add_code(code)
    starts_arr, durs_arr = _int64_spans(starts, durs)
    return starts_arr, durs_arr, np.frombuffer(codes, dtype=np.int64), index


def _event_stat_column(line, stat_id: int | None) -> list:
    if stat_id is None:
        return [None] * len(line.events)
    out = []
    for ev in line.events:
        value = None
        for st in ev.stats:
            if st.metadata_id == stat_id:
                value = st.uint64_value or st.int64_value
                break
        out.append(value)
    return out


def _positions(ids: np.ndarray, mids: np.ndarray) -> np.ndarray:
    """`np.searchsorted(ids, mids)` for sorted, distinct `ids` holding every value of `mids`: through
    a table indexed by id when the ids are small non-negative integers (metadata ids are)."""
    if len(ids) and ids[0] >= 0 and ids[-1] <= 4 * len(mids) + 1024:
        table = np.zeros(int(ids[-1]) + 1, dtype=np.intp)
        table[ids] = np.arange(len(ids))
        return table[mids]
    return np.searchsorted(ids, mids)


class _HostBuilder:
    """Accumulates per-plane arrays, then builds the host's tables once."""

    def __init__(self, host: str, path: str):
        self.host = host
        self.path = path
        self.warnings: list[str] = []
        self.meta_rows: dict[tuple[int, str], _OpMeta] = {}
        self.ev_parts: list[dict[str, np.ndarray]] = []
        self.step_rows: list[tuple[str, int, int, int, int]] = []
        self.module_rows: list[tuple[str, int, int, str, int, int]] = []
        # (device, core, names, families, codes, start_ps, end_ps, source) per line
        self.async_parts: list[tuple] = []
        self.program_names: dict[int, str] = {}
        self.partial_overlaps = 0
        self.ops_without_ids = 0
        self.axis = time_axis([], [], None)
        self.plane_stats: dict[str, object] = {}
        self.chip: int | None = None

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def line_base(self, line, device: str) -> int | None:
        """The line's start on the host's time axis; None, with a warning, when it has none."""
        base = self.axis.base_ps(line.timestamp_ns)
        if base is None:
            self.warn(unplaceable(line.name, device))
        return base

    def drop_implausible(self, mids: np.ndarray, starts: np.ndarray, durs: np.ndarray,
                         line: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The events with a plausible timespan; the others are dropped with a warning."""
        keep = plausible_spans(starts, durs)
        if keep.all():
            return mids, starts, durs
        n_bad = int(len(keep) - keep.sum())
        self.warn(f"{n_bad} events on a `{line}` line dropped: {_IMPLAUSIBLE}")
        return mids[keep], starts[keep], durs[keep]

    def warn_bad_values(self, bad: list[str]) -> None:
        """One warning for the unusable ids and one for the unusable numbers of op metadata."""
        ids = [k[3:] for k in bad if k.startswith("id:")]
        numbers = [k for k in bad if not k.startswith("id:")]
        if ids:
            self.warn(f"{len(ids)} op metadata ids that are not unsigned 64-bit integers "
                      f"({', '.join(sorted(set(ids)))}) were ignored")
        if numbers:
            self.warn(f"{len(numbers)} op metadata values that are not finite non-negative numbers "
                      f"({', '.join(sorted(set(numbers)))}) were ignored")

    # -- op lines ----------------------------------------------------------------------------

    def add_op_line(self, plane, line, device: str, core: int, chip: int, stat_names, sid, gpu: bool,
                    xla_only: bool = False) -> None:
        """One op line; `gpu`: op facts on the events (GPU kernels, XLA's CPU ops); `xla_only`: keep
        only events with an `hlo_op` (a `/host:CPU` thread, whose other events are TraceMes)."""
        base = self.line_base(line, device)
        if base is None:
            return
        if gpu:
            mids, starts, durs, metas = self._gpu_line(plane, line, stat_names, sid, base, xla_only)
        else:
            mids, starts, durs = _read_line(line, sid.get("device_offset_ps"), sid.get("device_duration_ps"), base)
            mids, starts, durs = self.drop_implausible(mids, starts, durs, line.name)
            metas = {}
            bad: list[str] = []
            names_key = tuple(sorted(stat_names.items()))
            for mid in dense_unique(mids).tolist():
                md = plane.event_metadata.get(mid)
                metas[mid] = _cached_op_meta(md, stat_names, names_key, bad) if md is not None else _OpMeta(
                    f"<metadata {mid}>", 0, 0, "", 0, 0, 0, 0, "", "", "", "")
            self.warn_bad_values(bad)
        if len(mids) == 0:
            return
        order = reordering((-durs, starts))
        if order is not None:  # a line's events mostly come in this order already
            mids, starts, durs = mids[order], starts[order], durs[order]
        self_ps, depth, partial = event_wire.nest(starts, durs) or nest(starts, durs)
        self.partial_overlaps += partial
        ids = np.fromiter(metas.keys(), dtype=np.int64, count=len(metas))
        id_order = np.argsort(ids)
        ids = ids[id_order]
        meta_list = [metas[int(i)] for i in ids]
        pos = _positions(ids, mids)
        names = np.array([m.name for m in meta_list], dtype=object)
        cats = np.array([m.category for m in meta_list], dtype=object)
        pids = np.array([m.program_id for m in meta_list], dtype=np.uint64)
        for m in meta_list:
            key = (m.program_id, m.name)
            if key not in self.meta_rows:
                self.meta_rows[key] = m
            if not gpu and (m.program_id == 0 or m.symbol_id == 0):
                self.ops_without_ids += 1
        self.ev_parts.append({
            "meta_keys": [(m.program_id, m.name) for m in meta_list],  # per category code, for `with_gpu_costs`
            "programs": pids,  # per category code: the program column is programs[codes]
            "device": (device, len(mids)),
            "core": core,  # one per line: repeated once per host in events()
            "chip": chip,
            "name": (names, pos),  # (categories, codes): expanded once per host in events()
            "category": (cats, pos),
            "start_ps": starts,
            "dur_ps": durs,
            "self_ps": self_ps,
            "depth": depth,
        })

    def _gpu_line(self, plane, line, stat_names, sid, base: int, xla_only: bool = False):
        """GPU kernels: op facts are event stats (hlo_op, hlo_module, program_id).

        A kernel with `hlo_op` is an occurrence of that HLO op (one op may launch several kernels,
        each an occurrence, as XProf counts them); a kernel without one keeps its kernel name.
        Memory copies and sets on the streams are transfers, not kernels, and are left out.
        """
        mids, starts, durs = _read_line(line, None, None, base)
        hlo_op = sid.get("hlo_op")
        hlo_module = sid.get("hlo_module")
        program = sid.get("program_id")
        transfer = {sid[k] for k in _TRANSFER_STATS if k in sid}
        keys = array("q")
        keep = np.ones(len(mids), dtype=bool)
        metas: dict[int, _OpMeta] = {}
        key_of: dict[tuple[str, str, int], int] = {}
        for i, ev in enumerate(line.events):
            op = module = ""
            pid = 0
            moves = False
            for st in ev.stats:
                s = st.metadata_id
                if s == hlo_op:
                    op = str(stat_value(st, stat_names))
                elif s == hlo_module:
                    module = str(stat_value(st, stat_names))
                elif s == program:
                    pid = as_program_id(st.uint64_value or st.int64_value) or 0
                elif s in transfer:
                    moves = True
            if (moves or xla_only) and not op:
                keep[i] = False
                keys.append(-1)
                continue
            category = "gpu kernel"
            if op:
                op = op.rsplit("::", 1)[-1]  # `a::b`: an op inside another, named innermost
            else:
                md = plane.event_metadata.get(ev.metadata_id)
                op = md.name if md is not None else f"<metadata {ev.metadata_id}>"
                category = NON_XLA_KERNEL
            k = key_of.get((op, module, pid))
            if k is None:
                k = len(key_of)
                key_of[(op, module, pid)] = k
                metas[k] = _OpMeta(op, pid, 0, category, 0, 0, 0, 0, "", "", "", "")
                if module and pid:
                    self.program_names.setdefault(pid, module)
            keys.append(k)
        keys_arr = np.frombuffer(keys, dtype=np.int64)
        if not keep.all():
            keys_arr, starts, durs = keys_arr[keep], starts[keep], durs[keep]
        keys_arr, starts, durs = self.drop_implausible(keys_arr, starts, durs, line.name)
        return keys_arr, starts, durs, metas

    # -- other device lines ------------------------------------------------------------------

    def add_steps(self, plane, line, device: str, core: int, sid) -> None:
        base = self.line_base(line, device)
        if base is None:
            return
        mids, starts, durs = _read_line(line, sid.get("device_offset_ps"), sid.get("device_duration_ps"), base)
        groups = _event_stat_column(line, sid.get("group_id"))
        keep = plausible_spans(starts, durs) & (durs > 0)  # a step takes time: a 0 ps step is damage too
        dropped = 0
        for i, (mid, s, d, g, ok) in enumerate(zip(mids.tolist(), starts.tolist(), durs.tolist(), groups,
                                                   keep.tolist())):
            if g is None:
                md = plane.event_metadata.get(mid)
                g = _as_int(md.name) if md is not None and md.name else None
                g = i if g is None else g
            if not ok or not 0 <= g <= _INT64_MAX:
                dropped += 1
                continue
            self.step_rows.append((device, core, int(g), s, d))
        if dropped:
            self.warn(f"{dropped} step markers dropped: zero or negative duration, longer than a day, or a time or "
                      "step number beyond int64 (damaged values)")

    def add_modules(self, plane, line, device: str, core: int) -> None:
        base = self.line_base(line, device)
        if base is None:
            return
        mids, starts, durs = self.drop_implausible(*_read_line(line, None, None, base), line.name)
        named: dict[int, tuple[int, str]] = {}  # per metadata id: a program runs thousands of times
        for mid, s, d in zip(mids.tolist(), starts.tolist(), durs.tolist()):
            known = named.get(mid)
            if known is None:
                md = plane.event_metadata.get(mid)
                name = md.name if md is not None else ""
                m = _MODULE_NAME.match(name)
                module, pid = (m.group("module"), as_program_id(m.group("id"))) if m else (name, 0)
                known = named[mid] = (pid or 0, module)
            pid, module = known
            if pid:
                self.program_names.setdefault(pid, module)
            self.module_rows.append((device, core, pid, module, s, d))

    def add_async(self, plane, line, device: str, core: int, stat_names, sid) -> None:
        # Each event's `hlo_op` is interned to a code; everything derived from the name (the
        # window family, the metadata fallback) is then worked out once per distinct name.
        base = self.line_base(line, device)
        if base is None:
            return
        starts, durs, codes, index = _read_async_line(line, sid.get("device_offset_ps"),
                                                      sid.get("device_duration_ps"), sid.get("hlo_op"), base)
        if not len(starts):
            return
        names = []
        for key in index:
            if isinstance(key, str) and key:
                names.append(key)
                continue
            if isinstance(key, tuple):  # a non-string hlo_op stat (rare): decode it as a string
                st = XStat()
                st.ParseFromString(key[1])
                value = str(stat_value(st, stat_names))
                if value:
                    names.append(value)
                    continue
                key = key[2]
            md = plane.event_metadata.get(key) if isinstance(key, int) else None
            names.append(_instruction_name(md)[0] if md is not None else f"<metadata {key}>")
        codes_arr = codes
        keep = plausible_spans(starts, durs)
        if not keep.all():
            self.warn(f"{int(len(keep) - keep.sum())} events on a `{line.name}` line dropped: {_IMPLAUSIBLE}")
            codes_arr, starts, durs = codes_arr[keep], starts[keep], durs[keep]
            if not len(codes_arr):
                return
            # Only the names still used become categories, as if the dropped events were never there.
            used, codes_arr = np.unique(codes_arr, return_inverse=True)
            names = [names[i] for i in used.tolist()]
        self._add_windows(device, core, names, codes_arr.astype(np.int64), starts, starts + durs,
                          "Async XLA Ops")

    def _add_windows(self, device: str, core: int, names: list[str], codes: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray, source: str) -> None:
        """Windows as columns: names and families as (categories, codes), times as arrays."""
        families = [window_family(n) for n in names]
        self.async_parts.append((device, core, np.asarray(names, dtype=object), np.asarray(families, dtype=object),
                                 codes, starts.astype(np.int64), ends.astype(np.int64), source))

    def pair_async_from_ops(self, device: str, core: int, names: np.ndarray, codes: np.ndarray,
                            starts: np.ndarray, ends: np.ndarray) -> None:
        """Async windows from start/done pairs when the plane has no `Async XLA Ops` line.

        `names[codes]` are the events' names; only events whose name is async are visited.
        """
        is_async = np.array([async_role(n) is not None for n in names.tolist()], dtype=bool)
        if not is_async.any():
            return
        idx = np.flatnonzero(is_async[codes])
        async_codes = codes[idx]
        pairs = pair_async(names[async_codes].tolist())
        if not pairs:
            return
        si = np.array([p[0] for p in pairs], dtype=np.int64)
        di = np.array([p[1] for p in pairs], dtype=np.int64)
        self._add_windows(device, core, names.tolist(), async_codes[si], starts[idx[si]], ends[idx[di]],
                          "start/done pair")

    # -- tables ------------------------------------------------------------------------------

    def events(self) -> pd.DataFrame:
        import pandas as pd

        if not self.ev_parts:
            return schemas.EVENTS.empty()
        parts = self.ev_parts
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k not in _CODED + _PER_META + _PER_LINE}
        lengths = [len(p["start_ps"]) for p in parts]
        for key in _PER_LINE:
            cols[key] = np.repeat(np.array([p[key] for p in parts], dtype=np.int32), lengths)
        # Programs and their modules per line's distinct ops (its codes), not per event; each line's
        # rows are taken straight into the host's columns (no array per line to concatenate).
        codes = [p["name"][1] for p in parts]
        programs = np.unique(np.concatenate([p["programs"][np.bincount(c, minlength=len(p["programs"])) > 0]
                                             for p, c in zip(parts, codes)]))
        program_modules = pd.Categorical([self.program_names.get(int(p), "") for p in programs])
        n = sum(lengths)
        program_id = np.empty(n, dtype=np.uint64)
        module = np.empty(n, dtype=program_modules.codes.dtype)
        at = 0
        for p, c, length in zip(parts, codes, lengths):
            # The codes index their line's lists by construction (`_positions`); "clip" writes into
            # `out` directly, where the default mode would take into a buffer and copy it over.
            np.take(p["programs"], c, out=program_id[at:at + length], mode="clip")
            np.take(program_modules.codes[np.searchsorted(programs, p["programs"])], c, out=module[at:at + length],
                    mode="clip")
            at += length
        cols["program_id"] = program_id
        cols["module"] = pd.Categorical.from_codes(module, dtype=program_modules.dtype)
        for key in _CODED:
            cols[key] = _categorical([p[key] for p in parts])
        self.ev_parts = []
        n = len(cols["start_ps"])
        cols["host"] = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[self.host])
        cols["step"] = np.full(n, -1, dtype=np.int64)
        return schemas.EVENTS.frame(cols, owned=True)  # every column made just above

    def op_metadata(self) -> pd.DataFrame:
        rows = list(self.meta_rows.values())
        return schemas.OP_METADATA.frame({
            "host": [self.host] * len(rows),
            "program_id": np.array([r.program_id for r in rows], dtype=np.uint64),
            "name": [r.name for r in rows],
            "category": [r.category for r in rows],
            "symbol_id": np.array([r.symbol_id for r in rows], dtype=np.uint64),
            "flops": [r.flops for r in rows],
            "model_flops": [r.model_flops for r in rows],
            "bytes_accessed": [r.bytes_accessed for r in rows],
            "hbm_bytes": [r.hbm_bytes for r in rows],
            "shape_with_layout": [r.shape_with_layout for r in rows],
            "source": [r.source for r in rows],
            "tf_op": [r.tf_op for r in rows],
            "hlo_text": [r.hlo_text for r in rows],
        })

    def step_markers(self) -> pd.DataFrame:
        import pandas as pd

        rows = self.step_rows
        return pd.DataFrame({
            "device": pd.Categorical([r[0] for r in rows]),
            "core": np.array([r[1] for r in rows], dtype=np.int32),
            "step": np.array([r[2] for r in rows], dtype=np.int64),
            "start_ps": np.array([r[3] for r in rows], dtype=np.int64),
            "dur_ps": np.array([r[4] for r in rows], dtype=np.int64),
        })

    def modules(self) -> pd.DataFrame:
        rows = self.module_rows
        return schemas.MODULES.frame({
            "host": [self.host] * len(rows),
            "device": [r[0] for r in rows],
            "core": [r[1] for r in rows],
            "program_id": np.array([r[2] for r in rows], dtype=np.uint64),
            "module": [r[3] for r in rows],
            "start_ps": [r[4] for r in rows],
            "dur_ps": [r[5] for r in rows],
        })

    def async_windows(self) -> pd.DataFrame:
        import pandas as pd

        parts = self.async_parts
        n = sum(len(p[4]) for p in parts)
        if not n:
            return schemas.ASYNC_WINDOWS.empty()
        return schemas.ASYNC_WINDOWS.frame({
            "host": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=[self.host]),
            "device": _sorted_categorical([(p[0], len(p[4])) for p in parts]),
            "core": np.concatenate([np.full(len(p[4]), p[1], dtype=np.int64) for p in parts]),
            "name": _sorted_categorical([(p[2], p[4]) for p in parts]),
            "family": _sorted_categorical([(p[3], p[4]) for p in parts]),
            "start_ps": np.concatenate([p[5] for p in parts]),
            "end_ps": np.concatenate([p[6] for p in parts]),
            "source": _sorted_categorical([(p[7], len(p[4])) for p in parts]),
        })


_CODED = ("device", "name", "category")
_PER_META = ("meta_keys", "programs")  # a part's lists per category code, not per event
_PER_LINE = ("core", "chip")  # one value per part (a line)


def _categorical(pieces: list[tuple]) -> pd.Categorical:
    """One categorical from per-line (categories, codes) or (value, length) pieces.

    Building categoricals from millions of repeated Python strings costs seconds (hashing every
    one); mapping each line's few distinct values to shared codes costs next to nothing.
    """
    import pandas as pd

    index: dict[str, int] = {}
    codes = []
    for values, where in pieces:
        if isinstance(where, (int, np.integer)):  # a constant value repeated `where` times
            code = index.setdefault(values, len(index))
            codes.append(np.full(int(where), code, dtype=np.int32))
        else:
            local = np.array([index.setdefault(v, len(index)) for v in values.tolist()], dtype=np.int32)
            codes.append(local[where] if len(local) else np.zeros(0, dtype=np.int32))
    return pd.Categorical.from_codes(np.concatenate(codes), categories=list(index))


def _sorted_categorical(pieces: list[tuple]) -> pd.Categorical:
    """`_categorical` with its categories in sorted order, as `pd.Categorical(values)` gives."""
    cat = _categorical(pieces)
    return cat.reorder_categories(sorted(cat.categories))


def _plane_chip(plane, stat_names, core: int) -> int:
    for st in plane.stats:
        if stat_names.get(st.metadata_id) == "core_details" and st.bytes_value:
            details = CoreDetails()
            try:
                details.ParseFromString(st.bytes_value)
            except Exception:  # damaged payload: fall back to the core index, as XProf does
                return core
            return int(details.local_chip_id)
    return core


# Per-core peaks beyond these are damage, not hardware: 100 PFLOP/s and 100 TB/s are two orders
# of magnitude above any TPU or GPU core.
MAX_PEAK_TERAFLOPS = 1e5
MAX_PEAK_HBM_GB_PER_S = 1e5
IMPLAUSIBLE_PEAKS = ("implausible peak FLOP/s or HBM bandwidth in the trace (not finite, negative or absurdly "
                     "high); ignored")


def trace_peaks(plane_stats: dict[str, object]) -> tuple[float, float]:
    """(peak TFLOP/s, peak HBM GB/s) from the plane's stats; 0 for absent or implausible values."""
    tf = _as_float(plane_stats.get("peak_teraflops_per_second", 0.0))
    hbm = _as_float(plane_stats.get("peak_hbm_bw_gigabytes_per_second", 0.0))
    return (tf if tf is not None and tf <= MAX_PEAK_TERAFLOPS else 0.0,
            hbm if hbm is not None and hbm <= MAX_PEAK_HBM_GB_PER_S else 0.0)


def _peaks_damaged(plane_stats: dict[str, object]) -> bool:
    tf, hbm = trace_peaks(plane_stats)
    given = [plane_stats.get(k) for k in ("peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second")]
    return any(v is not None and v != 0 and p == 0 for v, p in zip(given, (tf, hbm)))


def _device_info(platform: Platform, plane_stats: dict[str, object], n_cores: int, chips: set[int],
                 n_sparse: int) -> DeviceInfo:
    if platform is Platform.GPU:
        gpu = gpu_device(plane_stats)
        peak = gpu.peak_flops_per_s
        source = PeaksSource.HARDWARE_TABLE if peak and gpu.hbm_bytes_per_s else PeaksSource.NONE
        return DeviceInfo(platform=platform, device_type=gpu.describe(), chip=None,
                          peak_flops_per_s=peak if source is PeaksSource.HARDWARE_TABLE else None,
                          hbm_bytes_per_s=gpu.hbm_bytes_per_s if source is PeaksSource.HARDWARE_TABLE else None,
                          peaks_source=source, n_cores=n_cores, n_chips=len(chips) if chips else n_cores,
                          gpu=gpu)
    if platform is Platform.CPU and n_cores:
        return DeviceInfo(platform=platform, device_type="CPU (XLA's CPU runtime)", chip=None, peak_flops_per_s=None,
                          hbm_bytes_per_s=None, peaks_source=PeaksSource.NONE, n_cores=n_cores, n_chips=n_cores)
    device_type = str(plane_stats.get("device_type_string", "") or "")
    chip = chip_for(device_type) if platform is Platform.TPU else None
    peak_tf, peak_hbm = trace_peaks(plane_stats)
    if peak_tf > 0 and peak_hbm > 0:
        peak_flops, hbm_bw, source = peak_tf * 1e12, peak_hbm * 1e9, PeaksSource.TRACE
    elif chip is not None:
        per_core = chip.tensorcores_per_chip
        peak_flops, hbm_bw, source = chip.peak_bf16_flops_per_s / per_core, chip.hbm_bytes_per_s / per_core, \
            PeaksSource.HARDWARE_TABLE
    else:
        peak_flops, hbm_bw, source = None, None, PeaksSource.NONE
    return DeviceInfo(platform=platform, device_type=device_type, chip=chip, peak_flops_per_s=peak_flops,
                      hbm_bytes_per_s=hbm_bw, peaks_source=source, n_cores=n_cores,
                      n_chips=len(chips) if chips else n_cores, n_sparse_cores=n_sparse,
                      vmem=trace_vmem(plane_stats) or (chip.vmem_bandwidth if chip is not None else None))


TRACE_VMEM_SOURCE = "from the trace"


def trace_vmem(plane_stats: dict[str, object]) -> VmemBandwidth | None:
    """Peak VMEM read and write bandwidth per core from the plane's stats (libtpu stamps them, in the
    same unit as its HBM peak); None unless both are there and plausible."""
    values = [_as_float(plane_stats.get(f"peak_vmem_{d}_bw_gigabytes_per_second", 0.0)) for d in ("rd", "wr")]
    if any(v is None or not 0 < v <= MAX_PEAK_HBM_GB_PER_S * 10 for v in values):
        return None
    return VmemBandwidth(values[0] * 1e9, values[1] * 1e9, TRACE_VMEM_SOURCE)


def host_name(space, path: Path) -> str:
    """The host's name: the XSpace hostname, else the file name without `.xplane.pb`."""
    if space.hostnames and space.hostnames[0]:
        return space.hostnames[0]
    name = path.name
    return name[: -len(".xplane.pb")] if name.endswith(".xplane.pb") else path.stem


@dataclass(frozen=True)
class PlaneRef:
    """A device plane to parse: its index in the XSpace and its role."""

    index: int
    name: str
    core: int  # N of /device:TPU:N; SparseCore planes get N * 1000 + their number
    sparse: bool


def device_planes(names: list[str]) -> tuple[Platform, list[PlaneRef]]:
    """The platform and the device planes of a host, by plane name."""
    tc, sc, gpu = [], [], []
    for i, name in enumerate(names):
        if m := TPU_CORE_PLANE.match(name):
            tc.append(PlaneRef(i, name, int(m.group(1)), False))
        elif m := TPU_SPARSE_PLANE.match(name):
            sc.append(PlaneRef(i, name, int(m.group(1)) * 1000 + int(m.group(2)), True))
        elif m := GPU_PLANE.match(name):
            gpu.append(PlaneRef(i, name, int(m.group(1)), False))
    if tc:
        return Platform.TPU, sorted(tc + sc, key=lambda r: r.core)
    if gpu:
        return Platform.GPU, sorted(gpu, key=lambda r: r.core)
    return Platform.CPU, []


def parse_device_plane(plane, ref: PlaneRef, platform: Platform, axis: TimeAxis, lines=None) -> _HostBuilder:
    """One device plane's parts, in a builder of its own (merged into the host's later).

    `lines`: the plane's lines as `RawLine`s, when `plane` is an `XPlaneRawLines` (its lines
    split from its bytes by `parsers.capture`); None reads the XLines of a whole `XPlane`. Pure, with a picklable result, so that big hosts can parse their
    planes in worker processes.
    """
    b = _HostBuilder("", "")
    b.axis = axis
    stat_names = {k: md.name for k, md in plane.stat_metadata.items()}
    sid = {name: k for k, name in stat_names.items()}
    core = ref.core
    b.plane_stats = {} if ref.sparse else stats_dict(plane.stats, stat_names)
    chip = _plane_chip(plane, stat_names, core if not ref.sparse else core // 1000)
    b.chip = None if ref.sparse else chip
    plane_lines = list(plane.lines) if lines is None else lines
    lines = {ln.name: ln for ln in plane_lines}
    gpu = platform is Platform.GPU
    op_lines = [ln for ln in plane_lines if (ln.name in OP_LINES) or (gpu and ln.name not in GPU_NON_KERNEL_LINES)]
    for line in op_lines:
        b.add_op_line(plane, line, plane.name, core, chip, stat_names, sid, gpu)
    for name in STEP_LINES:
        if name in lines:
            b.add_steps(plane, lines[name], plane.name, core, sid)
    for name in MODULE_LINES:
        if name in lines:
            b.add_modules(plane, lines[name], plane.name, core)
    has_async_line = any(name in lines for name in ASYNC_LINES)
    for name in ASYNC_LINES:
        if name in lines:
            b.add_async(plane, lines[name], plane.name, core, stat_names, sid)
    if not has_async_line and platform is Platform.TPU:
        for part in b.ev_parts:
            names, codes = part["name"]
            b.pair_async_from_ops(plane.name, core, names, codes, part["start_ps"],
                                  part["start_ps"] + part["dur_ps"])
    return b


def merge_planes(b: _HostBuilder, parts: list[_HostBuilder]) -> None:
    """Fold per-plane builders into the host's builder, in plane order."""
    for part in parts:
        for key, meta in part.meta_rows.items():
            b.meta_rows.setdefault(key, meta)
        b.ev_parts.extend(part.ev_parts)
        b.step_rows.extend(part.step_rows)
        b.module_rows.extend(part.module_rows)
        b.async_parts.extend(part.async_parts)
        for pid, module in part.program_names.items():
            b.program_names.setdefault(pid, module)
        b.partial_overlaps += part.partial_overlaps
        b.ops_without_ids += part.ops_without_ids
        for w in part.warnings:
            b.warn(w)


def is_read_line(name: str, platform: Platform) -> bool:
    """Whether `parse_device_plane` reads a device line of this name; the others do not count."""
    return (name in OP_LINES or name in STEP_LINES or name in MODULE_LINES or name in ASYNC_LINES
            or (platform is Platform.GPU and name not in GPU_NON_KERNEL_LINES))


def anchor_of(plane) -> int | None:
    """The `Task Environment` plane's `profile_start_time`, when it is a usable anchor."""
    stat_names = {k: md.name for k, md in plane.stat_metadata.items()}
    return profile_anchor(stats_dict(plane.stats, stat_names).get(PROFILE_START_STAT))


def axis_of(device_stamps, host_stamps, task_env) -> TimeAxis:
    """The host's time axis from its lines' timestamps and its `Task Environment` plane (or None)."""
    return time_axis(device_stamps, host_stamps, anchor_of(task_env) if task_env is not None else None)


def assemble_host(host: str, path: Path, platform: Platform, refs: list[PlaneRef], parts: list[_HostBuilder],
                  aux_planes, axis: TimeAxis) -> HostTrace:
    """The host's tables from its parsed device planes and its host planes."""
    b = _HostBuilder(host, str(path))
    b.axis = axis  # XLA's CPU ops are placed on the host's axis like any device line
    host_threads = 0
    hlo_protos: dict[int, bytes] = {}
    cpu_events = None
    clock_apart = False
    if not axis.devices_aligned:
        b.warn(DEVICE_CLOCKS_SPLIT)
    for plane in aux_planes:
        if plane.name == "/host:CPU":
            host_threads = len(plane.lines)
            if platform is Platform.CPU:
                _cpu_device(b, plane)
            if axis.host_aligned:
                cpu_events = host_events(plane, axis, b.warn)
            elif plane.lines:
                b.warn(HOST_NOT_ALIGNED)
                clock_apart = True
        elif plane.name == "/host:metadata":
            hlo_protos = _hlo_protos(plane, b)
    merge_planes(b, parts)
    first_stats = next((p.plane_stats for r, p in zip(refs, parts) if not r.sparse), {})
    chips = {p.chip for p in parts if p.chip is not None}
    for pid, _ in hlo_protos.items():
        b.program_names.setdefault(pid, f"program {pid}")
    n_cores = sum(1 for r in refs if not r.sparse)
    if platform is Platform.CPU and b.ev_parts:  # XLA's CPU threads, read as one device
        n_cores, chips = 1, {0}
    device = _device_info(platform, first_stats, n_cores, chips, len(refs) - n_cores)
    if _peaks_damaged(first_stats):
        b.warn(IMPLAUSIBLE_PEAKS)
    if platform is Platform.CPU and not b.ev_parts:
        b.warn("no device plane (/device:TPU:N or /device:GPU:N) and no XLA CPU ops on `/host:CPU`: a "
               "host-only capture; there are no device ops to analyse")
    if b.partial_overlaps:
        b.warn(f"{b.partial_overlaps} op events partially overlap their predecessor on the same line; "
               "counted as nested for the overlapping part")
    if b.ops_without_ids:
        b.warn(f"{b.ops_without_ids} op metadata lack program_id or symbol_id: tpudiag keeps them, "
               "XProf drops them and counts their time as idle")
    if platform is not Platform.TPU:
        _with_gpu_costs(b, hlo_protos)
    if platform is Platform.GPU:
        if device.peaks_source is PeaksSource.NONE:
            b.warn(f"no peak FLOP/s known for {device.device_type or 'this GPU'} (its generation is not in "
                   "tpudiag's GPU table, or the plane records no SM count or clock): utilizations are not shown")
    elif device.peaks_source is PeaksSource.HARDWARE_TABLE:
        b.warn(f"no peak FLOP/s or HBM bandwidth in the trace; using public figures for {device.chip.generation}")
    elif platform is Platform.TPU and device.peaks_source is PeaksSource.NONE:
        b.warn(f"unknown device type {device.device_type!r} and no peaks in the trace: utilizations are not shown")
    steps = b.step_markers()
    return HostTrace(host=host, path=str(path), device=device, events=b.events(), op_metadata=b.op_metadata(),
                     step_markers=steps, modules=b.modules(), async_windows=b.async_windows(),
                     hlo_protos=hlo_protos, warnings=b.warnings, host_threads=host_threads, host_clock_apart=clock_apart,
                     modelled=bool(first_stats.get("tpudiag_modelled")), host_events=cpu_events)


# The `/host:CPU` plane is the device of a CPU run: XLA's CPU runtime runs each HLO op (a thunk) on
# its own threads (`tf_XLAEigen/<tid>`, `tf_XLAPjRtCpuClient/<tid>`, or inline on the caller's
# `python` thread) as an event with `hlo_op`, `hlo_module` and `program_id` stats; the threads
# are one device (core 0), as a GPU's streams are one GPU.
CPU_DEVICE = "/host:CPU"
CPU_OP = "xla cpu op"  # category until the embedded HLO gives XProf's


def _cpu_device(b: _HostBuilder, plane) -> None:
    """XLA's CPU ops and the `StepTraceAnnotation` steps of a `/host:CPU` plane, as device events."""
    stat_names = {k: md.name for k, md in plane.stat_metadata.items()}
    sid = {name: k for k, name in stat_names.items()}
    if "hlo_op" not in sid:
        return
    for line in plane.lines:
        b.add_op_line(plane, line, CPU_DEVICE, 0, 0, stat_names, sid, gpu=True, xla_only=True)
    for part in b.ev_parts:  # the GPU reader names them kernels: here they are XLA's CPU ops
        cats, pos = part["category"]
        part["category"] = (np.array([CPU_OP if c == "gpu kernel" else c for c in cats], dtype=object), pos)
    for key, meta in list(b.meta_rows.items()):
        if meta.category == "gpu kernel":
            b.meta_rows[key] = dataclasses.replace(meta, category=CPU_OP)
    step_id = sid.get("step_num")
    if step_id is None:
        return
    # jax.profiler.StepTraceAnnotation: a root TraceMe (`_r`) with `step_num`, as XProf's step trace reads it
    for line in plane.lines:
        base = b.line_base(line, CPU_DEVICE)
        if base is None:
            continue
        for ev in line.events:
            for st in ev.stats:
                if st.metadata_id == step_id:
                    num = _as_int(st.int64_value or st.uint64_value)
                    if num is not None and ev.duration_ps > 0 and plausible_spans(
                            np.array([base + ev.offset_ps]), np.array([ev.duration_ps])).all():
                        b.step_rows.append((CPU_DEVICE, 0, num, base + ev.offset_ps, ev.duration_ps))
                    break


def _with_gpu_costs(b: _HostBuilder, hlo_protos: dict[int, bytes]) -> None:
    """Give each GPU op (a kernel's `hlo_op`) XProf's category, FLOPs and bytes per occurrence from
    the program the capture embeds (`model.hlo_cost`); its kernel events take the category too."""
    from tpudiag.errors import InputError
    from tpudiag.parsers.hlo_proto import parse_hlo_proto

    programs: dict[int, object] = {}
    unread = 0
    for key, meta in list(b.meta_rows.items()):
        if meta.category not in ("gpu kernel", CPU_OP) or meta.program_id not in hlo_protos:
            continue
        if meta.program_id not in programs:
            try:
                programs[meta.program_id] = parse_hlo_proto(hlo_protos[meta.program_id], program_id=meta.program_id)
            except InputError:
                programs[meta.program_id] = None
                unread += 1
        program = programs[meta.program_id]
        inst = program.find(meta.name) if program is not None else None
        if inst is None:
            continue
        cost = gpu_op_cost(program, inst)
        source = f"{inst.source_file}:{inst.source_line}" if inst.source_file and inst.source_line else ""
        b.meta_rows[key] = dataclasses.replace(meta, category=cost.category, flops=cost.flops,
                                               bytes_accessed=cost.bytes_accessed, hbm_bytes=cost.bytes_accessed,
                                               source=source, tf_op=inst.op_name)
    if unread:
        b.warn(f"{unread} embedded HLO programs could not be read: their GPU ops have no FLOPs or bytes")
    for part in b.ev_parts:
        keys = part.get("meta_keys")
        if keys:
            _, pos = part["category"]
            part["category"] = (np.array([b.meta_rows[k].category for k in keys], dtype=object), pos)


def _hlo_protos(plane, b: _HostBuilder) -> dict[int, bytes]:
    """Serialized HloProto bytes by program id from `/host:metadata` (`Hlo Proto` stats)."""
    stat_names = {k: md.name for k, md in plane.stat_metadata.items()}
    out: dict[int, bytes] = {}
    for mid, md in plane.event_metadata.items():
        st = stats_dict(md.stats, stat_names)
        proto = st.get("Hlo Proto")
        if not isinstance(proto, bytes):
            continue
        m = _MODULE_NAME.match(md.name)
        # The id: its stat, else the number in `jit_f(<id>)`, else the metadata id (XProf keys the
        # programs by their id read as a signed int64; `as_program_id` reads it back unsigned).
        pid = (as_program_id(st.get("program_id")) or (as_program_id(m.group("id")) if m else None)
               or as_program_id(mid) or 0)
        out[pid] = proto
        if m:
            b.program_names.setdefault(pid, m.group("module"))
        elif md.name:
            b.program_names.setdefault(pid, md.name)
    return out
