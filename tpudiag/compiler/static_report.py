"""The static report of a compiled program: per-op estimates, padding, spills, collective schedule.

Built from a `tpudiag compile` output directory; every time in it is modelled from the
compiler's own estimates (see `tpudiag.analysis.cost_model`), never measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from tpudiag.model.compile_output import CompileOutput
from tpudiag.analysis.cost_model import CostModel, ProgramEstimate, estimate_program
from tpudiag.model.compiled import leaf_arrays


class CollectiveMode(StrEnum):
    """How a collective is scheduled; the value is what the static report prints."""

    SYNC = "sync"  # one instruction: nothing runs while it communicates
    ASYNC = "async"  # a start/done pair: work scheduled between them can hide it


@dataclass(frozen=True)
class CollectiveStep:
    """One collective in schedule order: sync, or an async start/done pair and what runs between."""

    name: str  # the sync op, or the start
    done: str  # '' for sync collectives
    family: str
    mode: CollectiveMode
    start_position: int
    done_position: int
    ops_between: int  # working instructions scheduled between start and done (0 = adjacent)
    thread: str  # async_execution_thread, e.g. 'sparsecore' on TPU7x; '' = TensorCore
    payload_bytes: int
    group_size: int
    modelled_ps: int  # ICI model


@dataclass(frozen=True)
class PaddedArray:
    name: str  # parameter or instruction
    shape: str
    logical_bytes: int
    padded_bytes: int

    @property
    def factor(self) -> float:
        return self.padded_bytes / self.logical_bytes if self.logical_bytes else float("nan")


@dataclass(frozen=True)
class StaticReport:
    target: str
    topology: str
    generation: str
    device_kind: str
    n_devices: int
    mesh: dict
    module: str
    compile_s: float | None
    wall_s: float | None
    dump_bytes: int | None
    static_profile: bool
    clock_hz: float | None
    clock_note: str
    model: CostModel
    ops: pd.DataFrame  # op_estimates columns
    collectives: tuple[CollectiveStep, ...]
    padding: tuple[PaddedArray, ...]  # largest padding waste first
    total_cycles: int
    total_compute_ps: int | None
    ops_without_cycles: int
    memory: dict  # compiler memory_analysis figures from result.json
    warnings: tuple[str, ...]


def _padding(output: CompileOutput, top: int, min_waste_bytes: int = 4096) -> tuple[PaddedArray, ...]:
    """Entry instructions whose tiled layout wastes at least `min_waste_bytes`, worst first."""
    program = output.program
    rows: list[PaddedArray] = []
    for inst in program.computation_instructions(program.entry):
        if inst.shape is None or inst.opcode in ("tuple", "get-tuple-element", "bitcast"):
            continue
        arrays = leaf_arrays(inst.shape)
        logical = sum(a.logical_bytes for a in arrays)
        padded = sum(a.padded_bytes for a in arrays)
        if padded - logical >= min_waste_bytes:
            rows.append(PaddedArray(inst.name, inst.shape_text, logical, padded))
    rows.sort(key=lambda r: (-(r.padded_bytes - r.logical_bytes), r.name))
    return tuple(rows[:top])


def _collectives(output: CompileOutput, ops: pd.DataFrame) -> tuple[CollectiveStep, ...]:
    program = output.program
    by_name = ops.set_index("name")
    steps: list[CollectiveStep] = []
    paired_dones = set()
    for pair in program.async_pairs:
        if pair.computation != program.entry or pair.kind != "collective":
            continue
        paired_dones.add(pair.done)
        between = pair.scheduled_between
        row = by_name.loc[pair.start] if pair.start in by_name.index else None
        steps.append(CollectiveStep(
            name=pair.start, done=pair.done, family=pair.family, mode=CollectiveMode.ASYNC,
            start_position=pair.start_position, done_position=pair.done_position, ops_between=len(between),
            thread=pair.thread,
            payload_bytes=int(row["payload_bytes"]) if row is not None else 0,
            group_size=int(row["group_size"]) if row is not None else 0,
            modelled_ps=int(row["window_ps"]) if row is not None else 0))
    for row in ops.itertuples(index=False):
        if row.family and not row.async_role and row.name not in paired_dones:
            steps.append(CollectiveStep(
                name=row.name, done="", family=row.family, mode=CollectiveMode.SYNC, start_position=int(row.position),
                done_position=int(row.position), ops_between=0, thread="", payload_bytes=int(row.payload_bytes),
                group_size=int(row.group_size), modelled_ps=int(row.ici_ps)))
    return tuple(sorted(steps, key=lambda s: s.start_position))


def clock_note(generation: str, clock_hz: float | None, given: bool) -> str:
    if given and clock_hz:
        return f"{clock_hz / 1e9:g} GHz (given with --clock-ghz)"
    if clock_hz:
        return f"{clock_hz / 1e9:g} GHz (implied by public {generation} peaks)"
    return (f"unknown: the {generation} clock is not public, so only cycles are shown "
            "(pass --clock-ghz to convert)")


def build_static_report(output: CompileOutput, clock_ghz: float | None = None, top_padding: int = 8,
                        ici_gbps: float | None = None, ici_latency_us: float | None = None,
                        estimate: ProgramEstimate | None = None) -> StaticReport:
    """`estimate`: the program's estimates when the caller has them already, else made here."""
    facts = output.facts
    generation = facts.get("generation", "")
    if estimate is None:
        estimate = estimate_program(output, clock_ghz, ici_gbps, ici_latency_us)
    chip, model, n, ops = estimate.chip, estimate.model, estimate.n_devices, estimate.ops
    cycles = ops["estimated_cycles"]
    total_cycles = int(cycles.fillna(0).sum())
    compute = ops["compute_ps"]
    total_compute = int(compute.fillna(0).sum()) if model.clock_hz else None
    memory = {k: facts[k] for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                                    "peak_memory_in_bytes", "generated_code_size_in_bytes") if k in facts}
    return StaticReport(
        target=facts.get("target", ""), topology=facts.get("topology", ""), generation=generation,
        device_kind=facts.get("device_kind", ""), n_devices=n, mesh=dict(facts.get("mesh", {})),
        module=output.program.module, compile_s=facts.get("compile_s"), wall_s=facts.get("wall_s"),
        dump_bytes=facts.get("dump_bytes"), static_profile=bool(facts.get("static_profile")),
        clock_hz=model.clock_hz, clock_note=clock_note(generation, model.clock_hz, model.clock_given),
        model=model, ops=ops, collectives=_collectives(output, ops), padding=_padding(output, top_padding),
        total_cycles=total_cycles, total_compute_ps=total_compute,
        ops_without_cycles=int(cycles.isna().sum()), memory=memory, warnings=tuple(output.warnings))
