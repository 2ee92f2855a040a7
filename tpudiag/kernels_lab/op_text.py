"""The HLO text the lab's inference reads for one op, from what the diagnosis already read.

Two sources, both read once by `tpudiag.diagnose`:

- the compiled program the join matched to the op's trace program, when it came from an XLA dump
  (`--dump`): the instruction, the computation it calls (a fusion's body) and its operands' shapes
  are printed back from the parsed `CompiledProgram` (operands by name, as current XLA dumps print
  them; attributes as written; metadata and backend_config left out);
- otherwise the instruction text the capture's op metadata carries, whose operands are resolved
  against the ops of the same trace program.

A capture's embedded HloProto is not printed: its instructions keep no attributes (`dimensions`,
`padding`, `replica_groups`), so a printed body would lose what the inference reads from them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tpudiag.model.compiled import CompiledProgram, Instruction
from tpudiag.model.hlo_shapes import Shape, operand_shapes, parse_array, parse_shapes
from tpudiag.parsers.hlo_text import parse_instruction

_CALLED = re.compile(r"%?([\w.\-]+)")


@dataclass(frozen=True)
class OpText:
    """One op as HLO text, and its operands' shapes with where they came from."""

    line: str  # the instruction
    body: str  # the computation it calls (`calls=`), header line first; '' when none is known
    operands: tuple[Shape, ...]  # tuple-shaped and unknown operands left out
    operands_from: str  # '' when there are none
    # What the inference reads: the op's instruction (None when no text or program gives it) and
    # the instructions of the computation it calls, from the program itself or read from the text
    # by the dump parser; `line` and `body` are for people to read.
    instruction: Instruction | None = None
    called: tuple[Instruction, ...] = ()


def printed_opcode(inst: Instruction) -> str:
    """The opcode as HLO text spells it: the parsers read `slice-start` as an async-start wrapping
    `slice` (no `calls=`); printed back, it is `slice-start` again."""
    if inst.opcode.startswith("async-") and inst.wrapped_opcode and not inst.called_computations:
        return f"{inst.wrapped_opcode}-{inst.opcode.removeprefix('async-')}"
    return inst.opcode


def instruction_text(inst: Instruction) -> str:
    """`ROOT %name = shape opcode(%a, %b), attributes`."""
    args = str(inst.parameter_number) if inst.parameter_number is not None else ", ".join(
        f"%{name}" for name in inst.operands)
    attributes = inst.attributes_text()
    return (f"{'ROOT ' if inst.is_root else ''}%{inst.name} = {inst.shape_text} {printed_opcode(inst)}({args})"
            + (f", {attributes}" if attributes else ""))


def _parameters(program: CompiledProgram, computation: str) -> list[Instruction]:
    params = [i for i in program.computation_instructions(computation) if i.opcode == "parameter"]
    return sorted(params, key=lambda i: (i.parameter_number is None, i.parameter_number or 0))


def computation_text(program: CompiledProgram, computation: str) -> str:
    """`%name (p0: shape, ...) -> shape {`, its instructions, `}`."""
    comp = program.computations[computation]
    params = ", ".join(f"{p.name}: {p.shape_text}" for p in _parameters(program, computation))
    root = program.instructions.get((computation, comp.root))
    lines = [f"%{computation} ({params}) -> {root.shape_text if root is not None else '()'} {{"]
    lines += [f"  {instruction_text(inst)}" for inst in program.computation_instructions(computation)]
    return "\n".join(lines + ["}"])


def _array(shape_text: str, *, layout: bool) -> Shape | None:
    array = parse_array(shape_text)
    if array is None or layout:
        return array
    return Shape(array.dtype, array.dims, text=str(array))  # as a computation's header prints it


def from_program(program: CompiledProgram, name: str, shape_of: Callable[[str], str]) -> OpText | None:
    """The op `name` printed from `program`; None when the program has no such instruction.
    Operands: the called computation's parameters (a fusion's inputs), else each operand's own
    instruction in the program, else `shape_of(name)` (the trace's shape)."""
    inst = program.find(name)
    if inst is None:
        return None
    called = _CALLED.match(dict(inst.attributes).get("calls", "").strip())
    callee = called.group(1) if called else ""
    body = computation_text(program, callee) if callee in program.computations else ""
    called_insts = tuple(program.computation_instructions(callee)) if body else ()
    params = [_array(p.shape_text, layout=False) for p in _parameters(program, callee)] if body else []
    operands = [a for a in params if a is not None]
    if operands:
        return OpText(instruction_text(inst), body, tuple(operands), "the fused computation's parameters", inst,
                      called_insts)

    def own_shape(operand: str) -> str:
        found = program.find(operand)
        return (found.shape_text if found is not None else "") or shape_of(operand)

    operands = [a for a in (_array(own_shape(o), layout=True) for o in inst.operands) if a is not None]
    return OpText(instruction_text(inst), body, tuple(operands),
                  "the operands' own instructions" if operands else "", inst, called_insts)


def operand_names(hlo_text: str) -> list[str]:
    """`%name` operands of the instruction's call parentheses, in order."""
    m = re.search(r"=\s*(?:\([^=]*?\)|\S+)\s+[\w\-]+\((?P<args>[^)]*)\)", hlo_text)
    return re.findall(r"%([\w.\-]+)", m.group("args")) if m else []


def header_parameters(body: str) -> list[Shape]:
    """The parameter shapes a computation's header prints: `%name (p0: bf16[8,128], ...) -> ... {`."""
    head = body.lstrip().split("\n", 1)[0]
    if "(" not in head or " -> " not in head:
        return []
    return parse_shapes(head[head.index("("):head.rindex(" -> ")])


def from_text(hlo_text: str, shape_of: Callable[[str], str], body: str = "") -> OpText:
    """The op as text alone gives it (the capture's op metadata, or HLO text built by hand): operands
    printed with their shapes, else the parameters of `body`'s header, else each `%name` operand
    looked up with `shape_of(name)`."""
    inst, called = parsed(hlo_text, body)
    shapes = operand_shapes(hlo_text)
    if shapes:
        return OpText(hlo_text, body, tuple(shapes), "the HLO operands", inst, called)
    shapes = header_parameters(body)
    if shapes:
        return OpText(hlo_text, body, tuple(shapes), "the fused computation's parameters", inst, called)
    found = [a for a in (parse_array(shape_of(n)) for n in operand_names(hlo_text)) if a is not None]
    return OpText(hlo_text, body, tuple(found), "the operands' own instructions" if found else "", inst, called)


def parsed(hlo_text: str, body: str) -> tuple[Instruction | None, tuple[Instruction, ...]]:
    """The instruction `hlo_text` prints and the instructions of `body` (a computation's text, its
    header and closing brace skipped), read by the dump parser."""
    called = (parse_instruction(line, "body") for line in body.splitlines())
    return parse_instruction(hlo_text) if hlo_text.strip() else None, tuple(i for i in called if i is not None)
