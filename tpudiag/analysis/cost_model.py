"""Per-op static estimates of a compiled program: cycles, time at a clock, bytes, collectives.

Every number here is modelled, none measured:

- compute time = estimated cycles / clock. Cycles are the compiler's own: the static LLO
  profile's `bundle_analysis_data` when present, else the classic cost model's `window_config`
  (conv/dot fusions only). The profile reports 0 cycles for collectives and for compute that
  carries a collective continuation (v5e); for those the classic estimate is used when there is one.
- HBM time = bytes of the op's operands and result that live in HBM (memory space 0), in their
  padded layouts, / HBM bandwidth.
- ICI time (collectives) = latency + algorithm factor x payload bytes / ICI bandwidth, with
  ring factors: all-gather, reduce-scatter and all-to-all (n-1)/n, all-reduce 2(n-1)/n,
  permute and others 1, n = participants per replica group. Payload = the larger of the
  collective's result and operands.
- FLOPs time = the op's matmul FLOPs / the core's peak FLOP/s: the roofline floor. No core runs
  faster, so no estimate goes below it: compiler cycles at a stated clock can (v6e's clock is an
  assumption), and a plain `--xla_dump_to` dump has no cycles at all.
- An op's standalone time = max(compute, FLOPs time, HBM, ICI), at least `min_op_ps`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.model.collectives import ICI_LATENCY_PS, ring_factor
from tpudiag.model.compile_output import CompileOutput
from tpudiag.model.compiled import CompiledProgram, Instruction, leaf_arrays
from tpudiag.model.hardware import ChipSpec
from tpudiag.parsers.hlo_program import COLLECTIVE_OPCODES, FREE_OPCODES

PS_PER_S = 1e12
_MATMUL_OPCODES = frozenset({"dot", "convolution", "ragged-dot"})

# The per-op table: one row per entry-computation instruction that does work, in schedule order.
OP_ESTIMATE_COLUMNS = {
    "position": "schedule position in the entry computation",
    "name": "HLO instruction name",
    "opcode": "HLO opcode",
    "category": "XProf-style hlo_category (loop fusion, convolution fusion, all-gather, ...)",
    "family": "collective family, '' for other ops",
    "async_role": "start, done or ''",
    "partner": "the other half of an async start/done pair, else ''",
    "pair_kind": "collective, copy, slice, call or async for pair members, else ''",
    "estimated_cycles": "compiler-estimated cycles (Int64, NA when the compiler gave none)",
    "cycles_source": "bundle_analysis_data (static LLO profile), window_config (classic model) or ''",
    "compute_ps": "estimated_cycles / clock (Int64, NA without cycles or clock)",
    "flops": "FLOPs of the dots, convolutions and custom calls the op runs (its fused computations "
             "included); elementwise work is not counted",
    "flops_ps": "flops / the core's peak FLOP/s (0 without a peak): the floor of the op's time",
    "logical_bytes": "operands + result, logical",
    "padded_bytes": "operands + result, in their tiled layouts",
    "hbm_bytes": "padded bytes of operands and result that live in HBM",
    "hbm_ps": "hbm_bytes / HBM bandwidth",
    "payload_bytes": "collective payload (0 for other ops)",
    "group_size": "participants per replica group (0 for other ops)",
    "ici_ps": "modelled collective time (0 for other ops)",
    "window_ps": "async starts: modelled transfer time until the done can complete (ICI for "
                 "collectives, HBM for copies); 0 for other ops",
    "duration_ps": "standalone time: max(compute, FLOPs, HBM, ICI), at least min_op_ps; async starts "
                   "and dones exclude the transfer (see window_ps)",
    "spill_stores": "VMEM spill stores from the LLO bundle profile (Int64, NA when not dumped)",
    "spill_fills": "VMEM spill fills (Int64, NA when not dumped)",
}


@dataclass(frozen=True)
class IciModel:
    """A stated collective model: time = latency + factor x bytes / bandwidth."""

    bytes_per_s: float
    latency_ps: int

    @staticmethod
    def factor(family: str, n: int) -> float:
        return ring_factor(family, n)

    def collective_ps(self, family: str, payload_bytes: int, n: int) -> int:
        return int(self.latency_ps + self.factor(family, n) * payload_bytes / self.bytes_per_s * PS_PER_S)


@dataclass(frozen=True)
class CostModel:
    clock_hz: float | None  # None: cycles are not turned into time
    hbm_bytes_per_s: float
    ici: IciModel
    min_op_ps: int = 10_000  # 10 ns: every scheduled op takes at least this long
    peak_flops_per_s: float | None = None  # per core; None: no FLOPs floor on op times
    clock_given: bool = False  # the clock is the user's (--clock-ghz), not the chip's public one

    @staticmethod
    def for_chip(chip: ChipSpec, clock_hz: float | None = None, ici_bytes_per_s: float | None = None,
                 ici_latency_ps: int | None = None) -> "CostModel":
        """Defaults: the chip's public clock, per-core bf16 peak and HBM bandwidth; ICI = both
        directions of one link (2 x the per-link one-way figure), 2 µs latency."""
        return CostModel(
            clock_hz=clock_hz if clock_hz is not None else chip.clock_hz, clock_given=clock_hz is not None,
            hbm_bytes_per_s=chip.hbm_bytes_per_s / chip.tensorcores_per_chip,
            peak_flops_per_s=chip.peak_bf16_flops_per_s / chip.tensorcores_per_chip,
            ici=IciModel(bytes_per_s=ici_bytes_per_s if ici_bytes_per_s is not None
                         else 2 * chip.ici_bytes_per_s_per_link,
                         latency_ps=ici_latency_ps if ici_latency_ps is not None else ICI_LATENCY_PS))

    @staticmethod
    def for_flags(chip: ChipSpec, clock_ghz: float | None, ici_gbps: float | None,
                  ici_latency_us: float | None) -> "CostModel":
        """`for_chip` with the overrides as the CLI takes them (GHz, GB/s, µs); None keeps the default."""
        return CostModel.for_chip(chip, clock_hz=clock_ghz * 1e9 if clock_ghz else None,
                                  ici_bytes_per_s=ici_gbps * 1e9 if ici_gbps else None,
                                  ici_latency_ps=int(ici_latency_us * 1e6) if ici_latency_us is not None else None)


def _classic_cycles(backend_config: str) -> int | None:
    if "window_config" not in backend_config:
        return None
    try:
        cfg = json.loads(backend_config)
        return int(cfg["window_config"]["estimated_cycles"])
    except (ValueError, KeyError, TypeError):
        return None


def op_cycles(inst: Instruction) -> tuple[int | None, str]:
    """The compiler's cycle estimate for an op; a profile 0 falls back to the classic model."""
    cycles, source = inst.estimated_cycles, inst.cycles_source
    if cycles == 0 and source == "bundle_analysis_data":
        classic = _classic_cycles(inst.backend_config)
        if classic:
            return classic, "window_config"
    return cycles, source


def _called_instructions(program: CompiledProgram, inst: Instruction, depth: int = 3) -> list[Instruction]:
    out: list[Instruction] = []
    for comp in inst.called_computations:
        if comp not in program.computations:
            continue
        for sub in program.computation_instructions(comp):
            out.append(sub)
            if depth > 1 and sub.called_computations:
                out.extend(_called_instructions(program, sub, depth - 1))
    return out


def xprof_category(program: CompiledProgram, inst: Instruction) -> str:
    """A category in XProf's vocabulary, from the opcode, fusion kind and fused body."""
    op = inst.opcode
    if inst.collective_family and not inst.is_continuation:
        family = inst.collective_family
        if family == "reduce-scatter" and op == "fusion":
            return "all-reduce-scatter fusion"
        return f"{family} fusion" if op == "fusion" and not inst.async_role else family
    if op == "fusion":
        body = {i.opcode for i in _called_instructions(program, inst, 2)}
        if body & _MATMUL_OPCODES:
            return "convolution fusion"
        if inst.fusion_kind == "kLoop":
            return "loop fusion"
        if inst.fusion_kind == "kInput":
            return "reduction fusion" if "reduce" in body else "input fusion"
        if inst.fusion_kind == "kOutput":
            return "output fusion"
        return "custom fusion"
    if op in _MATMUL_OPCODES:
        return "convolution"
    return op


def _hbm_bytes(program: CompiledProgram, comp: str, inst: Instruction) -> int:
    arrays = leaf_arrays(inst.shape) if inst.shape is not None else []
    if inst.opcode != "get-tuple-element":
        for name in inst.operands:
            o = program.instructions.get((comp, name))
            if o is not None and o.shape is not None:
                arrays.extend(leaf_arrays(o.shape))
    return sum(a.padded_bytes for a in arrays if a.memory_space == 0)


def _operand_bytes(program: CompiledProgram, comp: str, inst: Instruction) -> tuple[int, int]:
    logical = padded = 0
    for name in inst.operands:
        o = program.instructions.get((comp, name))
        if o is not None:
            logical += o.logical_bytes
            padded += o.padded_bytes
    return logical, padded


def _collective_payload(program: CompiledProgram, comp: str, inst: Instruction,
                        group_sizes: dict[str, int], n_devices: int) -> tuple[int, int]:
    """(payload bytes, group size) of a collective or async collective wrapper."""
    target, target_comp = inst, comp
    if inst.opcode not in COLLECTIVE_OPCODES:
        inner = [i for i in _called_instructions(program, inst) if i.opcode in COLLECTIVE_OPCODES]
        if inner:
            target, target_comp = inner[0], inner[0].computation
    _, op_padded = _operand_bytes(program, target_comp, target)
    result = target.padded_bytes
    if target.opcode.endswith("-start") and target.shape is not None:  # (operand, result, ...) tuple
        result = max((a.padded_bytes for a in leaf_arrays(target.shape)), default=0)
        op_padded = 0
    payload = max(result, op_padded)
    size = group_sizes.get(target.name) or group_sizes.get(inst.name)
    if size is None:
        for callee in inst.called_computations:
            size = group_sizes.get(f"computation:{callee}")
            if size:
                break
    return payload, int(size or n_devices)


def _computation_flops(program: CompiledProgram, comp: str, matmul: dict[tuple[str, str], float],
                       depth: int, memo: dict[tuple[str, int], float]) -> float:
    """Dot/convolution FLOPs in `comp` and the computations it calls, `depth` levels down."""
    key = (comp, depth)
    if key not in memo:
        total = 0.0
        for sub in program.computation_instructions(comp):
            total += matmul.get((comp, sub.name), 0.0)
            if depth > 0:
                total += sum(_computation_flops(program, c, matmul, depth - 1, memo)
                             for c in sub.called_computations if c in program.computations)
        memo[key] = total
    return memo[key]


def _op_flops(program: CompiledProgram, inst: Instruction, matmul: dict[tuple[str, str], float],
              memo: dict[tuple[str, int], float]) -> float:
    own = matmul.get((inst.computation, inst.name), 0.0)
    return own + sum(_computation_flops(program, c, matmul, 3, memo)
                     for c in inst.called_computations if c in program.computations)


def _spills_by_entry_op(program: CompiledProgram, spills: pd.DataFrame | None) -> dict[str, tuple]:
    """Entry op -> (spill stores, fills): its own, plus those of the LLO programs it runs below the
    entry computation (a Pallas kernel's custom call in a `while` body), which have no row here."""
    out: dict[str, tuple] = {}
    if spills is None or spills.empty:
        return out
    entry_op = program.entry_op_of
    for name, stored, filled in zip(spills["hlo"].astype(str), spills["spill_stores"], spills["spill_fills"]):
        owner = entry_op.get(name, name)
        mine = out.get(owner, (pd.NA, pd.NA))
        out[owner] = tuple(old if pd.isna(new) else (0 if pd.isna(old) else int(old)) + int(new)
                           for old, new in zip(mine, (stored, filled)))
    return out


def entry_partners(program: CompiledProgram) -> dict[str, tuple[str, str]]:
    """Entry instruction -> (the other end of its async pair at entry level, pair kind).

    Where one end is inside a control-flow op, that op stands for it. A start whose done is in a
    loop body (a collective started before a scanned loop, awaited in its first iteration) is
    paired with the loop: the modelled transfer must be over when the loop finishes. A done after
    the loop whose start is in the body (issued in the last iteration) is paired with the loop and
    modelled as a wait of no time: the transfer is taken to be hidden by the rest of that
    iteration, as the compiler scheduled it (modelled, not checked against the body's length)."""
    comp = program.entry
    partner: dict[str, tuple[str, str]] = {}
    nested: list = []
    for pair in program.async_pairs:
        if pair.computation == comp and pair.done_in == comp:
            partner[pair.start] = (pair.done, pair.kind)
            partner[pair.done] = (pair.start, pair.kind)
        elif comp in (pair.computation, pair.done_in):
            nested.append(pair)
    if nested:
        owner_of = program.entry_op_of
        for pair in nested:
            if pair.computation == comp:  # the done is inside an entry op
                owner = owner_of.get(pair.done)
                if owner and pair.start not in partner and owner not in partner:
                    partner[pair.start] = (owner, pair.kind)
                    partner[owner] = (pair.start, pair.kind)
            else:  # the start is inside an entry op
                owner = owner_of.get(pair.start)
                if owner and pair.done not in partner:
                    partner[pair.done] = (owner, pair.kind)
    return partner


def op_estimates(program: CompiledProgram, model: CostModel, n_devices: int,
                 group_sizes: dict[str, int] | None = None, spills: pd.DataFrame | None = None,
                 matmul_flops: dict[tuple[str, str], float] | None = None) -> pd.DataFrame:
    """One row per working entry instruction, in schedule order (columns: OP_ESTIMATE_COLUMNS)."""
    group_sizes = group_sizes or {}
    matmul_flops = matmul_flops or {}
    memo: dict[tuple[str, int], float] = {}
    comp = program.entry
    partner = entry_partners(program)
    spill_by = _spills_by_entry_op(program, spills)
    rows: dict[str, list] = {k: [] for k in OP_ESTIMATE_COLUMNS}
    for inst in program.computation_instructions(comp):
        if inst.opcode in FREE_OPCODES:
            continue
        cycles, source = op_cycles(inst)
        compute_ps = (int(cycles / model.clock_hz * PS_PER_S)
                      if cycles is not None and model.clock_hz else None)
        op_logical, op_padded = _operand_bytes(program, comp, inst)
        flops = _op_flops(program, inst, matmul_flops, memo)
        flops_ps = int(flops / model.peak_flops_per_s * PS_PER_S) if model.peak_flops_per_s else 0
        hbm = _hbm_bytes(program, comp, inst)
        hbm_ps = int(hbm / model.hbm_bytes_per_s * PS_PER_S)
        family = inst.collective_family if not inst.is_continuation else ""
        payload, group, ici_ps, window = 0, 0, 0, 0
        other, kind = partner.get(inst.name, ("", ""))
        if family and inst.async_role != "done":
            payload, group = _collective_payload(program, comp, inst, group_sizes, n_devices)
            ici_ps = model.ici.collective_ps(family, payload, group)
        if inst.async_role == "start" and other:
            if ici_ps:
                window = ici_ps
            else:  # a copy or slice: the done's result crosses HBM once
                done = program.instructions.get((comp, other))
                window = int((done.padded_bytes if done is not None else 0) / model.hbm_bytes_per_s * PS_PER_S)
            duration = max(compute_ps or 0, model.min_op_ps)
        elif inst.async_role == "done" and other:
            duration = max(compute_ps or 0, model.min_op_ps)
        else:
            duration = max(compute_ps or 0, flops_ps, hbm_ps, ici_ps, model.min_op_ps)
        stores, fills = spill_by.get(inst.name, (pd.NA, pd.NA))
        for key, value in (("position", inst.position), ("name", inst.name), ("opcode", inst.opcode),
                           ("category", xprof_category(program, inst)), ("family", family),
                           ("async_role", inst.async_role), ("partner", other), ("pair_kind", kind),
                           ("estimated_cycles", cycles), ("cycles_source", source), ("compute_ps", compute_ps),
                           ("flops", flops), ("flops_ps", flops_ps),
                           ("logical_bytes", inst.logical_bytes + op_logical),
                           ("padded_bytes", inst.padded_bytes + op_padded), ("hbm_bytes", hbm),
                           ("hbm_ps", hbm_ps), ("payload_bytes", payload), ("group_size", group),
                           ("ici_ps", ici_ps), ("window_ps", window), ("duration_ps", duration), ("spill_stores", stores),
                           ("spill_fills", fills)):
            rows[key].append(value)
    df = pd.DataFrame(rows)
    for col in ("estimated_cycles", "compute_ps", "spill_stores", "spill_fills"):
        df[col] = pd.array([None if v is None or v is pd.NA else int(v) for v in rows[col]], dtype="Int64")
    df["flops"] = np.asarray(rows["flops"], dtype=np.float64)
    for col in ("position", "flops_ps", "logical_bytes", "padded_bytes", "hbm_bytes", "hbm_ps", "payload_bytes",
                "group_size", "ici_ps", "window_ps", "duration_ps"):
        df[col] = np.asarray(rows[col], dtype=np.int64)
    for col in ("name", "category", "family", "async_role", "partner", "pair_kind", "cycles_source", "opcode"):
        df[col] = df[col].astype("string")
    return df


@dataclass(frozen=True)
class ProgramEstimate:
    """A compiled program's per-op estimates under one cost model: what the static report shows and
    the simulator lays on a timeline, computed once for both (`estimate_program`)."""

    chip: ChipSpec
    model: CostModel
    n_devices: int
    ops: pd.DataFrame  # op_estimates


def estimate_program(output: CompileOutput, clock_ghz: float | None = None, ici_gbps: float | None = None,
                     ici_latency_us: float | None = None) -> ProgramEstimate:
    """The per-op estimates of a compile output, for its target chip, with the CLI's overrides."""
    chip = output.target_chip()
    model = CostModel.for_flags(chip, clock_ghz, ici_gbps, ici_latency_us)
    n_devices = int(output.facts.get("n_devices", 1))
    ops = op_estimates(output.program, model, n_devices, output.group_sizes, output.spills, output.matmul_flops)
    return ProgramEstimate(chip, model, n_devices, ops)
