"""A modelled XProf capture from a compiled program: its schedule, per-op estimates and an ICI model.

Every chip runs the same SPMD program, so each `/device:TPU:N` plane gets the same timeline:
the entry computation's ops in schedule order, back to back, each lasting its standalone
estimate (`tpudiag.analysis.cost_model`), never less than its FLOPs and HBM bytes take at the
core's peaks. An async done waits for its transfer: it lasts until start end + window (ICI time
for collectives, HBM time for copies), so the ops the compiler scheduled between a start and its
done overlap the transfer and only the rest is exposed. A copy's bytes cross HBM during its window,
so its start and done carry only what moves during their own time (`_op_defs`).
Sync collectives take their whole ICI time on the timeline. The capture is labelled modelled
(plane stat `tpudiag_modelled` = 1, read back as `Profile.modelled`). The HloProto it embeds is the
runtime's (`module.pb`), its Pallas custom calls given back the kernel body the XLA dump kept
(`_with_kernel_bodies`), so a kernel's grid and blocks read from the capture alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from google.protobuf.message import DecodeError

from tpudiag.model.compile_output import CompileOutput
from tpudiag.analysis.cost_model import PS_PER_S, CostModel, ProgramEstimate, estimate_program
from tpudiag.errors import UsageError
from tpudiag.proto import HloModuleProto
from tpudiag.writers.tpu_design import AsyncWindow, CaptureDesign, OpDef, Placed, build_capture

MODELLED_STAT = "tpudiag_modelled"
RUN_NAME = "modelled"
HOST_NAME = "modelled"  # the one host of a modelled capture
# Device type strings as XProf traces spell them (a real v6e trace says `TPU v6 Lite`).
DEVICE_TYPE = {"v4": "TPU v4", "v5e": "TPU v5 Lite", "v5p": "TPU v5p", "v6e": "TPU v6 Lite", "TPU7x": "TPU v7x"}


@dataclass(frozen=True)
class Timeline:
    """One step on one chip: placed ops and async windows, ps from the step start."""

    placed: tuple[Placed, ...]
    windows: tuple[AsyncWindow, ...]
    step_ps: int
    ops: pd.DataFrame  # the estimates, plus offset_ps and placed_ps (duration on the timeline)


def build_timeline(estimates: pd.DataFrame) -> Timeline:
    placed: list[Placed] = []
    windows: list[AsyncWindow] = []
    open_starts: dict[str, tuple[int, int, str]] = {}  # start name -> (start offset, ready at, family)
    offsets, durations = [], []
    t = 0
    for row in estimates.itertuples(index=False):
        dur = int(row.duration_ps)
        if row.async_role == "start" and row.partner:
            open_starts[row.name] = (t, t + dur + int(row.window_ps), row.family)
        elif row.partner in open_starts:  # its done, or the control-flow op that holds the done
            start_at, ready_at, family = open_starts.pop(row.partner)
            dur = max(dur, ready_at - t)
            windows.append(AsyncWindow(row.partner, start_at, t + dur - start_at, family))
        placed.append(Placed(row.name, t, dur))
        offsets.append(t)
        durations.append(dur)
        t += dur
    ops = estimates.assign(offset_ps=pd.array(offsets, dtype="int64"), placed_ps=pd.array(durations, dtype="int64"))
    return Timeline(tuple(placed), tuple(windows), t, ops)


def _with_kernel_bodies(module_proto: bytes, program) -> bytes:
    """`module_proto` whose Pallas custom calls carry the backend_config `program` has for them
    (with the kernel body the compile output's XLA dump kept, `parsers.compile_output.with_kernel_bodies`):
    the runtime's proto lost the body in the backend, and a modelled capture keeps it so that the
    lab and the report can show the kernel's grid and blocks from the capture alone."""
    configs = {name: inst.backend_config for name, inst in ((i.name, i) for i in program.instructions.values())
               if name in program.kernels}
    if not configs:
        return module_proto
    module = HloModuleProto()
    try:
        module.ParseFromString(module_proto)
    except DecodeError:
        return module_proto  # the capture embeds the proto as it is; its reader says what is wrong
    for computation in module.computations:
        for inst in computation.instructions:
            if inst.name in configs:
                inst.backend_config = configs[inst.name].encode()
    return module.SerializeToString()


def _hlo_proto(module_proto: bytes | None, program=None) -> bytes | None:
    """An `xla.HloProto` (field 1 = the HloModuleProto), as `/host:metadata` holds it."""
    if not module_proto:
        return None
    if program is not None:
        module_proto = _with_kernel_bodies(module_proto, program)
    n, varint = len(module_proto), bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return b"\x0a" + bytes(varint) + module_proto


def _operand_text(program, computation: str, name: str) -> str:
    """`shape %name`, as XProf's op long names print operands (a custom call's matmul shapes come from them)."""
    operand = program.instructions.get((computation, name))
    return f"{operand.shape_text} %{name}" if operand is not None and operand.shape_text else f"%{name}"


def _op_defs(output: CompileOutput, ops: pd.DataFrame, hbm_bytes_per_s: float) -> tuple[OpDef, ...]:
    """Op metadata as a trace states it. Bytes are the HBM bytes of the op's operands and result in
    their padded layouts (`estimate`): an operand a prefetch copy put in VMEM is not HBM traffic of
    the op that reads it, and the roofline's intensity and ridge are HBM's.

    A copy's or slice's start and done only issue and wait for a DMA whose bytes cross HBM during
    the window between them: each carries the bytes the DMA moves during its own time, at the HBM
    bandwidth, which is none for a start and for a done whose transfer was hidden (all of them over a
    10 ns done would be a rate no core reaches). A custom call's FLOPs are 0, as XLA's cost
    analysis writes them in a measured trace: the analysis derives them the same way for both
    (`analysis.custom_calls`).
    """
    program = output.program
    defs = []
    for row in ops.itertuples(index=False):
        inst = program.instruction(row.name)
        operands = ", ".join(_operand_text(program, inst.computation, o) for o in inst.operands)
        text = f"%{inst.name} = {inst.shape_text} {inst.opcode}({operands})"
        source = f"{Path(inst.source_file).name}:{inst.source_line}" if inst.source_file else ""
        if row.partner and not row.family:  # a DMA's start or done: only the wait moves bytes
            hbm = (int(row.placed_ps) - int(row.duration_ps)) / PS_PER_S * hbm_bytes_per_s
        else:
            hbm = float(row.hbm_bytes)
        defs.append(OpDef(name=row.name, category=str(row.category),
                          flops=0.0 if inst.opcode == "custom-call" else float(row.flops), bytes_accessed=hbm,
                          shape=inst.shape_text, source=source, tf_op=inst.op_name, hlo_text=text))
    return tuple(defs)


@dataclass(frozen=True)
class Simulated:
    """A modelled capture in memory: one host's serialized XSpace, and how it was made."""

    host: str  # the file name a capture would give it, `<host>.xplane.pb`
    xspace: bytes
    timeline: Timeline
    model: CostModel


def simulate_in_memory(output: CompileOutput, clock_ghz: float | None = None, ici_gbps: float | None = None,
                       ici_latency_us: float | None = None, steps: int = 3,
                       roofline_without_clock: bool = False, estimate: ProgramEstimate | None = None) -> Simulated:
    """The modelled capture of `output`, as `simulate` writes it, without writing it: what static
    mode analyses (`parsers.capture.profile_from_xspace`).

    Without a clock, estimated cycles cannot become time: that is a usage error unless
    `roofline_without_clock`, where each op lasts its FLOPs/bytes roofline time instead (the
    static report of `tpudiag report DUMPS` states which basis it used). With or without a clock,
    no op lasts less than its roofline time (`analysis.cost_model.CostModel`), so no modelled op runs above
    the core's peak. `estimate`: the program's estimates when the caller has them already (the
    static report's), else made here from the overrides.
    """
    if estimate is None:
        estimate = estimate_program(output, clock_ghz, ici_gbps, ici_latency_us)
    chip, model, n_devices, estimates = estimate.chip, estimate.model, estimate.n_devices, estimate.ops
    if not roofline_without_clock and model.clock_hz is None and estimates["estimated_cycles"].notna().any():
        raise UsageError(f"the {chip.generation} clock is not public, so cycles cannot become time",
                         hint="pass --clock-ghz (an assumption you state), e.g. --clock-ghz 1.5")
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, not {steps}")
    timeline = build_timeline(estimates)
    module = output.program.module or output.facts.get("module", "jit_program")
    # A bare dump's `target` is its directory: left out, so the id does not depend on where the
    # dump sits on disk (nor a golden on the checkout's path).
    target = "" if output.bare else output.facts.get("target", "")
    digest = hashlib.sha256(f"{module}:{target}".encode()).digest()
    program_id = int.from_bytes(digest[:8], "little") & 0x7FFFFFFFFFFFFFFF
    per_core = chip.tensorcores_per_chip
    design = CaptureDesign(
        hostname=HOST_NAME, device_type=DEVICE_TYPE.get(chip.generation, chip.generation),
        peak_tflops=chip.peak_bf16_flops_per_s / per_core / 1e12, peak_hbm_gbs=chip.hbm_bytes_per_s / per_core / 1e9,
        module=module, program_id=program_id, ops=_op_defs(output, timeline.ops, model.hbm_bytes_per_s),
        n_chips=n_devices,
        n_steps=steps, step_ps=max(timeline.step_ps, 1), schedule=lambda chip_i, step: timeline.placed,
        hlo_proto=_hlo_proto(output.hlo_proto, output.program), extra_plane_stats={MODELLED_STAT: 1},
        async_windows=lambda chip_i, step: timeline.windows, cores_per_chip=per_core)
    return Simulated(HOST_NAME, build_capture(design).serialize(), timeline, model)


def simulate(output: CompileOutput, logdir: Path, clock_ghz: float | None = None, ici_gbps: float | None = None,
             ici_latency_us: float | None = None, steps: int = 3,
             roofline_without_clock: bool = False) -> tuple[Path, Timeline, CostModel]:
    """Write `<logdir>/plugins/profile/modelled/<host>.xplane.pb` (`simulate_in_memory`); return
    it with the timeline and the cost model."""
    sim = simulate_in_memory(output, clock_ghz, ici_gbps, ici_latency_us, steps, roofline_without_clock)
    path = logdir / "plugins" / "profile" / RUN_NAME / f"{sim.host}.xplane.pb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(sim.xspace)
    return path, sim.timeline, sim.model
