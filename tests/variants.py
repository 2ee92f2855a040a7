"""Metamorphic variants of a capture: rewrites of a host file that must not change what tpudiag
(or XProf) reports, and every capture the project has to apply them to.

Each rewrite is one a valid producer could make (docs/time-axis.md):

- `epoch`: some planes' lines re-expressed on an absolute epoch clock, offsets unchanged, with
  the `Task Environment` plane's `profile_start_time` saying where that clock's zero was (the
  capture's own anchor when it has one);
- `one-clock`: every line re-expressed on one epoch clock, with no anchor added;
- `reorder`: planes, lines and events in another order (the format does not order them);
- `renumber`: other event and stat metadata ids (they are keys, not values), except on
  `/host:metadata`, whose metadata ids are program ids by XProf's convention;
- `unknown`: planes, lines and stats tpudiag does not know, added. Not lines on a GPU device
  plane, where every line not named otherwise is a kernel stream by convention.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.rules import scenarios as sc
from tpudiag.parsers.device_trace import GPU_PLANE, TPU_CORE_PLANE, TPU_SPARSE_PLANE
from tpudiag.parsers.time_axis import EPOCH_MIN_NS, PROFILE_START_STAT, TASK_ENV_PLANE
from tpudiag.proto import XSpace
from tpudiag.writers.tpu_design import CaptureDesign, build_capture

EPOCH_NS = 1_764_000_000_000_000_000  # late 2025
SHARED = REPO.parent / "shared" / "data" / "real-captures"
REAL = REPO / "tests" / "fixtures" / "real"
TRACE = "*.xplane.pb"

# -- the rewrites ---------------------------------------------------------------------------------


def _copies(field) -> list:
    out = []
    for item in field:
        c = type(item)()
        c.CopyFrom(item)
        out.append(c)
    return out


def _replace(field, items: list) -> None:
    del field[:]
    field.extend(items)


def _stat_id(plane, name: str) -> int | None:
    return next((k for k, md in plane.stat_metadata.items() if md.name == name), None)


def profile_start(space: XSpace) -> int | None:
    for plane in space.planes:
        sid = _stat_id(plane, PROFILE_START_STAT) if plane.name == TASK_ENV_PLANE else None
        for st in plane.stats if sid is not None else ():
            if st.metadata_id == sid:
                return st.uint64_value or st.int64_value
    return None


def on_epoch_clock(space: XSpace, rng: random.Random) -> None:
    relative = [p for p in space.planes if p.lines and all(ln.timestamp_ns < EPOCH_MIN_NS for ln in p.lines)]
    if not relative:
        return
    start = profile_start(space)
    if start is None:
        start = EPOCH_NS + rng.randrange(10**15)
        env = space.planes.add(id=max((p.id for p in space.planes), default=0) + 1, name=TASK_ENV_PLANE)
        env.stat_metadata[1].id = 1
        env.stat_metadata[1].name = PROFILE_START_STAT
        env.stats.add(metadata_id=1, uint64_value=start)
    for plane in rng.sample(relative, rng.randint(1, len(relative))):
        for line in plane.lines:
            line.timestamp_ns += start


def on_one_epoch_clock(space: XSpace, rng: random.Random) -> None:
    """Every relative line moved to one epoch clock, with no anchor added: one clock for all, so
    the capture reads as it did (docs/time-axis.md, rule 3)."""
    start = profile_start(space) or EPOCH_NS + rng.randrange(10**15)
    for plane in space.planes:
        for line in plane.lines:
            if line.timestamp_ns < EPOCH_MIN_NS:
                line.timestamp_ns += start


def reorder(space: XSpace, rng: random.Random) -> None:
    planes = _copies(space.planes)
    rng.shuffle(planes)
    for plane in planes:
        lines = _copies(plane.lines)
        rng.shuffle(lines)
        for line in lines:
            events = _copies(line.events)
            rng.shuffle(events)
            _replace(line.events, events)
        _replace(plane.lines, lines)
    _replace(space.planes, planes)


def _fresh_ids(rng: random.Random, old: Iterable[int]) -> dict[int, int]:
    old = sorted(old)
    new = rng.sample(range(1, 1 << 40), len(old))
    return dict(zip(old, new))


def renumber(space: XSpace, rng: random.Random) -> None:
    for plane in space.planes:
        smap = _fresh_ids(rng, plane.stat_metadata)
        emap = {} if plane.name == "/host:metadata" else _fresh_ids(rng, plane.event_metadata)

        def stats(field) -> None:
            for st in field:
                st.metadata_id = smap.get(st.metadata_id, st.metadata_id)
                if st.WhichOneof("value") == "ref_value":
                    st.ref_value = smap.get(st.ref_value, st.ref_value)

        stat_mds = {k: md for k, md in _copies_map(plane.stat_metadata)}
        plane.stat_metadata.clear()
        for k, md in stat_mds.items():
            md.id = smap[k]
            plane.stat_metadata[smap[k]].CopyFrom(md)
        event_mds = dict(_copies_map(plane.event_metadata))
        plane.event_metadata.clear()
        for k, md in event_mds.items():
            k2 = emap.get(k, k)
            md.id = k2 if md.id == k else md.id
            md.child_id[:] = [emap.get(c, c) for c in md.child_id]
            stats(md.stats)
            plane.event_metadata[k2].CopyFrom(md)
        stats(plane.stats)
        for line in plane.lines:
            for ev in line.events:
                ev.metadata_id = emap.get(ev.metadata_id, ev.metadata_id)
                stats(ev.stats)


def _copies_map(field) -> list[tuple[int, object]]:
    out = []
    for k, v in field.items():
        c = type(v)()
        c.CopyFrom(v)
        out.append((k, c))
    return out


_UNKNOWN_PLANES = ("/device:CUSTOM:tpudiag metamorphic", "tpudiag unknown plane", "/host:tpudiag-unknown")


def _unknown_stat(plane, rng: random.Random, into) -> None:
    """Insert a stat of an unknown name, of a random kind, at a random place in `into`."""
    sid = _stat_id(plane, "tpudiag_unknown_stat")
    if sid is None:
        sid = max(plane.stat_metadata, default=0) + 1
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = "tpudiag_unknown_stat"
    items = _copies(into)
    new = into.add(metadata_id=sid)
    kind = rng.randrange(4)
    if kind == 0:
        new.int64_value = rng.randrange(-(1 << 63), 1 << 63)
    elif kind == 1:
        new.str_value = "unknown ✓"
    elif kind == 2:
        new.double_value = rng.random() * 1e30
    else:
        new.bytes_value = bytes(rng.randrange(256) for _ in range(8))
    extra = type(new)()
    extra.CopyFrom(new)
    items.insert(rng.randint(0, len(items)), extra)
    _replace(into, items)


def add_unknown(space: XSpace, rng: random.Random) -> None:
    for plane in list(space.planes):
        _unknown_stat(plane, rng, plane.stats)
        for md in rng.sample(list(plane.event_metadata.values()), min(5, len(plane.event_metadata))):
            _unknown_stat(plane, rng, md.stats)
        for line in plane.lines:
            for ev in rng.sample(list(line.events), min(20, len(line.events))):
                _unknown_stat(plane, rng, ev.stats)
        if TPU_CORE_PLANE.match(plane.name) or TPU_SPARSE_PLANE.match(plane.name):
            stamps = [ln.timestamp_ns for ln in plane.lines] or [0]
            line = plane.lines.add(id=max((ln.id for ln in plane.lines), default=0) + 1,
                                   name=rng.choice(["tpudiag unknown line", "XLA TraceMe", "Framework Ops"]),
                                   timestamp_ns=rng.choice([min(stamps), max(stamps) + 10**9, EPOCH_NS, -(1 << 62)]))
            # Its events have metadata of their own: an HLO op's event on another line than `XLA Ops`
            # is not unknown to XProf, which counts it (docs/xprof-differences.md).
            mid = max(plane.event_metadata, default=0) + 1
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = "unknown event"
            for i in range(5):
                line.events.add(metadata_id=mid, offset_ps=i * 1000, duration_ps=rng.randrange(-5, 10**9))
        elif GPU_PLANE.match(plane.name):
            pass  # an unknown line on a GPU plane is a kernel stream by convention: not "unknown"
    extra = space.planes.add(id=max((p.id for p in space.planes), default=0) + 1, name=rng.choice(_UNKNOWN_PLANES))
    extra.event_metadata[1].id = 1
    extra.event_metadata[1].name = "unknown event"
    line = extra.lines.add(id=1, name="unknown line", timestamp_ns=rng.choice([0, EPOCH_NS]))
    for i in range(3):
        line.events.add(metadata_id=1, offset_ps=i * 10**6, duration_ps=10**5)
        _unknown_stat(extra, rng, line.events[i].stats)


TRANSFORMS: dict[str, Callable[[XSpace, random.Random], None]] = {
    "epoch": on_epoch_clock, "one-clock": on_one_epoch_clock, "reorder": reorder, "renumber": renumber,
    "unknown": add_unknown,
}


def variant_bytes(data: bytes, transforms: Iterable[str], seed: int) -> bytes:
    space = XSpace()
    space.ParseFromString(data)
    rng = random.Random(seed)
    for name in transforms:
        TRANSFORMS[name](space, rng)
    return space.SerializeToString()


def write_variant(run: Path, out: Path, transforms: Iterable[str], seed: int) -> Path:
    """The run directory `out` holding every host file of `run`, rewritten."""
    transforms = list(transforms)
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(sorted(run.glob(TRACE))):
        (out / f.name).write_bytes(variant_bytes(f.read_bytes(), transforms, seed + i))
    return out


# -- every capture the project has ----------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    name: str
    write: Callable[[Path], Path]  # writes (or finds) the capture, returns its run directory
    xprof: bool = False  # a TPU capture xprof's per-op tools read


def _existing(run: Path) -> Callable[[Path], Path]:
    return lambda _root: run


def _designs(*designs: CaptureDesign) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        run = root / "plugins" / "profile" / "run"
        run.mkdir(parents=True, exist_ok=True)
        for d in designs:
            (run / f"{d.hostname}.xplane.pb").write_bytes(build_capture(d).proto.SerializeToString())
        return run
    return write


def _run_of(capture_dir: Path) -> Path:
    return sorted(p.parent for p in capture_dir.glob(f"plugins/profile/*/{TRACE}"))[-1]


US = sc.US
SCENARIOS = {
    "exposed_collectives": sc.exposed_collectives(),
    "hidden_collectives": sc.hidden_collectives(),
    "barely_exposed": sc.barely_exposed(),
    "low_mxu": sc.low_mxu(),
    "padding": sc.padding(),
    "healthy": sc.healthy(),
    "decode_v6e": sc.decode_v6e(),
    "idle_training": sc.idle_training(1500 * US, "TransferFromDevice"),
    "decode_near_roof": sc.decode_near_roof(),
    "elementwise_bound": sc.elementwise_bound(),
    "pallas_f32": sc.pallas_f32(),
    "periodic_checkpoint": sc.periodic_checkpoint(),
    "looped_collectives": sc.looped_collectives(),
    "start_done_pairs": sc.exposed_collectives(async_line=False),
}


def captures() -> list[Capture]:
    out = [Capture("example:train_v6e_4chip", _existing(_run_of(REPO / "examples" / "captures" / "train_v6e_4chip")),
                   xprof=True),
           Capture("real:cpu_jax_profiler", _existing(_run_of(REPO / "examples" / "captures" / "cpu_jax_profiler"))),
           # A real 4-chip v6e inference capture made by others (tests/fixtures/real/README.md).
           Capture("real:tpu_v6e_hostoffload_inference", _existing(_run_of(REAL / "tpu-v6e-hostoffload-inference" / "trace")),
                   xprof=True)]
    for model in sorted((REPO / "examples" / "models" / "captures").iterdir()):
        out.append(Capture(f"model:{model.name}", _existing(_run_of(model)), xprof="pallas" in model.name))
    for name, design in SCENARIOS.items():
        out.append(Capture(f"scenario:{name}", _designs(design), xprof=name in ("exposed_collectives", "looped_collectives")))
    out.append(Capture("scenario:straggler_hosts", _designs(*sc.straggler_hosts())))
    for real in ("jax-gpu-conv3d-8gpu", "jax-gpu-te-fused-attn"):
        out.append(Capture(f"shared:{real}", _existing(SHARED / real / "plugins" / "profile" / "run")))
    return out
