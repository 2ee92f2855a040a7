"""What both HLO parsers share: derive collective, async and cost facts, pair async ops, count bytes.

`hlo_text` and `hlo_proto` fill in what their format states (names, opcodes, shapes, operands,
metadata, backend_config); `finish_program` derives the rest the same way for both, so a program
read from a dump and from a capture's proto agree field for field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque

import numpy as np

from tpudiag.model.compiled import (
    INSTRUCTION_BYTES,
    ArrayShape,
    AsyncPair,
    BufferAllocation,
    CompiledProgram,
    Computation,
    Instruction,
    leaf_arrays,
    memory_space_name,
)
from tpudiag.model.hlo_names import async_role as name_async_role
from tpudiag.model.kernels import MosaicKernel
from tpudiag.parsers import mosaic
from tpudiag.model.hlo_names import collective_family
from tpudiag.model.units import MAX_PLAUSIBLE_BYTES, MAX_PLAUSIBLE_TEXT

# Opcodes whose instructions are collectives whatever they are called.
COLLECTIVE_OPCODES = frozenset({
    "all-gather", "all-gather-start", "all-gather-done",
    "all-reduce", "all-reduce-start", "all-reduce-done",
    "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-permute-start", "collective-permute-done",
    "collective-broadcast", "send", "send-done", "recv", "recv-done",
})

# Opcodes XLA itself has for async work. Any other `X-start` / `X-update` / `X-done` in HLO text is
# printer sugar for async-start/-update/-done wrapping a one-instruction computation running X
# (`slice-start` on v5e, `call-start` on some TPU7x builds); both parsers canonicalise to these.
NATIVE_ASYNC_OPCODES = frozenset({
    "all-gather-start", "all-gather-done", "all-reduce-start", "all-reduce-done",
    "collective-permute-start", "collective-permute-done", "copy-start", "copy-done",
    "async-start", "async-update", "async-done", "send", "send-done", "recv", "recv-done",
})


def canonical_opcode(opcode: str) -> tuple[str, str]:
    """(opcode, wrapped opcode) for an opcode as printed: `slice-start` -> ('async-start', 'slice')."""
    if opcode in NATIVE_ASYNC_OPCODES:
        return opcode, ""
    for suffix in ("-start", "-update", "-done"):
        if opcode.endswith(suffix) and len(opcode) > len(suffix):
            return "async" + suffix, opcode[: -len(suffix)]
    return opcode, ""


# Instructions that cost nothing at run time: they do not count as work between an async start
# and its done, and the pairing walks through them from a done back to its start.
FREE_OPCODES = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all"})

# How deep to look into called computations for a collective (async wrapper -> call -> op).
_CALL_DEPTH = 3


def backend_cycles(backend_config: str) -> tuple[int | None, str]:
    """The compiler's cycle estimate in a backend_config and where it came from.

    The static LLO profile's `bundle_analysis_data.estimated_cycles` wins over the classic cost
    model's `window_config.estimated_cycles` (§4 of the compiler-dumps reference: the profile is
    the better estimate). Non-JSON configs (custom-call opaque strings) have no estimate.
    """
    if not backend_config or "estimated_cycles" not in backend_config:
        return None, ""
    try:
        config = json.loads(backend_config)
    except ValueError:
        return None, ""
    if not isinstance(config, dict):
        return None, ""
    for key in ("bundle_analysis_data", "window_config"):
        section = config.get(key)
        if isinstance(section, dict) and "estimated_cycles" in section:
            try:
                return int(section["estimated_cycles"]), key
            except (TypeError, ValueError):
                continue
    return None, ""


def _is_continuation(inst: Instruction) -> bool:
    return inst.opcode == "fusion" and (
        any("async_collective_fusion" in c for c in inst.called_computations)
        or "continuation_config" in inst.backend_config)


def _async_role(inst: Instruction) -> str:
    op = inst.opcode
    if op.endswith("-start") or op in ("send", "recv"):
        return "start"
    if op.endswith("-done"):
        return "done"
    if op == "fusion":  # v5e: async-collective-start/-done are kCustom fusions, named as such
        role = name_async_role(inst.name)
        if role is not None and "async-collective" in role[1]:
            return role[0]
    return ""


def read_kernels(program: CompiledProgram) -> dict[str, MosaicKernel]:
    """The program's Pallas kernels whose custom calls keep their body (`parsers.mosaic`), by
    instruction name; one warning on the program per kernel that cannot be read, and one when
    jaxlib is absent."""
    kernels: dict[str, MosaicKernel] = {}
    for inst in program.instructions.values():
        if inst.opcode != "custom-call" or inst.custom_call_target != mosaic.KERNEL_TARGET:
            continue
        body = mosaic.body_of(inst.backend_config)
        if body is None:
            continue
        try:
            kernel = mosaic.read_kernel(body, len(inst.operands))
            caller = mosaic.caller_of(inst.source_file, inst.source_line)
            if caller is not None:
                kernel = dataclasses.replace(kernel, caller=caller.target, caller_params=caller.params,
                                             caller_example_args=caller.example_args)
            kernels[inst.name] = kernel
        except mosaic.MlirMissing:
            program.warnings.append(mosaic.MLIR_MISSING)
            return {}
        except mosaic.KernelUnreadable as exc:
            program.warnings.append(f"`{inst.name}`: its Pallas kernel is not shown: {exc}")
    return kernels


def finish_program(program: CompiledProgram) -> CompiledProgram:
    """Fill the derived fields of every instruction and the async pairs, in place; return it."""
    by_comp: dict[str, list[Instruction]] = {}
    for (comp, _), inst in program.instructions.items():
        by_comp.setdefault(comp, []).append(inst)
    body_opcodes = {c: {i.opcode for i in insts} for c, insts in by_comp.items()}
    calls = {c: [x for i in insts for x in i.called_computations] for c, insts in by_comp.items()}

    def family_in_body(comp: str, depth: int) -> str:
        for op in sorted(body_opcodes.get(comp, ())):
            if op in COLLECTIVE_OPCODES:
                return collective_family(op)
        if depth < _CALL_DEPTH:
            for callee in calls.get(comp, ()):
                fam = family_in_body(callee, depth + 1)
                if fam:
                    return fam
        return ""

    roots = {c.name: program.instructions.get((c.name, c.root)) for c in program.computations.values()}
    for key, inst in list(program.instructions.items()):
        cycles, source = backend_cycles(inst.backend_config)
        continuation = _is_continuation(inst)
        role = _async_role(inst)
        wrapped = inst.wrapped_opcode
        if not wrapped and inst.opcode.startswith("async-") and inst.called_computations:
            root = roots.get(inst.called_computations[0])
            wrapped = root.opcode if root is not None else ""
        inst = dataclasses.replace(inst, wrapped_opcode=wrapped)
        program.instructions[key] = dataclasses.replace(
            inst, estimated_cycles=cycles, cycles_source=source, is_continuation=continuation,
            async_role=role, collective_family=_family(inst, continuation, role, family_in_body))
    program.async_pairs = tuple(_pair_async(program))
    program.kernels = read_kernels(program)
    # A done often names nothing but its start (v5e: `async-collective-done`, an async-done
    # without its wrapped computation): take the start's family and wrapped opcode.
    for pair in program.async_pairs:
        start = program.instructions[(pair.computation, pair.start)]
        done = program.instructions[(pair.done_in, pair.done)]
        family = pair.family if pair.family and done.collective_family in ("", "collective") else done.collective_family
        wrapped = done.wrapped_opcode or start.wrapped_opcode
        if (family, wrapped) != (done.collective_family, done.wrapped_opcode):
            program.instructions[(pair.done_in, pair.done)] = dataclasses.replace(
                done, collective_family=family, wrapped_opcode=wrapped)
    return program


def _family(inst: Instruction, continuation: bool, role: str, family_in_body) -> str:
    if continuation:
        return ""  # compute that carries a collective step; the collective is its start/done
    if inst.opcode in COLLECTIVE_OPCODES:
        return collective_family(inst.opcode)
    if inst.wrapped_opcode in COLLECTIVE_OPCODES:  # e.g. async-start wrapping reduce-scatter
        return collective_family(inst.wrapped_opcode)
    if inst.opcode not in ("fusion", "async-start", "async-done", "call") or (
            inst.opcode == "call" and not role):
        return ""
    fam = collective_family(inst.name)
    if fam and fam != "collective":
        return fam
    for callee in inst.called_computations:  # reduce-scatter fusion: calls=%all-reduce-scatter.N
        named = collective_family(callee)
        if named and named != "collective":
            return named
    for callee in inst.called_computations:
        found = family_in_body(callee, 1)
        if found:
            return found
    return fam


def _pair_async(program: CompiledProgram) -> list[AsyncPair]:
    pairs: list[AsyncPair] = []
    lone_dones: list[tuple[str, str]] = []
    starts_all: dict[tuple[str, str], int] = {}
    paired: set[tuple[str, str]] = set()
    for comp_name, comp in program.computations.items():
        insts = {n: program.instructions[(comp_name, n)] for n in comp.instructions}
        starts = {n for n, i in insts.items() if i.async_role == "start"}
        starts_all.update(((comp_name, n), insts[n].position) for n in starts)
        for name, inst in insts.items():
            if inst.async_role != "done":
                continue
            start = _find_start(name, insts, starts)
            if start is None:
                lone_dones.append((comp_name, name))
                continue
            paired.add((comp_name, start))
            s = insts[start]
            between = tuple(comp.instructions[s.position + 1:inst.position])
            work = tuple(n for n in between if not _bookkeeping(insts[n]))
            pairs.append(AsyncPair(
                computation=comp_name, start=start, done=name, kind=_pair_kind(s),
                family=s.collective_family, start_position=s.position, done_position=inst.position,
                scheduled_between=work, thread=s.async_execution_thread))
    # A done whose start is in another computation, or in the previous iteration of its loop: the
    # value is followed back through tuples, parameters, `while` and `call` (SparseCore-offloaded
    # collectives of a scanned layer start before the loop or one iteration ahead).
    callers = _callers(program)
    for comp_name, name in lone_dones:
        found = _starts_across(program, comp_name, name, callers)
        if not found:
            program.warnings.append(
                f"`{program.path}`: async done `{name}` in `{comp_name}` has no start it depends on")
        for start_comp, start in found:
            paired.add((start_comp, start))
            pairs.append(_pair_across(program, start_comp, start, comp_name, name))
    for comp_name, start in sorted(set(starts_all) - paired, key=lambda k: (k[0], starts_all[k])):
        program.warnings.append(f"`{program.path}`: async start `{start}` in `{comp_name}` has no done")
    return pairs


# Custom calls that only prepare a SparseCore-offloaded async call (its sync flag and token): no
# work that could hide a transfer.
_PREPARE_TARGETS = ("PrepareAsyncCallStart", "PrepareAsyncCallDone")


def _bookkeeping(inst: Instruction) -> bool:
    """An instruction that does no work between an async start and its done."""
    return inst.opcode in FREE_OPCODES or inst.custom_call_target in _PREPARE_TARGETS


_TRACE_DEPTH = 64  # hops a value is followed back through tuples, parameters and loops


def _callers(program: CompiledProgram) -> dict[str, list[Instruction]]:
    """Computation -> the control-flow instructions (`while`, `call`) that run it."""
    out: dict[str, list[Instruction]] = {}
    for inst in program.instructions.values():
        if inst.opcode in ("while", "call"):
            for callee in inst.called_computations:
                out.setdefault(callee, []).append(inst)
    return out


def _while_body(inst: Instruction) -> str:
    body = dict(inst.attributes).get("body", "")
    if body:
        return body.strip().lstrip("%")
    return inst.called_computations[-1] if inst.called_computations else ""


def _starts_across(program: CompiledProgram, comp: str, done: str,
                   callers: dict[str, list[Instruction]]) -> list[tuple[str, str]]:
    """The async starts (computation, name) whose value reaches `done`, across computations."""
    found: list[tuple[str, str]] = []
    seen: set[tuple[str, str, tuple[int, ...]]] = set()
    stack = [(comp, o, (), 0) for o in program.instructions[(comp, done)].operands]
    while stack:
        c, name, path, depth = stack.pop()
        inst = program.instructions.get((c, name))
        if inst is None or (c, name, path) in seen or depth > _TRACE_DEPTH:
            continue
        seen.add((c, name, path))
        nxt = depth + 1
        if inst.async_role == "start":
            if (c, name) not in found:
                found.append((c, name))
        elif inst.opcode == "get-tuple-element" and inst.operands:
            index = _int_attr(inst, "index")
            if index is not None:
                stack.append((c, inst.operands[0], (index, *path), nxt))
        elif inst.opcode == "tuple":
            if path and path[0] < len(inst.operands):
                stack.append((c, inst.operands[path[0]], path[1:], nxt))
        elif inst.opcode == "parameter":
            for caller in callers.get(c, ()):
                if caller.opcode == "while" and caller.operands:
                    stack.append((caller.computation, caller.operands[0], path, nxt))  # the loop's init value
                    body = program.computations.get(c)
                    if c == _while_body(caller) and body is not None:  # the previous iteration's
                        stack.append((c, body.root, path, nxt))
                elif caller.opcode == "call" and inst.parameter_number is not None \
                        and inst.parameter_number < len(caller.operands):
                    stack.append((caller.computation, caller.operands[inst.parameter_number], path, nxt))
        elif inst.opcode == "while":
            body = program.computations.get(_while_body(inst))
            if body is not None:
                stack.append((body.name, body.root, path, nxt))
        elif inst.opcode == "call" and inst.called_computations:
            callee = program.computations.get(inst.called_computations[0])
            if callee is not None:
                stack.append((callee.name, callee.root, path, nxt))
        elif inst.opcode in FREE_OPCODES or inst.is_continuation or inst.opcode == "async-update":
            stack.extend((c, o, path, nxt) for o in inst.operands)
    return found


def _int_attr(inst: Instruction, key: str) -> int | None:
    value = dict(inst.attributes).get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _carrier(program: CompiledProgram, outer: str, inner: str) -> Instruction | None:
    """The instruction of `outer` that runs `inner` (through control flow, at any depth)."""
    for name in program.computations[outer].instructions:
        inst = program.instructions[(outer, name)]
        stack, seen = list(inst.called_computations), set()
        while stack:
            comp = stack.pop()
            if comp == inner:
                return inst
            if comp in seen or comp not in program.computations:
                continue
            seen.add(comp)
            stack.extend(c for n in program.computations[comp].instructions
                         for c in program.instructions[(comp, n)].called_computations)
    return None


def _pair_across(program: CompiledProgram, start_comp: str, start: str, done_comp: str, done: str) -> AsyncPair:
    """The pair of a start and a done in different computations (or iterations), with what runs
    at least once between them: the start's computation after it, up to the op that carries the
    value into the done's computation, and the done's computation before it, after the op that
    carried the start."""
    s = program.instructions[(start_comp, start)]
    d = program.instructions[(done_comp, done)]
    start_insts = program.computations[start_comp].instructions
    done_insts = program.computations[done_comp].instructions
    cut, begin = len(start_insts), 0
    if start_comp != done_comp:
        into = _carrier(program, start_comp, done_comp)
        if into is not None:
            cut = into.position + 1
        out_of = _carrier(program, done_comp, start_comp)
        if out_of is not None:
            begin = out_of.position + 1
    between = [(start_comp, n) for n in start_insts[s.position + 1:cut]]
    between += [(done_comp, n) for n in done_insts[begin:d.position]]
    work = tuple(dict.fromkeys(n for c, n in between if not _bookkeeping(program.instructions[(c, n)])))
    return AsyncPair(computation=start_comp, start=start, done=done, kind=_pair_kind(s), family=s.collective_family,
                     start_position=s.position, done_position=d.position, scheduled_between=work,
                     thread=s.async_execution_thread, done_computation=done_comp if done_comp != start_comp else "")


def _find_start(done: str, insts: dict[str, Instruction], starts: set[str]) -> str | None:
    """Walk back from a done through free ops and continuation fusions to the nearest start."""
    seen = {done}
    queue = deque(insts[done].operands)
    while queue:
        name = queue.popleft()
        if name in seen or name not in insts:
            continue
        seen.add(name)
        if name in starts:
            return name
        inst = insts[name]
        if inst.opcode in FREE_OPCODES or inst.is_continuation or inst.opcode == "async-update":
            queue.extend(inst.operands)
    return None


def _pair_kind(start: Instruction) -> str:
    if start.opcode == "copy-start":
        return "copy"
    if start.wrapped_opcode == "slice":
        return "slice"
    if start.collective_family:
        return "collective"
    return "async"


def check_allocation_sizes(allocations: tuple[BufferAllocation, ...]) -> tuple[BufferAllocation, ...]:
    """The buffer assignment's allocations; ValueError naming the first whose size or a value's
    size or offset is negative or past any memory (a damaged file: shown, it would print a negative
    or absurd byte count, or overflow a float)."""
    limit = MAX_PLAUSIBLE_BYTES
    for alloc in allocations:
        numbers = (alloc.size_bytes, *(n for v in alloc.values for n in (v.size_bytes, v.offset_bytes)))
        if any(not 0 <= n <= limit for n in numbers):
            raise ValueError(f"allocation {str(alloc.index)[:20]} has a size or offset that is negative "
                             f"or past {MAX_PLAUSIBLE_TEXT}")
    return allocations


def computation_from(name: str, is_entry: bool, insts: list[Instruction]) -> Computation:
    root = next((i.name for i in insts if i.is_root), insts[-1].name if insts else "")
    return Computation(name=name, is_entry=is_entry, instructions=tuple(i.name for i in insts), root=root)


def instruction_bytes(program: CompiledProgram):
    """Per instruction: logical and padded bytes of its operands and result (INSTRUCTION_BYTES).

    Operands are looked up by name in the same computation. A `get-tuple-element` reads only the
    element it selects, so its operand bytes are its result's, not the whole tuple's.
    """
    rows: dict[str, list] = {c.name: [] for c in INSTRUCTION_BYTES.columns}
    for (comp, name), inst in program.instructions.items():
        if inst.opcode == "get-tuple-element":
            op_logical, op_padded = inst.logical_bytes, inst.padded_bytes
        else:
            operands = [program.instructions.get((comp, o)) for o in inst.operands]
            op_logical = sum(o.logical_bytes for o in operands if o is not None)
            op_padded = sum(o.padded_bytes for o in operands if o is not None)
        logical = inst.logical_bytes + op_logical
        padded = inst.padded_bytes + op_padded
        spaces = sorted({memory_space_name(a.memory_space) for a in _arrays(inst)})
        rows["module"].append(program.module)
        rows["computation"].append(comp)
        rows["name"].append(name)
        rows["opcode"].append(inst.opcode)
        rows["result_logical_bytes"].append(inst.logical_bytes)
        rows["result_padded_bytes"].append(inst.padded_bytes)
        rows["operand_logical_bytes"].append(op_logical)
        rows["operand_padded_bytes"].append(op_padded)
        rows["logical_bytes"].append(logical)
        rows["padded_bytes"].append(padded)
        rows["padding_factor"].append(padded / logical if logical else math.nan)
        rows["memory_spaces"].append(",".join(spaces))
    for col in ("result_logical_bytes", "result_padded_bytes", "operand_logical_bytes",
                "operand_padded_bytes", "logical_bytes", "padded_bytes"):
        rows[col] = np.asarray(rows[col], dtype="int64")
    return INSTRUCTION_BYTES.frame(rows)


def _arrays(inst: Instruction) -> list[ArrayShape]:
    return leaf_arrays(inst.shape) if inst.shape is not None else []
