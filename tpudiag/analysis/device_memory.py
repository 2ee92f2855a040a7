"""The device memory of compiled programs (`tpudiag.model.memory`) from their buffer assignment.

Per memory space: the allocations of the buffer assignment split into arguments, outputs,
temporaries and constants (their sum is the compiler's reserved peak, see the model's
docstring); the temporaries live at the moment they peak, from the live-range dump; and, for
HBM, the levers that would lower the peak, each with a modelled saving in bytes.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from tpudiag.model.compile_output import HLO_TEXT_FILE, CompileOutput
from tpudiag.model.compiled import (MEMORY_SPACE_NAMES, BufferAllocation, BufferValue, CompiledProgram,
                                    memory_space_name)
from tpudiag.model.hardware import COMPILER_USABLE_HBM_BYTES, DEFAULT_SCOPED_VMEM_BYTES, ChipSpec
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.llo import LloDump, scoped_vmem_per_op
from tpudiag.model.memory import (INFERENCE, TRAINING, MemoryBuffer, MemoryGroup, MemoryLever, MemoryReport,
                                  OomAnalysis, OomError, ProgramMemory, SpaceMemory, VmemUse)
from tpudiag.model.hlo_shapes import padded_dims
from tpudiag.parsers.layout import ShapeSyntaxError, parse_shape
from tpudiag.parsers.oom_error import OomSizeError, parse_oom_error

# The order in which levers are tried first: cost to the user, cheapest first (a layout or a
# padding change is local, donation is free, remat costs FLOPs, a microbatch costs steps,
# dtypes cost numerics, offload PCIe, FSDP collectives).
EFFORT = ("padding", "temporaries", "donation", "remat", "microbatch", "dtype", "host-offload", "fsdp")
# Levers are offered from this fraction of the usable HBM on (the `hbm-pressure` rule's default).
NEAR_FRACTION = 0.8
# Programs whose HBM peak is under this fold into one line of `tpudiag memory` (jit'd conversions, scalars).
SMALL_PROGRAM_BYTES = 1 << 20
# An --error text joins a program whose HBM peak is within this of the size the text prints
# (two decimals of G: 5 MiB; the rest is what the compiler adds beyond the buffer assignment).
SIZE_MATCH_FRACTION = 0.02
# Only an allocation padded by at least this much (its size over its unpadded size) gets a padding lever.
MIN_EXPANSION = 1.25
_BACKWARD = re.compile(r"transpose\(jvp")
_OPTIMISER_NAMES = re.compile(r"(?i)^(opt|opt_state|optimi[sz]er|adam|mu|nu|m|v|momentum|velocity|moments?|"
                              r"exp_avg(_sq)?|state)$")
# Temporaries below this size are left out of the live set (tuple index tables, scalars).
MIN_LIVE_BYTES = 4096
_INDEX = re.compile(r"\{[\d,]*\}$")


def program_memories(compiled: CompiledInputs, errors: Iterable[OomError] = (),
                     outputs: Mapping[Path, CompileOutput] = MappingProxyType({}),
                     near_fraction: float = NEAR_FRACTION) -> tuple[ProgramMemory, ...]:
    """The memory of every program with a buffer assignment, largest HBM peak first; each error
    is joined to the program it names, else to the one whose HBM peak matches its size, else to
    none (`joined_program`), and never when `compiled.oom_errors_joinable` is off (the bundled
    example is nobody's program). `outputs`: `tpudiag compile` output directories already read
    (`parsers.compile_output`), by directory, so that their `result.json` and `compiled.hlo.txt` are not
    read again."""
    errors = tuple(errors) if compiled.oom_errors_joinable else ()
    # A capture with `--dumps` of its compile holds each program twice: the dump's (with live
    # ranges) is kept, the capture's own copy of the same module left out.
    dumped = {h.program.module for h in compiled.hlo}
    inputs = [h for h in (*compiled.hlo, *(e for e in compiled.embedded if e.program.module not in dumped))
              if h.program.allocations]
    programs = [h.program for h in inputs]
    joined = {id(e): joined_program(e, programs) for e in errors}
    out = [program_memory(h, compiled.chip, tuple(e for e in errors if joined[id(e)] is h.program),
                          llo=compiled.llo, outputs=outputs, near_fraction=near_fraction) for h in inputs]
    out.sort(key=lambda p: (-(p.hbm_peak_bytes or 0), p.module))
    return tuple(out)


def joined_program(error: OomError, programs: list[CompiledProgram]) -> CompiledProgram | None:
    """The program an OOM text is about: the one it names (`OomError.programs`, or for VMEM the
    program holding the op it names), else the one
    whose HBM total is within SIZE_MATCH_FRACTION of the text's required size (not for the
    runtime forms, whose sizes are one buffer's or the free memory's); None when none matches."""
    named = [p for p in programs if p.module in error.programs
             or (error.space == "vmem" and error.hlo and p.find(error.hlo) is not None)]
    if named:
        return max(named, key=_hbm_total)
    if error.programs or error.space != "hbm" or error.kind == "hbm-allocation":
        return None
    close = [p for p in programs if abs(_hbm_total(p) - error.required_bytes) <= SIZE_MATCH_FRACTION * error.required_bytes]
    return min(close, key=lambda p: abs(_hbm_total(p) - error.required_bytes), default=None)


def _hbm_total(program: CompiledProgram) -> int:
    return sum(a.size_bytes for a in program.allocations if a.color == 0)


def join_warnings(errors: Iterable[OomError], programs: tuple[ProgramMemory, ...], joinable: bool = True) -> list[str]:
    """One warning per `--error` text joined to no program of the input: why."""
    out = []
    joined = [p.error for p in programs if p.error is not None]
    for e in errors:
        if any(e is j for j in joined):
            continue
        if not joinable:
            out.append("--error: analysed on its own: the bundled example is not the program that ran out of memory")
        elif not programs:
            continue
        elif e.space == "vmem" and e.hlo:
            out.append(f"--error: the text names op `{e.hlo}`, which no program of the input has: not joined")
        elif e.programs:
            out.append(f"--error: the text names {', '.join(f'`{n}`' for n in e.programs)}, which is not a program of "
                       "the input: not joined")
        else:
            out.append(f"--error: its size ({_fmt(e.required_bytes)}) matches no program of the input (the largest "
                       f"peaks at {_fmt(programs[0].hbm_peak_bytes)}): not joined")
    return out


def _fmt(n: int | None) -> str:
    from tpudiag.model.units import fmt_bytes

    return fmt_bytes(n)


def memory_report(input_path: str, compiled: CompiledInputs, errors: Iterable[OomError] = (),
                  programs: tuple[ProgramMemory, ...] | None = None) -> MemoryReport:
    """`tpudiag memory`'s report: `programs` (from `program_memories`, computed when None), the
    errors joined to none analysed alone, tiny programs folded, and notes."""
    errors = tuple(errors)
    programs = program_memories(compiled, errors) if programs is None else programs
    # a dumped program without a buffer assignment may have had one its parser ignored: say why
    notes = [w for h in compiled.hlo if not h.program.allocations for w in h.program.warnings]
    notes += join_warnings(errors, programs, compiled.oom_errors_joinable)
    if not programs and not errors:
        notes.append("no compiled program with a buffer assignment: dump with XLA_FLAGS=--xla_dump_to=DIR "
                     "(or `tpudiag compile`) to see device memory")
    return error_report(input_path, errors, programs, tuple(notes))


def error_report(input_path: str, errors: tuple[OomError, ...], programs: tuple[ProgramMemory, ...] = (),
                 warnings: tuple[str, ...] = ()) -> MemoryReport:
    """A memory report of `programs` (largest first) and `errors`; those joined to no program are
    analysed alone (`oom_analysis`). `tpudiag memory --error FILE` with no PATH is this with no program."""
    joined = [p.error for p in programs if p.error is not None]
    standalone = tuple(oom_analysis(e) for e in errors if not any(e is j for j in joined))
    programs = tuple(sorted(programs, key=lambda p: (-(p.hbm_peak_bytes or 0), p.module)))
    small = tuple(i for i, p in enumerate(programs) if (p.hbm_peak_bytes or 0) < SMALL_PROGRAM_BYTES
                  and not p.does_not_fit)
    if len(small) == len(programs):  # nothing large: show them all rather than fold everything
        small = ()
    return MemoryReport(input_path=input_path, programs=programs, errors=errors, warnings=warnings,
                        standalone=standalone, folded=small)


def program_memory(hlo: HloInput, chip: ChipSpec | None, errors: Iterable[OomError] = (),
                   llo: Iterable[LloDump] = (), outputs: Mapping[Path, CompileOutput] = MappingProxyType({}),
                   near_fraction: float = NEAR_FRACTION) -> ProgramMemory:
    """One program's memory: its spaces, the chip's HBM, whether it trains, the scoped VMEM per op
    (from the LLO dumps of the same module when given); `errors` joined to it. Levers only when
    the program does not fit or peaks at `near_fraction` of the usable HBM or more."""
    from tpudiag.model.hardware import chip_for

    program = hlo.program
    chip = chip_for(hlo.generation) or chip
    output = outputs.get(Path(hlo.origin).parent)
    facts = _compile_facts(hlo, output)
    errors = tuple(errors) or _compile_errors(facts)
    hbm_error = next((e for e in errors if e.space == "hbm"), None)
    error = hbm_error or next(iter(errors), None)
    capacity = chip.hbm_capacity_bytes if chip else None
    if hbm_error is not None and hbm_error.kind != "hbm-allocation":
        usable, usable_source = hbm_error.available_bytes, "compiler error"
    elif chip is not None and chip.generation in COMPILER_USABLE_HBM_BYTES:
        usable, usable_source = COMPILER_USABLE_HBM_BYTES[chip.generation], f"the {chip.generation} compiler's figure"
    else:
        usable, usable_source = capacity, "public capacity" if capacity else ""
    by_color: dict[int, list[BufferAllocation]] = defaultdict(list)
    for alloc in program.allocations:
        by_color[alloc.color].append(alloc)
    reported = {s.color: s.total_bytes for s in program.memory_spaces}
    spaces = tuple(_space(program, color, allocs, reported.get(color)) for color, allocs in sorted(by_color.items()))
    hbm = next((s for s in spaces if s.color == 0), None)
    workload, evidence = program_workload(program, hbm)
    result = ProgramMemory(
        module=program.module, path=program.path, generation=chip.generation if chip else "",
        hbm_capacity_bytes=capacity, hbm_usable_bytes=usable, usable_source=usable_source, spaces=spaces,
        oom_recorded=program.oom_recorded, error=error, compiler_peak_bytes=_compiler_peak(facts),
        workload=workload, workload_evidence=evidence, near_fraction=near_fraction,
        capacity_source=f"public {chip.generation} figure" if capacity else "",
        mesh_devices=max(1, program.num_partitions) * max(1, program.replica_count))
    result = replace(result, **_vmem(hlo, chip, errors, tuple(llo), facts, output))
    warnings = list(program.warnings)  # the program's own, a side file it ignored among them
    if program.allocations and not program.live_ranges:
        warnings.append(f"`{program.module}`: no live-range dump: the temporaries at the peak are not split by time")
    result = replace(result, warnings=tuple(warnings))
    return with_levers(result, program)


def with_levers(p: ProgramMemory, program: CompiledProgram | None) -> ProgramMemory:
    """`p` with its levers when it needs them (`ProgramMemory.needs_levers`), and the cheapest that
    is enough alone: one that frees the overrun, or brings a fitting peak under the near fraction."""
    hbm = p.hbm
    if hbm is None or not p.needs_levers:
        return replace(p, levers=(), first="")
    levers = _levers(program, hbm, p) if program is not None else []
    if p.error is not None and p.error.space == "hbm":
        levers += [lv for lv in error_levers(p.error) if lv.key == "padding"]
    levers.sort(key=lambda lv: (-lv.saving_bytes, lv.key))
    peak, limit = p.hbm_peak_bytes, p.hbm_limit_bytes
    if peak is None or limit is None:
        need = None
    elif peak > limit or p.does_not_fit:
        need = max(peak - limit, 0) + 1
    else:
        need = peak - int(p.near_fraction * limit) + 1
    first = first_lever(tuple(levers), need) if need is not None else None
    return replace(p, levers=tuple(levers), first=first.key if first is not None else "")


def first_lever(levers: tuple[MemoryLever, ...], need_bytes: int) -> MemoryLever | None:
    """The cheapest lever (`EFFORT`) that frees `need_bytes` on its own; None when none does."""
    enough = [lv for lv in levers if lv.saving_bytes >= need_bytes]
    return min(enough, key=lambda lv: EFFORT.index(lv.key), default=None)


def program_workload(program: CompiledProgram, hbm: SpaceMemory | None) -> tuple[str, str]:
    """TRAINING or INFERENCE, and what told it: a backward pass (ops named `transpose(jvp(...))`,
    JAX's gradients) makes a training step; optimiser state and donated state are named when found."""
    backward = sum(1 for inst in program.instructions.values() if _BACKWARD.search(inst.op_name))
    args = [b for b in hbm.live_at_peak if b.kind == "argument"] if hbm is not None else []
    donated = sum(1 for a in args if a.aliased)
    if backward:
        parts = [f"a backward pass ({backward} ops named `transpose(jvp(...))`)"]
        optimiser = _optimiser_state(args, [b for b in hbm.live_at_peak if b.kind == "output"] if hbm else [])
        if optimiser:
            parts.append(f"optimiser state ({', '.join(sorted({_argument_root(a.op_name, a.instruction) for a in optimiser}))})")
        if donated:
            parts.append(f"{donated} donated arguments")
        return TRAINING, "; ".join(parts)
    why = "no backward pass (no op named `transpose(jvp(...))`)"
    if donated:
        why += f"; {donated} donated arguments (state updated in place, as a cache is)"
    return INFERENCE, why


def _state(args: list[MemoryBuffer], outputs: list[MemoryBuffer]) -> list[MemoryBuffer]:
    """Arguments the program returns updated: donated, or with an output of the same shape."""
    shapes = {o.shape for o in outputs}
    return [a for a in args if a.aliased or a.shape in shapes]


def _optimiser_state(args: list[MemoryBuffer], outputs: list[MemoryBuffer]) -> list[MemoryBuffer]:
    """The state arguments that hold optimiser state, not parameters: those under an argument root
    named like optimiser state (`opt_state`, `mu`, `nu`, `m`, `v`, ...), and those under a later
    root whose dims repeat the first root's (Adam's m and v beside the params)."""
    state = _state(args, outputs)
    if not state:
        return []
    roots = {a: _argument_root(a.op_name, a.instruction) for a in state}
    first_root = min(state, key=lambda a: a.parameter_number if a.parameter_number is not None else 0)
    first = roots[first_root]
    param_dims = {_dims(a.shape) for a in state if roots[a] == first}
    return [a for a in state if roots[a] != first and (_OPTIMISER_NAMES.match(roots[a].strip("'\"[]"))
                                                        or _dims(a.shape) in param_dims)]


def _dims(shape: str) -> str:
    return shape.split("{", 1)[0].split("[", 1)[-1]


def _vmem(hlo: HloInput, chip: ChipSpec | None, errors: tuple[OomError, ...], llo: tuple[LloDump, ...],
          facts: dict, output: CompileOutput | None) -> dict:
    """The VMEM fields of ProgramMemory: scoped VMEM per op, the scoped limit and the chip's VMEM."""
    program = hlo.program
    dumps = [d for d in llo if d.vmem_report is not None and d.vmem_report.module_name in ("", program.module)]
    ops = vmem_from_llo(program, dumps) if dumps else _vmem_from_hlo(program)
    if not ops and facts:  # a `tpudiag compile` output: its `compiled.hlo.txt` carries the backend configs
        ops = _vmem_from_hlo(_compiled_text(hlo, output))
    vmem_error = next((e for e in errors if e.space == "vmem"), None)
    if vmem_error is not None and vmem_error.kind == "scoped":
        limit, source = vmem_error.available_bytes, "compiler error"
    elif chip is not None and chip.generation in DEFAULT_SCOPED_VMEM_BYTES:
        limit, source = DEFAULT_SCOPED_VMEM_BYTES[chip.generation], f"default for {chip.generation}, measured"
    else:
        limit, source = None, ""
    capacity = next((d.vmem_report.capacity_bytes for d in dumps if d.vmem_report.capacity_bytes), None)
    if capacity is None and chip is not None:
        capacity = chip.vmem_bytes
    return {"vmem_ops": tuple(sorted(ops, key=lambda v: (-v.scoped_bytes, v.op))),
            "vmem_scoped_limit_bytes": limit, "vmem_limit_source": source, "vmem_capacity_bytes": capacity}


def vmem_from_llo(program: CompiledProgram | None, dumps: list[LloDump]) -> list[VmemUse]:
    """Per HLO op, its largest SCOPED block in the LLO VMEM report (`model.llo.ScopedVmem.largest_bytes`:
    what the scoped limit is checked against; the LLO ops table sums them)."""
    out: dict[str, int] = {}
    for dump in dumps:
        for op, scoped in scoped_vmem_per_op(dump.vmem_allocations).items():
            out[op] = max(out.get(op, 0), scoped.largest_bytes)
    return [_vmem_use(program, op, size, "LLO VMEM report") for op, size in out.items() if size > 0]


def _vmem_from_hlo(program: CompiledProgram | None) -> list[VmemUse]:
    """Per instruction, the VMEM (memory space 1) of its `used_scoped_memory_configs`."""
    if program is None:
        return []
    out = []
    for inst in program.instructions.values():
        size = used_scoped_vmem_bytes(inst.backend_config)
        if size:
            out.append(_vmem_use(program, inst.name, size, "HLO backend_config"))
    return out


def used_scoped_vmem_bytes(backend_config: str) -> int | None:
    """The VMEM (memory space 1) of a compiled op's `used_scoped_memory_configs`; None when its
    backend_config states none (or is not the JSON expected)."""
    if "used_scoped_memory_configs" not in backend_config:
        return None
    try:
        configs = json.loads(backend_config).get("used_scoped_memory_configs") or []
        if not configs:  # `[]` before the backend ran (an XLA dump's after-optimizations HLO): not stated
            return None
        return sum(int(c.get("size", 0)) for c in configs if str(c.get("memory_space")) == "1")
    except (ValueError, AttributeError, TypeError):
        return None


def _vmem_use(program: CompiledProgram | None, op: str, size: int, source: str) -> VmemUse:
    inst = program.find(op) if program is not None else None
    return VmemUse(op=op, scoped_bytes=size, source=source, op_name=inst.op_name if inst else "",
                   kernel=inst is not None and inst.custom_call_target == "tpu_custom_call")


def _compiled_text(hlo: HloInput, output: CompileOutput | None) -> CompiledProgram | None:
    """The `compiled.hlo.txt` of a `tpudiag compile` output, beside its XLA dump (`output`'s program
    when that output was read already); None when absent."""
    from tpudiag.parsers.compile_output import compiled_text_beside

    if output is not None:
        return output.program if Path(output.program.path) == Path(hlo.origin).parent / HLO_TEXT_FILE else None
    return compiled_text_beside(Path(hlo.origin))


def _compile_facts(hlo: HloInput, output: CompileOutput | None) -> dict:
    """The `result.json` of the `tpudiag compile` output this program's dump is in (`output`'s when
    that was read already), when it is this program's; {} otherwise (an XLA dump of its own, or damaged)."""
    from tpudiag.parsers.compile_output import result_beside

    facts = output.facts if output is not None else result_beside(Path(hlo.origin))
    return facts if isinstance(facts, dict) and facts.get("module") == hlo.program.module else {}


def _compile_errors(facts: dict) -> tuple[OomError, ...]:
    """The out-of-memory error a failed `tpudiag compile` recorded, as if given with `--error`."""
    if facts.get("status") != "compile_error":
        return ()
    try:
        error = parse_oom_error(str(facts.get("detail") or facts.get("message") or ""))
    except OomSizeError:
        return ()  # a recorded message with an impossible size: no error to join
    return (error,) if error is not None else ()


def _compiler_peak(facts: dict) -> int | None:
    """`memory_analysis().peak_memory_in_bytes` of a successful `tpudiag compile`."""
    peak = facts.get("peak_memory_in_bytes")
    return int(peak) if isinstance(peak, int) and peak >= 0 else None


def _kind(alloc: BufferAllocation) -> str:
    if alloc.parameter_number is not None:
        return "argument"
    if alloc.is_constant:
        return "constant"
    if alloc.is_output or alloc.maybe_live_out:
        return "output"
    return "temporary"


def _value_key(value: BufferValue) -> str:
    """The live-range file's name of a value: `fusion.32{1}`, or `x.1{}` for a non-tuple."""
    return value.name if _INDEX.search(value.name) else value.name + "{}"


def _space(program: CompiledProgram, color: int, allocs: list[BufferAllocation],
           reported: int | None) -> SpaceMemory:
    totals = defaultdict(int)
    alias = 0
    for alloc in allocs:
        totals[_kind(alloc)] += alloc.size_bytes
        if alloc.parameter_number is not None and (alloc.is_output or alloc.maybe_live_out):
            alias += alloc.size_bytes
    whole = [a for a in allocs if _kind(a) != "temporary"]
    temps = [(a, v) for a in allocs if _kind(a) == "temporary" for v in a.values]
    ranges, positions = program.live_ranges, program.live_range_positions
    timeline: list[int] = []
    peak_at = None
    if ranges and temps:
        # A difference array: each value adds its size where it starts and takes it back after it
        # ends, so the cost is one pass over the values and one over the positions.
        delta = [0] * (positions + 2)
        for _, value in temps:
            span = ranges.get(_value_key(value))
            if span is not None and 0 <= span[0] <= positions:
                delta[span[0]] += value.size_bytes
                delta[min(span[1], positions) + 1] -= value.size_bytes
        timeline = list(itertools.accumulate(delta[:-1]))
        peak_at = max(range(len(timeline)), key=timeline.__getitem__)
    live: list[MemoryBuffer] = []
    for alloc in whole:
        value = _held_value(alloc, ranges)
        if value is not None and alloc.size_bytes >= MIN_LIVE_BYTES:
            live.append(_buffer(program, value, _kind(alloc), alloc, ranges))
    for alloc, value in temps:
        span = ranges.get(_value_key(value)) if ranges else None
        at_peak = peak_at is None or (span is not None and span[0] <= peak_at <= span[1])
        if at_peak and value.size_bytes >= MIN_LIVE_BYTES:
            live.append(_buffer(program, value, "temporary", alloc, ranges))
    live.sort(key=lambda b: (-b.size_bytes, b.name))
    return SpaceMemory(
        space=memory_space_name(color) if color in MEMORY_SPACE_NAMES else f"color {color}", color=color,
        peak_bytes=sum(a.size_bytes for a in allocs), argument_bytes=totals["argument"],
        output_bytes=totals["output"], temp_bytes=totals["temporary"], constant_bytes=totals["constant"],
        alias_bytes=alias, reported_total_bytes=reported, live_at_peak=tuple(live), peak_position=peak_at,
        timeline_bytes=tuple(timeline), groups=_groups(live))


def _groups(live: list[MemoryBuffer]) -> tuple[MemoryGroup, ...]:
    """The buffers at the peak by jit argument (arguments) or by JAX op (the others): what a user
    changes is an argument or a line of code, not one of a hundred same-sized buffers."""
    groups: dict[tuple[str, str], list[MemoryBuffer]] = defaultdict(list)
    for b in live:
        label = _argument_root(b.op_name, b.instruction) if b.kind == "argument" else (b.op_name or b.instruction)
        groups[(b.kind, label)].append(b)
    out = [MemoryGroup(label=label, kind=kind, count=len(bs), size_bytes=sum(b.size_bytes for b in bs),
                       source=next((f"{b.source_file}:{b.source_line}" for b in bs if b.source_line), ""))
           for (kind, label), bs in groups.items()]
    out.sort(key=lambda g: (-g.size_bytes, g.kind, g.label))
    return tuple(out)


def _held_value(alloc: BufferAllocation, ranges: dict[str, tuple[int, int]]) -> BufferValue | None:
    """The value a whole-program allocation is for: an argument's parameter (listed first, before
    the output a donated buffer also holds); else the last to be live (an output buffer also holds
    temporaries written before the output is), the last listed without live ranges."""
    if not alloc.values:
        return None
    if alloc.parameter_number is not None:
        return alloc.values[0]
    return max(enumerate(alloc.values), key=lambda iv: (ranges.get(_value_key(iv[1]), (0, -1))[1], iv[0]))[1]


def _buffer(program: CompiledProgram, value: BufferValue, kind: str, alloc: BufferAllocation,
            ranges: dict[str, tuple[int, int]]) -> MemoryBuffer:
    instruction = _INDEX.sub("", value.name)
    inst = program.find(instruction)
    try:
        logical = parse_shape(value.shape_text).logical_bytes
    except ShapeSyntaxError:
        logical = None
    span = ranges.get(_value_key(value))
    return MemoryBuffer(
        name=value.name, instruction=instruction, kind=kind, size_bytes=value.size_bytes, logical_bytes=logical,
        shape=value.shape_text, op_name=inst.op_name if inst else "", source_file=inst.source_file if inst else "",
        source_line=inst.source_line if inst else 0, parameter_number=alloc.parameter_number,
        aliased=alloc.parameter_number is not None and (alloc.is_output or alloc.maybe_live_out),
        live_from=span[0] if span else None, live_to=span[1] if span else None)




def _argument_root(op_name: str, fallback: str) -> str:
    """The jit argument an entry parameter comes from: `params[0]` -> `params`, `opt.mu[2]` -> `opt`."""
    text = op_name or fallback
    return re.split(r"[\[.]", text, maxsplit=1)[0] or text


def _dtype(shape: str) -> str:
    return shape.split("[", 1)[0]


def _levers(program: CompiledProgram, hbm: SpaceMemory, p: ProgramMemory) -> list[MemoryLever]:
    """The levers whose precondition holds in the program, each saying what it checked."""
    live = hbm.live_at_peak
    args = [b for b in live if b.kind == "argument"]
    outputs = [b for b in live if b.kind == "output"]
    temps = [b for b in live if b.kind == "temporary"]
    training = p.workload == TRAINING
    levers: list[MemoryLever] = []

    # Donation: an output of the same shape and layout as an argument not yet donated can reuse it.
    free = defaultdict(list)
    for arg in args:
        if not arg.aliased:
            free[arg.shape].append(arg)
    donated, pairs = set(), []
    for out in outputs:
        if free[out.shape]:
            arg = free[out.shape].pop(0)
            pairs.append((out, arg))
            donated.add(_argument_root(arg.op_name, arg.instruction))
    if pairs:
        gross = sum(o.size_bytes for o, _ in pairs)
        back = _grows_back(program, hbm, {o.name for o, _ in pairs})
        roots = sorted(donated)
        numbers = _argnums(program, roots)
        fix = (f"jax.jit(step, donate_argnums={numbers})" if numbers
               else f"donate the arguments {', '.join(roots)} (`donate_argnums`)")
        how = "the outputs that could reuse a same-shaped argument's buffer"
        if back:
            how += (f", less {_fmt(back)} the temporaries' heap is modelled to grow: temporaries that borrow those "
                    "outputs' buffers before the outputs are written need room of their own, and values the "
                    "compiler rematerialised to fit (`.remat`) are kept instead")
        levers.append(MemoryLever(
            "donation", f"donate {', '.join(roots)}: {len(pairs)} output{'s' * (len(pairs) != 1)} "
            f"{'have' if len(pairs) != 1 else 'has'} an argument's shape and could reuse it",
            max(gross - back, 0), how, fix, tuple(o.name for o, _ in pairs),
            precondition=f"{len(pairs)} output{'s' * (len(pairs) != 1)} with an argument's shape, that argument "
                         "not donated"))

    # Rematerialisation: forward-pass activations (`jvp(` in the name stack, not the transpose)
    # live at the peak because the backward pass needs them; only where a backward pass exists.
    kept = [t for t in temps if "jvp(" in t.op_name and "transpose(" not in t.op_name]
    if kept and training:
        levers.append(MemoryLever(
            "remat", f"rematerialise {len(kept)} forward activations kept for the backward pass",
            sum(t.size_bytes for t in kept), "forward activations live at the peak; recomputing them costs "
            "their FLOPs again in the backward pass",
            "wrap the layer in jax.checkpoint (e.g. policy=jax.checkpoint_policies.dots_saveable, "
            "or nothing_saveable for the most memory)", tuple(t.name for t in kept),
            precondition=f"a backward pass, and {len(kept)} forward activations live at the peak"))

    state = _state(args, outputs)
    optimiser = _optimiser_state(args, outputs) if training else []
    # FSDP: parameters (rank 2 and up) sharded over fewer devices than the mesh has.
    fsdp = _under_sharded(program, state, p.mesh_devices) if training else []
    if fsdp:
        saving = sum(size * (1 - shards / p.mesh_devices) for _, size, shards in fsdp)
        now = sorted({shards for *_, shards in fsdp})
        levers.append(MemoryLever(
            "fsdp", f"shard {len(fsdp)} parameter and state arrays over all {p.mesh_devices} devices of the mesh (FSDP)",
            int(saving), f"each array's bytes times (1 - its shards / {p.mesh_devices}), from its sharding in the "
            "program; gathering them per layer adds collectives",
            "shard params and optimiser state along the data axis too (NamedSharding(mesh, P('data', ...)))",
            tuple(b.name for b, *_ in fsdp),
            precondition=f"{len(fsdp)} arrays of rank 2 or more are sharded {'/'.join(map(str, now))} ways on a "
                         f"{p.mesh_devices}-device mesh"))

    # Optimiser state: in host memory between uses, or stored in bf16.
    f32_state = [a for a in optimiser if _dtype(a.shape) == "f32"]
    if f32_state:
        names = ", ".join(sorted({_argument_root(a.op_name, a.instruction) for a in f32_state}))
        moved = sum(a.size_bytes for a in f32_state) + sum(o.size_bytes for o, a in pairs if a in f32_state)
        levers.append(MemoryLever(
            "host-offload", f"keep the f32 optimiser state ({names}) in host memory ({len(f32_state)} arrays)",
            moved, "the f32 optimiser state (and its new values) moved to pinned host memory; the update then "
            "streams over PCIe each step",
            "place the optimiser state with memory_kind='pinned_host' (jax.device_put / out_shardings)",
            tuple(a.name for a in f32_state), precondition=f"f32 optimiser state recognised: {names}"))
        levers.append(MemoryLever(
            "dtype", f"store the f32 optimiser state ({names}) in bf16", moved // 2,
            "half of the f32 optimiser state and its new values; bf16 moments need care (stochastic rounding)",
            "keep optimiser moments in bf16 (e.g. optax.adam(mu_dtype=jnp.bfloat16))",
            tuple(a.name for a in f32_state), precondition=f"f32 optimiser state recognised: {names}"))

    # A smaller microbatch: in a training step the temporaries and the arguments that are not
    # state (the batch) scale with the batch size.
    batch_args = [a for a in args if a not in state]
    scaled = sum(t.size_bytes for t in temps) + sum(a.size_bytes for a in batch_args)
    if scaled and training:
        levers.append(MemoryLever(
            "microbatch", "halve the microbatch (accumulate gradients over 2)", scaled // 2,
            "half of the temporaries live at the peak and of the batch arguments, which scale with the batch",
            "split the batch into microbatches and accumulate gradients (jax.lax.scan over microbatches)",
            tuple(b.name for b in (*temps, *batch_args)), precondition="a training step (it has a backward pass)"))
    return [lv for lv in levers if lv.saving_bytes > 0]


def _grows_back(program: CompiledProgram, hbm: SpaceMemory, outputs: set[str]) -> int:
    """Bytes of temporaries that donating `outputs` (value names) is modelled to add back.

    Two effects, both from the buffer assignment and the live ranges:
    - before it is written, an output's buffer lends its space to temporaries (further values of
      the output's allocation). Donated, the output lives in its argument's buffer and its own
      allocation is gone: those temporaries need room in the temporaries' heap;
    - the compiler rematerialised values to fit (`X.remat` recomputes `X`); with memory freed it
      keeps `X` until the last use of `X.remat` instead.
    The growth is the heap's new peak (its temporaries, the borrowed ones and the kept ones,
    position by position) less its peak now; without live ranges, every borrowed value counts.
    Measured on the 10-layer Adam step on v5e (jax 0.10.2): donation freed 6.25 GiB of outputs;
    7 forward activations borrowed from the output buffers at once and 3 rematerialised ones
    were kept, the heap grew from 0.5 to 2.75 GiB, and the peak fell by 4.0 GiB."""
    borrowed: dict[str, BufferValue] = {}
    for alloc in program.allocations:
        if alloc.color != 0 or _kind(alloc) != "output" or not any(v.name in outputs for v in alloc.values):
            continue
        borrowed.update({v.name: v for v in alloc.values if v.name not in outputs and v.size_bytes >= MIN_LIVE_BYTES})
    ranges, timeline = program.live_ranges, hbm.timeline_bytes
    if not ranges or not timeline:
        return sum(v.size_bytes for v in borrowed.values())
    last = len(timeline) - 1
    spans: dict[str, tuple[int, int, int]] = {}  # value -> (start, end, bytes) added to the heap
    for name, v in borrowed.items():
        span = ranges.get(_value_key(v))
        if span is not None:
            spans[name] = (span[0], span[1], v.size_bytes)
    removed = [0] * (len(timeline) + 1)  # rematerialised copies no longer made
    temps = {v.name: v for a in program.allocations if a.color == 0 and _kind(a) == "temporary" for v in a.values}
    for name, v in (*temps.items(), *borrowed.items()):
        if ".remat" not in name:
            continue
        original = re.sub(r"\.remat\d*(?=\{|$)", "", name)
        copy, kept = ranges.get(_value_key(v)), ranges.get(_value_key(replace(v, name=original)))
        if copy is None or kept is None:
            continue
        spans.pop(name, None)
        if name in temps:
            removed[copy[0]] += v.size_bytes
            removed[min(copy[1], last) + 1] -= v.size_bytes
        start, end, size = spans.get(original, (kept[1] + 1, kept[1], v.size_bytes))
        spans[original] = (start, max(end, copy[1]), size)
    delta = [-r for r in removed]
    for start, end, size in spans.values():
        if 0 <= start <= last and end >= start:
            delta[start] += size
            delta[min(end, last) + 1] -= size
    extra = list(itertools.accumulate(delta[:-1]))
    return max(0, max(t + e for t, e in zip(timeline, extra)) - max(timeline))


_TILES = re.compile(r"devices=\[(?P<tiles>[\d,]+)\]")


def _shards(sharding: str) -> int | None:
    """How many ways an array is split by an HLO `sharding={...}` attribute: 1 when replicated or
    on one device; the tile counts' product, less the replicated last dim; None when unreadable."""
    text = sharding.strip()
    if not text:
        return None
    if "replicated" in text.split("devices", 1)[0] or "maximal" in text:
        return 1
    m = _TILES.search(text)
    if m is None:
        return None
    tiles = [int(t) for t in m["tiles"].split(",") if t.isdigit() and len(t) < 7]
    if "last_tile_dim_replicate" in text and tiles:
        tiles = tiles[:-1]
    count = 1
    for t in tiles:
        count *= t
    return count


def _under_sharded(program: CompiledProgram, state: list[MemoryBuffer], mesh: int) -> list[tuple[MemoryBuffer, int, int]]:
    """(array, bytes, shards) for state arrays of rank 2 or more split fewer ways than the mesh has
    devices; [] when the mesh is one device or the program carries no sharding."""
    if mesh <= 1:
        return []
    out = []
    for a in state:
        inst = program.find(a.instruction)
        sharding = dict(inst.attributes).get("sharding", "") if inst is not None else ""
        shards = _shards(sharding)
        if shards is None or shards >= mesh or len(_dims(a.shape).split(",")) < 2:
            continue
        out.append((a, a.size_bytes, shards))
    return out


def error_levers(error: OomError) -> list[MemoryLever]:
    """The levers an out-of-memory text supports on its own, in the order its facts give them:
    the padding fix of each allocation padded MIN_EXPANSION-fold or more, then the largest
    temporaries by op, then donation (outputs that share nothing with the arguments) and remat
    (forward activations in the list beside a backward pass)."""
    levers: list[MemoryLever] = []
    for a in error.allocations:
        if not a.padding_bytes or a.unpadded_bytes is None or a.size_bytes < MIN_EXPANSION * max(a.unpadded_bytes, 1):
            continue
        dims = _padded_dims_of(a.shape)
        where = ", ".join(f"dim {i}: {s} → {p}" for i, s, p in dims)
        expansion = a.expansion if a.expansion is not None else a.size_bytes / max(a.unpadded_bytes, 1)
        who = _who(a)
        levers.append(MemoryLever(
            "padding", f"{who} `{a.shape.split('{')[0]}` is padded {expansion:.1f}x by its layout"
            + (f" ({where})" if where else ""), a.padding_bytes,
            f"the padding the compiler printed for this allocation ({_fmt(a.size_bytes)} for {_fmt(a.unpadded_bytes)} "
            "of data)", _padding_fix(a.shape, dims), (a.instruction or who,),
            precondition=f"the error lists it at {_fmt(a.size_bytes)} with {_fmt(a.padding_bytes)} of padding"))
    groups: dict[str, list] = defaultdict(list)
    for a in error.allocations:
        if a.allocation_type in ("HLO temp", ""):
            groups[_op_group(a)].append(a)
    if groups:
        label, allocs = max(groups.items(), key=lambda kv: (sum(a.size_bytes for a in kv[1]), kv[0]))
        total = sum(a.size_bytes for a in allocs)
        levers.append(MemoryLever(
            "temporaries", f"the largest temporaries by op: `{label}` holds {_fmt(total)} in {len(allocs)} of the "
            "listed allocations", total, "the listed temporaries of that op: the most that splitting or fusing it "
            "could free", "compute it in chunks (jax.lax.map or a scan over the batch), or in a narrower dtype",
            tuple(a.instruction for a in allocs if a.instruction),
            precondition=f"{len(allocs)} HLO {'temporary' if len(allocs) == 1 else 'temporaries'} of `{label}` in the error's list"))
    args = error.part("arguments")
    if (error.output_bytes and args is not None and args.size_bytes
            and (error.output_shared_bytes or 0) < error.output_bytes):
        free = min(error.output_bytes - (error.output_shared_bytes or 0), args.size_bytes)
        levers.append(MemoryLever(
            "donation", "donate the arguments whose updated value the program returns", free,
            "the outputs not sharing an argument's buffer, at most the arguments' size; only outputs with an "
            "argument's shape can reuse it", "jax.jit(step, donate_argnums=...) for the state the step returns",
            precondition=f"outputs of {_fmt(error.output_bytes)} share {_fmt(error.output_shared_bytes or 0)} "
                         f"with {_fmt(args.size_bytes)} of arguments"))
    backward = any(_BACKWARD.search(a.op_name) for a in error.allocations)
    forward = [a for a in error.allocations if "jvp(" in a.op_name and "transpose(" not in a.op_name]
    if backward and forward:
        levers.append(MemoryLever(
            "remat", f"rematerialise the {len(forward)} listed forward activations kept for the backward pass",
            sum(a.size_bytes for a in forward), "the listed forward activations (the list holds only the largest); "
            "recomputing them costs their FLOPs again", "wrap the layer in jax.checkpoint "
            "(policy=jax.checkpoint_policies.dots_saveable, or nothing_saveable for the most memory)",
            tuple(a.instruction for a in forward if a.instruction),
            precondition="the list names a backward pass (`transpose(jvp(...))`) and forward activations"))
    return [lv for lv in levers if lv.saving_bytes > 0]


def oom_analysis(error: OomError) -> OomAnalysis:
    """An OOM text on its own: its levers and the cheapest that covers the overrun alone."""
    levers = tuple(error_levers(error)) if error.space == "hbm" else ()
    first = first_lever(levers, max(error.over_by_bytes, 0) + 1) if levers else None
    return OomAnalysis(error=error, levers=levers, first=first.key if first is not None else "")


def _who(a) -> str:
    return f"`{a.op_name}`" if a.op_name else (f"`{a.instruction}`" if a.instruction else f"allocation {a.rank}")


def _op_group(a) -> str:
    """The op an allocation belongs to, for grouping: its op name without a trailing `_N` index
    (`resnet152/MaxPool_11` -> `resnet152/MaxPool`), else its instruction without `.N`."""
    if a.op_name:
        return re.sub(r"_\d+$", "", a.op_name)
    return re.sub(r"\.\d+$", "", a.instruction) or f"allocation {a.rank}"


def _padding_fix(shape: str, dims: list[tuple[int, int, int]]) -> str:
    """Which dim to change so the tiles are full: each padded dim to a multiple of its tile, or a
    dim that already is one laid out minor-most (a transpose or a layout change)."""
    if not dims:
        return "choose dims that are multiples of the layout's tile, or a layout that puts a large dim last"
    parts = [f"dim {i} ({s} → {p}): make it a multiple of {_tile_of(s, p)}" for i, s, p in dims]
    try:
        parsed = parse_shape(shape)
    except ShapeSyntaxError:
        parsed = None
    sizes = getattr(parsed, "dims", ())
    padded = {i for i, *_ in dims}
    full = [(i, d) for i, d in enumerate(sizes) if i not in padded and d >= 128 and d % 128 == 0]
    if full:
        i, d = max(full, key=lambda x: x[1])
        parts.append(f"or lay out dim {i} ({d}, a multiple of 128) minor-most (transpose it last, or fold the padded "
                     "dims into it with a reshape)")
    return "; ".join(parts)


def _tile_of(size: int, padded: int) -> int:
    """The tile a dim was padded to (`18 → 128`: 128), from its padded size."""
    for tile in (128, 8, 16, 32, 256, 512, 4, 2):
        if padded % tile == 0 and padded - size < tile:
            return tile
    return padded


def _padded_dims_of(shape: str) -> list[tuple[int, int, int]]:
    try:
        parsed = parse_shape(shape)
    except ShapeSyntaxError:
        return []
    from tpudiag.model.compiled import ArrayShape

    return padded_dims(parsed) if isinstance(parsed, ArrayShape) else []


def _argnums(program: CompiledProgram, roots: list[str]) -> tuple[int, ...] | None:
    """`donate_argnums` for argument roots, when the parameters' order gives the jit argument order.

    JAX flattens the jit arguments in order, so the first parameter of each root gives its rank
    among the roots; the mapping holds when every root's parameters are contiguous.
    """
    firsts: dict[str, int] = {}
    for inst in program.entry_parameters():
        root = _argument_root(inst.op_name, inst.name)
        firsts.setdefault(root, inst.parameter_number if inst.parameter_number is not None else 0)
    order = sorted(firsts, key=firsts.__getitem__)
    if not all(r in order for r in roots):
        return None
    return tuple(order.index(r) for r in sorted(roots, key=firsts.__getitem__))


def with_allocator_capacity(report: MemoryReport, capacities: Iterable[int]) -> MemoryReport:
    """`report` with the allocator's measured capacity (in use + free at its peak) as the HBM size
    of each program whose chip gave none (a GPU capture): the device's figure first, then the
    allocator's, then the generation's; the source is named. Levers stay as the program's
    buffers gave them (a program of unknown size had none)."""
    measured = max((c for c in capacities if c > 0), default=None)
    if measured is None:
        return report
    programs = tuple(
        replace(p, hbm_capacity_bytes=p.hbm_capacity_bytes or measured, hbm_usable_bytes=measured,
                usable_source="the allocator's measured capacity",
                capacity_source=p.capacity_source or "measured by the allocator")
        if p.hbm_usable_bytes is None else p for p in report.programs)
    return replace(report, programs=programs)


GPU_MEMORY_SOURCE = "the GPU's memory_size in the trace"


def with_gpu_memory(programs: tuple[ProgramMemory, ...], memory_bytes: int) -> tuple[ProgramMemory, ...]:
    """`programs` with a GPU plane's `memory_size` as the HBM capacity of each whose chip gave none
    (the report said "HBM size unknown" beside a header naming it); the allocator's measured
    capacity, where `tpudiag memory` reads it, is the usable figure (`with_allocator_capacity`)."""
    if memory_bytes <= 0:
        return programs
    return tuple(replace(p, hbm_capacity_bytes=memory_bytes, capacity_source=GPU_MEMORY_SOURCE)
                 if p.hbm_capacity_bytes is None else p for p in programs)
