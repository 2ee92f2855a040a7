"""Write a TPU capture from a design: ops with known costs placed on a per-chip, per-step timeline.

The output follows XProf's TPU conventions (one `/device:TPU:N` plane per chip with `XLA Modules`,
`XLA Ops`, `Async XLA Ops` and `Steps` lines; op facts on event metadata; device times as
`device_offset_ps`/`device_duration_ps` stats; `group_id` on step and op events so XProf's own
grouping is skipped), so the same file can be read by tpudiag and by the installed `xprof`.
Designs are used for the bundled example, tests with known values, the benchmark and the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tpudiag.model.hlo_names import pair_async, window_family
from tpudiag.model.program_ids import as_int64
from tpudiag.proto import CoreDetails, MemoryAccessBreakdown
from tpudiag.writers.xspace_builder import U64, PlaneBuilder, XSpaceBuilder

HBM = 1
READ, WRITE = 1, 2


@dataclass(frozen=True)
class OpDef:
    """One HLO instruction: its category and per-occurrence cost."""

    name: str
    category: str
    flops: float = 0.0
    bytes_accessed: float = 0.0
    hbm_read_bytes: float | None = None  # None: every accessed byte is HBM, split half read, half write
    hbm_write_bytes: float | None = None
    shape: str = ""
    source: str = ""
    tf_op: str = ""
    hlo_text: str = ""  # full HLO text; derived from name, shape and category when empty

    def text(self) -> str:
        if self.hlo_text:
            return self.hlo_text
        opcode = self.category.split()[-1] if self.category else "custom-call"
        return f"%{self.name} = {self.shape or 'f32[]'} {opcode}()"


@dataclass(frozen=True)
class Placed:
    """An occurrence of op `op` at `offset_ps` from its step's start, lasting `dur_ps`."""

    op: str
    offset_ps: int
    dur_ps: int


@dataclass(frozen=True)
class AsyncWindow:
    """An `Async XLA Ops` event: async op `op` (the start) in flight from `offset_ps` for `dur_ps`."""

    op: str
    offset_ps: int
    dur_ps: int
    family: str = ""  # collective family, '' for copies


@dataclass(frozen=True)
class HostSpan:
    """A `/host:CPU` TraceMe span on thread `thread`, at `offset_ps` from its step's start on chip 0."""

    thread: str
    name: str
    offset_ps: int
    dur_ps: int


@dataclass
class CaptureDesign:
    hostname: str
    device_type: str
    peak_tflops: float | None
    peak_hbm_gbs: float | None
    module: str
    program_id: int
    ops: tuple[OpDef, ...]
    n_chips: int
    n_steps: int
    step_ps: int
    schedule: Callable[[int, int], Iterable[Placed]]  # (chip, step) -> occurrences
    first_step: int = 1
    first_chip: int = 0  # global index of this host's first chip (multi-host designs)
    step_gap_ps: int = 0  # idle time between steps
    line_timestamp_ns: int = 0
    steps_line: bool = True
    async_line: bool = True
    modules_line: bool = True
    hlo_proto: bytes | None = None
    step_ps_for: Callable[[int, int], int] | None = None  # (chip, step) -> step length, default step_ps
    extra_plane_stats: dict = field(default_factory=dict)
    # (chip, step) -> explicit async windows; None pairs start/done ops by name instead
    async_windows: Callable[[int, int], Iterable[AsyncWindow]] | None = None
    cores_per_chip: int = 1  # TensorCore planes per chip (2 on v4 and TPU7x as JAX exposes them)
    # step -> host TraceMe spans (dispatch, transfers, compilation); None writes one empty main thread
    host_spans: Callable[[int], Iterable[HostSpan]] | None = None

    def step_length(self, chip: int, step: int) -> int:
        return self.step_ps_for(chip, step) if self.step_ps_for else self.step_ps


def _breakdown(op: OpDef) -> bytes:
    read = op.hbm_read_bytes if op.hbm_read_bytes is not None else op.bytes_accessed / 2
    write = op.hbm_write_bytes if op.hbm_write_bytes is not None else op.bytes_accessed / 2
    msg = MemoryAccessBreakdown()
    msg.memory_accessed.add(operation_type=READ, memory_space=HBM, bytes_accessed=int(read))
    msg.memory_accessed.add(operation_type=WRITE, memory_space=HBM, bytes_accessed=int(write))
    return msg.SerializeToString()


def _op_metadata(plane: PlaneBuilder, design: CaptureDesign) -> dict[str, int]:
    ids = {}
    for symbol, op in enumerate(design.ops, start=1):
        stats = {"program_id": U64(design.program_id), "symbol_id": U64(symbol), "hlo_category": op.category,
                 "flops": int(op.flops), "model_flops": int(op.flops), "bytes_accessed": int(op.bytes_accessed),
                 "memory_access_breakdown": _breakdown(op)}
        if op.shape:
            stats["shape_with_layout"] = op.shape
        if op.source:
            stats["source"] = op.source
        if op.tf_op:
            stats["tf_op"] = op.tf_op
        ids[op.name] = plane.event_metadata(op.text(), op.name, stats)
    return ids


def _device_plane(space: XSpaceBuilder, design: CaptureDesign, chip: int) -> None:
    global_core = design.first_chip + chip
    per_chip = max(1, design.cores_per_chip)
    plane = space.plane(f"/device:TPU:{chip}", plane_id=2 + 8 * chip)
    details = CoreDetails(hostname=design.hostname, device_ordinal=chip, core_num=chip % per_chip,
                          local_chip_id=chip // per_chip, global_chip_id=global_core // per_chip,
                          global_core_id=global_core)
    plane.set_stat("core_details", details.SerializeToString())
    if design.device_type:
        plane.set_stat("device_type_string", design.device_type)
    if design.peak_tflops:
        plane.set_stat("peak_teraflops_per_second", float(design.peak_tflops))
    if design.peak_hbm_gbs:
        plane.set_stat("peak_hbm_bw_gigabytes_per_second", float(design.peak_hbm_gbs))
    for name, value in design.extra_plane_stats.items():
        plane.set_stat(name, value)
    plane.set_stat("has_megacore", 0)
    op_ids = _op_metadata(plane, design)
    texts = {op.name: op.text() for op in design.ops}
    ts = design.line_timestamp_ns
    # Line order matters to XProf: it intersects each op line's steps with the step markers
    # seen so far, so the Steps line must come first or every step is dropped.
    steps_line = plane.line("Steps", 1, ts) if design.steps_line else None
    modules = plane.line("XLA Modules", 2, ts) if design.modules_line else None
    ops_line = plane.line("XLA Ops", 3, ts)
    async_line = plane.line("Async XLA Ops", 4, ts) if design.async_line else None
    module_md = plane.event_metadata(f"{design.module}({design.program_id})")
    t = 0
    for i in range(design.n_steps):
        step = design.first_step + i
        length = design.step_length(chip, step)
        placed = sorted(design.schedule(chip, step), key=lambda p: (p.offset_ps, -p.dur_ps))
        group = {"group_id": step}
        if steps_line is not None:
            steps_line.event(plane.event_metadata(str(step)), t, length, dict(group))
        if placed and modules is not None:
            first = placed[0].offset_ps
            last = max(p.offset_ps + p.dur_ps for p in placed)
            modules.event(module_md, t + first, last - first,
                          {"run_id": U64(step), "group_id": step})
        if async_line is not None and design.async_windows is not None:
            for w in design.async_windows(chip, step):
                md = plane.event_metadata(texts[w.op], f"async-{w.family or 'copy'}")
                async_line.event(md, t + w.offset_ps, w.dur_ps, {"hlo_op": w.op, **group})
        for p in placed:
            start = t + p.offset_ps
            ops_line.event(op_ids[p.op], start, p.dur_ps,
                           {"device_offset_ps": U64(start), "device_duration_ps": U64(p.dur_ps), **group})
        if async_line is not None and design.async_windows is None:  # windows from start/done names
            for si, di in pair_async([p.op for p in placed]):
                s, d = placed[si], placed[di]
                md = plane.event_metadata(texts[s.op], f"async-{window_family(s.op)}")
                async_line.event(md, t + s.offset_ps, d.offset_ps + d.dur_ps - s.offset_ps,
                                 {"hlo_op": s.op, **group})
        t += length + design.step_gap_ps


def build_capture(design: CaptureDesign) -> XSpaceBuilder:
    space = XSpaceBuilder(design.hostname)
    for chip in range(design.n_chips):
        _device_plane(space, design, chip)
    meta = space.plane("/host:metadata", plane_id=100)
    if design.hlo_proto is not None:
        meta.event_metadata(f"{design.module}({design.program_id})", stats={"Hlo Proto": design.hlo_proto},
                            metadata_id=as_int64(design.program_id))  # as XProf keys it
    host = space.plane("/host:CPU", plane_id=101)
    if design.host_spans is None:
        host.line("main/1", 1, design.line_timestamp_ns)
    else:
        _host_lines(host, design)
    return space


def _host_lines(plane: PlaneBuilder, design: CaptureDesign) -> None:
    """Host spans placed relative to each step's start on chip 0, one line per thread."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    t = 0
    for i in range(design.n_steps):
        step = design.first_step + i
        for sp in design.host_spans(step):
            spans.setdefault(sp.thread, []).append((t + sp.offset_ps, sp.dur_ps, sp.name))
        t += design.step_length(0, step) + design.step_gap_ps
    for line_id, (thread, events) in enumerate(spans.items(), start=1):
        line = plane.line(thread, line_id, design.line_timestamp_ns)
        for start, dur, name in sorted(events, key=lambda e: (e[0], -e[1])):
            line.event(plane.event_metadata(name), start, dur)


def write_capture(design: CaptureDesign, run_dir: Path) -> Path:
    """Write `<run_dir>/<hostname>.xplane.pb` and return its path."""
    return build_capture(design).write(run_dir / f"{design.hostname}.xplane.pb")
