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

from tpudiag.model.compile_output import HLO_TEXT_FILE, RESULT_FILE, CompileOutput
from tpudiag.model.compiled import (MEMORY_SPACE_NAMES, BufferAllocation, BufferValue, CompiledProgram,
                                    memory_space_name)
from tpudiag.model.hardware import COMPILER_USABLE_HBM_BYTES, DEFAULT_SCOPED_VMEM_BYTES, ChipSpec
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.llo import LloDump
from tpudiag.model.memory import (MemoryBuffer, MemoryGroup, MemoryLever, MemoryReport, OomError, ProgramMemory,
                                  SpaceMemory, VmemUse)
from tpudiag.parsers.layout import ShapeSyntaxError, parse_shape
from tpudiag.parsers.oom_error import parse_oom_error

# A modelled lever for sharding across devices assumes this many (the smallest v5e/v6e slice).
FSDP_DEVICES = 4
# The order in which levers are tried first: cost to the user, cheapest first (donation is free,
# remat costs FLOPs, a microbatch costs steps, dtypes cost numerics, offload PCIe, FSDP devices).
EFFORT = ("donation", "remat", "microbatch", "dtype", "host-offload", "fsdp")
# Temporaries below this size are left out of the live set (tuple index tables, scalars).
MIN_LIVE_BYTES = 4096
_INDEX = re.compile(r"\{[\d,]*\}$")


def program_memories(compiled: CompiledInputs, errors: Iterable[OomError] = (),
                     outputs: Mapping[Path, CompileOutput] = MappingProxyType({})) -> tuple[ProgramMemory, ...]:
    """The memory of every program with a buffer assignment; `errors` are joined to the largest.
    `outputs`: `tpudiag compile` output directories already read (`parsers.compile_output`), by directory,
    so that their `result.json` and `compiled.hlo.txt` are not read again."""
    errors = tuple(errors)
    # A capture with `--dumps` of its compile holds each program twice: the dump's (with live
    # ranges) is kept, the capture's own copy of the same module left out.
    dumped = {h.program.module for h in compiled.hlo}
    inputs = [h for h in (*compiled.hlo, *(e for e in compiled.embedded if e.program.module not in dumped))
              if h.program.allocations]
    largest = max(inputs, key=lambda h: sum(a.size_bytes for a in h.program.allocations), default=None)
    return tuple(program_memory(h, compiled.chip, errors if h is largest else (), llo=compiled.llo, outputs=outputs)
                 for h in inputs)


def memory_report(input_path: str, compiled: CompiledInputs, errors: Iterable[OomError] = (),
                  programs: tuple[ProgramMemory, ...] | None = None) -> MemoryReport:
    """`tpudiag memory`'s report: `programs` (from `program_memories`, computed when None) and notes."""
    errors = tuple(errors)
    programs = program_memories(compiled, errors) if programs is None else programs
    # a dumped program without a buffer assignment may have had one its parser ignored: say why
    notes = [w for h in compiled.hlo if not h.program.allocations for w in h.program.warnings]
    if not programs:
        notes.append("no compiled program with a buffer assignment: dump with XLA_FLAGS=--xla_dump_to=DIR "
                     "(or `tpudiag compile`) to see device memory")
    return MemoryReport(input_path=input_path, programs=programs, errors=errors, warnings=tuple(notes))


def program_memory(hlo: HloInput, chip: ChipSpec | None, errors: Iterable[OomError] = (),
                   llo: Iterable[LloDump] = (), outputs: Mapping[Path, CompileOutput] = MappingProxyType({})
                   ) -> ProgramMemory:
    """One program's memory: its spaces, the chip's HBM and the levers, the scoped VMEM per op
    (from the LLO dumps of the same module when given); `errors` joined to it."""
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
    levers = _levers(program, hbm) if hbm is not None else ()
    result = ProgramMemory(
        module=program.module, path=program.path, generation=chip.generation if chip else "",
        hbm_capacity_bytes=capacity, hbm_usable_bytes=usable, usable_source=usable_source, spaces=spaces,
        oom_recorded=program.oom_recorded, error=error, levers=levers,
        compiler_peak_bytes=_compiler_peak(facts))
    result = replace(result, **_vmem(hlo, chip, errors, tuple(llo), facts, output))
    peak, limit = result.hbm_peak_bytes, result.hbm_limit_bytes
    # Over the limit: a lever must free the excess; near it, any lever helps.
    need = peak - limit + 1 if peak is not None and limit is not None and peak > limit else 0
    first = first_lever(levers, need)
    warnings = list(program.warnings)  # the program's own, a side file it ignored among them
    if program.allocations and not program.live_ranges:
        warnings.append(f"`{program.module}`: no live-range dump: the temporaries at the peak are not split by time")
    return replace(result, first=first.key if first is not None else "", warnings=tuple(warnings))


def first_lever(levers: tuple[MemoryLever, ...], need_bytes: int) -> MemoryLever | None:
    """The cheapest lever (`EFFORT`) that frees `need_bytes` on its own, else the one that frees the most."""
    enough = [lv for lv in levers if lv.saving_bytes >= need_bytes]
    if enough:
        return min(enough, key=lambda lv: EFFORT.index(lv.key))
    return max(levers, key=lambda lv: lv.saving_bytes, default=None)


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
    """Per HLO op, its largest SCOPED block in the LLO VMEM report (the program's own entry,
    `<top-inlining-caller>`, is the whole program, not one op)."""
    out: dict[str, int] = {}
    for dump in dumps:
        table = dump.vmem_allocations
        if table.empty:
            continue
        scoped = table[(table["block_type"] == "SCOPED") & (table["hlo"] != "<top-inlining-caller>")]
        for op, size in scoped.groupby("hlo", observed=True)["block_bytes"].max().items():
            out[str(op)] = max(out.get(str(op), 0), int(size))
    return [_vmem_use(program, op, size, "LLO VMEM report") for op, size in out.items() if size > 0]


def _vmem_from_hlo(program: CompiledProgram | None) -> list[VmemUse]:
    """Per instruction, the VMEM (memory space 1) of its `used_scoped_memory_configs`."""
    if program is None:
        return []
    out = []
    for inst in program.instructions.values():
        if "used_scoped_memory_configs" not in inst.backend_config:
            continue
        try:
            configs = json.loads(inst.backend_config).get("used_scoped_memory_configs") or []
            size = sum(int(c.get("size", 0)) for c in configs if str(c.get("memory_space")) == "1")
        except (ValueError, AttributeError, TypeError):
            continue  # a backend config that is not the JSON expected: no figure for this op
        if size > 0:
            out.append(_vmem_use(program, inst.name, size, "HLO backend_config"))
    return out


def _vmem_use(program: CompiledProgram | None, op: str, size: int, source: str) -> VmemUse:
    inst = program.find(op) if program is not None else None
    return VmemUse(op=op, scoped_bytes=size, source=source, op_name=inst.op_name if inst else "",
                   kernel=inst is not None and inst.custom_call_target == "tpu_custom_call")


def _compiled_text(hlo: HloInput, output: CompileOutput | None) -> CompiledProgram | None:
    """The `compiled.hlo.txt` of a `tpudiag compile` output, beside its XLA dump (`output`'s program
    when that output was read already); None when absent."""
    from tpudiag.errors import InputError
    from tpudiag.parsers.hlo_text import load_hlo_text

    path = Path(hlo.origin).parent / HLO_TEXT_FILE
    if output is not None:
        return output.program if Path(output.program.path) == path else None
    try:
        return load_hlo_text(path) if path.is_file() else None
    except InputError:
        return None


def _compile_facts(hlo: HloInput, output: CompileOutput | None) -> dict:
    """The `result.json` of the `tpudiag compile` output this program's dump is in (`output`'s when
    that was read already), when it is this program's; {} otherwise (an XLA dump of its own, or damaged)."""
    result = Path(hlo.origin).parent / RESULT_FILE
    try:
        facts = output.facts if output is not None else json.loads(result.read_text()) if result.is_file() else {}
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) and facts.get("module") == hlo.program.module else {}


def _compile_errors(facts: dict) -> tuple[OomError, ...]:
    """The out-of-memory error a failed `tpudiag compile` recorded, as if given with `--error`."""
    if facts.get("status") != "compile_error":
        return ()
    error = parse_oom_error(str(facts.get("detail") or facts.get("message") or ""))
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


def _levers(program: CompiledProgram, hbm: SpaceMemory) -> tuple[MemoryLever, ...]:
    live = hbm.live_at_peak
    args = [b for b in live if b.kind == "argument"]
    outputs = [b for b in live if b.kind == "output"]
    temps = [b for b in live if b.kind == "temporary"]
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
        saving = sum(o.size_bytes for o, _ in pairs)
        roots = sorted(donated)
        numbers = _argnums(program, roots)
        fix = (f"jax.jit(step, donate_argnums={numbers})" if numbers
               else f"donate the arguments {', '.join(roots)} (`donate_argnums`)")
        levers.append(MemoryLever(
            "donation", f"donate {', '.join(roots)}: {len(pairs)} output{'s' * (len(pairs) != 1)} "
            f"{'have' if len(pairs) != 1 else 'has'} an argument's shape and could reuse it",
            saving, "the outputs that could reuse a same-shaped argument's buffer; the compiler may need "
            "some of it back as temporaries for out-of-place updates", fix,
            tuple(o.name for o, _ in pairs)))

    # Rematerialisation: forward-pass activations (`jvp(` in the name stack, not the transpose)
    # that are live at the peak because the backward pass needs them.
    kept = [t for t in temps if "jvp(" in t.op_name and "transpose(" not in t.op_name]
    if kept:
        levers.append(MemoryLever(
            "remat", f"rematerialise {len(kept)} forward activations kept for the backward pass",
            sum(t.size_bytes for t in kept), "forward activations live at the peak; recomputing them costs "
            "their FLOPs again in the backward pass",
            "wrap the layer in jax.checkpoint (e.g. policy=jax.checkpoint_policies.dots_saveable, "
            "or nothing_saveable for the most memory)", tuple(t.name for t in kept)))

    # Optimiser state and parameters: arguments the step also returns in the same shape (whether
    # donated or not) are the training state; sharding it over devices (FSDP) or keeping it on
    # the host between uses frees its HBM.
    state = [a for a in args if a.aliased or any(o.shape == a.shape for o in outputs)]
    state_bytes = sum(a.size_bytes for a in state) + sum(o.size_bytes for o, _ in pairs)
    if state:
        levers.append(MemoryLever(
            "fsdp", f"shard the parameters and optimiser state over {FSDP_DEVICES} devices (FSDP)",
            state_bytes * (FSDP_DEVICES - 1) // FSDP_DEVICES,
            f"(1 - 1/{FSDP_DEVICES}) of the state (arguments the step returns in the same shape) and their "
            f"updated outputs, modelled for "
            f"{FSDP_DEVICES} devices; gathering them per layer adds collectives",
            "shard params and optimiser state along a mesh axis (NamedSharding(mesh, P('data', None)))",
            tuple(a.name for a in state)))
        f32_state = [a for a in state if _dtype(a.shape) == "f32"]
        if f32_state:
            moved = sum(a.size_bytes for a in f32_state) + sum(o.size_bytes for o, a in pairs if a in f32_state)
            levers.append(MemoryLever(
                "host-offload", f"keep the f32 optimiser state in host memory ({len(f32_state)} arrays)",
                moved, "the f32 state arguments (and their new values) moved to pinned host memory; "
                "the update then streams over PCIe each step",
                "place the optimiser state with memory_kind='pinned_host' (jax.device_put / out_shardings)",
                tuple(a.name for a in f32_state)))

    # A smaller microbatch: the temporaries and the arguments that are not state (the batch) scale
    # with the batch size.
    batch_args = [a for a in args if a not in state]
    scaled = sum(t.size_bytes for t in temps) + sum(a.size_bytes for a in batch_args)
    if scaled:
        levers.append(MemoryLever(
            "microbatch", "halve the microbatch (accumulate gradients over 2)", scaled // 2,
            "half of the temporaries live at the peak and of the batch arguments, which scale with the batch",
            "split the batch into microbatches and accumulate gradients (jax.lax.scan over microbatches)",
            tuple(b.name for b in (*temps, *batch_args))))

    # Narrower dtypes: f32 buffers at the peak stored as bf16.
    wide = [b for b in live if _dtype(b.shape) == "f32"]
    if wide:
        levers.append(MemoryLever(
            "dtype", f"store {len(wide)} f32 buffers at the peak in bf16", sum(b.size_bytes for b in wide) // 2,
            "half of the f32 buffers live at the peak; bf16 optimiser state needs care (stochastic rounding "
            "or an f32 master copy of the params only)",
            "keep optimiser moments in bf16 (e.g. optax.adam(mu_dtype=jnp.bfloat16)) or activations in bf16",
            tuple(b.name for b in wide)))
    levers.sort(key=lambda lv: (-lv.saving_bytes, lv.key))
    return tuple(lv for lv in levers if lv.saving_bytes > 0)


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
