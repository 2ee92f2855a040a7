"""The matmuls inside an op: M, N, K and batch, operand and result dtypes, and which output each feeds.

One model of an instruction's math, read by the rules (`low-mxu-utilization`, `memory-bound`),
static mode and the kernels lab, so a finding names the dims and dtypes of the matmul it is about
and never those of a neighbouring instruction or of the fusion's output tuple.

- `dot`: from `dot_dimension_numbers`. batch = the lhs batch dims, K = the lhs contracting dims,
  M = the other lhs dims, N = the other rhs dims (each a product when several dims take the role).
- `convolution`: from its dimension numbers (`dim_labels`), kernel and window. A TPU convolution
  is a matmul per group: M = output batch x output spatial positions, N = output features per
  group, K = kernel input features x the window taps that land on real input (not on padding or
  lhs dilation holes), batch = the feature and batch group counts. XLA writes many `dot_general`s
  as convolutions: `dim_labels=0fb_0io->bf0, window={size=8}` contracts 8 x 128 = 1024; a spatial
  dim where each output position reads one real input element with a tap of its own
  (`window={size=8x2 lhs_dilate=8x2}`, an attention `bqhd,bkhd->bhqk`, or `size=8x2 stride=8x2
  pad=7_7x1_1 lhs_dilate=7x1`, its gradient) is a batch dim.
- A custom call (Pallas kernel): its declared `cost_estimate` FLOPs, and a matmul when its operand
  shapes compose as `[B,]M,K x [B,]K,N -> [B,]M,N` (either operand may be transposed).
- A fusion, `call` or async start: the matmuls of the computations it calls, nested fusions
  included; `feeds` says which element of the op's result tuple each one reaches.

Pure: reads a `CompiledProgram`, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from tpudiag.model.compiled import (ArrayShape, CompiledProgram, ConvDims, DotDims, Instruction, window_factors,
                                    window_padding)
from tpudiag.model.hlo_shapes import Shape, operand_shapes, result_shapes

# Ops whose called computations run as part of the op itself (a while loop's body or a
# conditional's branches are ops of their own in a trace, so they are not followed).
_FOLLOWED = frozenset({"fusion", "call", "async-start", "custom-call"})
_MAX_DEPTH = 8  # nesting of fusions inside fusions; deeper is a damaged program
_MAX_WINDOW_CELLS = 1 << 16  # output positions x taps of one spatial dim enumerated to count real taps

_COST = re.compile(r'cost_estimate\\?"?\s*:\s*\{(?P<body>[^}]*)\}')
_FIELD = r'{}\\?"?\s*:\s*\\?"?(?P<v>[0-9.eE+]+)'  # a number, or one JSON quotes (int64 as proto JSON writes it)


@dataclass(frozen=True)
class Matmul:
    """One matmul: `batch` independent [M, K] x [K, N] products.

    `m_dims`, `n_dims`, `k_dims` and `batch_dims` are the operand dims that make up each product
    (a K of 1024 may be 8 x 128); `feeds` are the indices of the op's outputs (its result tuple's
    elements; (0,) for an array result) that this matmul's value reaches.
    """

    instruction: str
    computation: str
    opcode: str  # dot, convolution or custom-call
    m_dims: tuple[int, ...]
    n_dims: tuple[int, ...]
    k_dims: tuple[int, ...]
    batch_dims: tuple[int, ...]
    lhs_dtype: str
    rhs_dtype: str
    result_dtype: str  # the accumulation type the instruction writes (preferred_element_type)
    basis: str  # dot_dimension_numbers, dim_labels or operand shapes
    feeds: tuple[int, ...] = (0,)
    op_name: str = ""  # the JAX op name of the instruction, '' when the program has none

    @property
    def m(self) -> int:
        return math.prod(self.m_dims)

    @property
    def n(self) -> int:
        return math.prod(self.n_dims)

    @property
    def k(self) -> int:
        return math.prod(self.k_dims)

    @property
    def batch(self) -> int:
        return math.prod(self.batch_dims)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def describe(self) -> str:
        """`convolution.55: bf16 x bf16 -> bf16, M 512, N 256, K 1024 (8x128)` for messages."""
        def part(label: str, dims: tuple[int, ...]) -> str:
            total = math.prod(dims)
            return f"{label} {total}" + (f" ({'x'.join(map(str, dims))})" if len(dims) > 1 else "")
        sizes = [part("M", self.m_dims), part("N", self.n_dims), part("K", self.k_dims)]
        if self.batch > 1:
            sizes.insert(0, part("batch", self.batch_dims))
        return (f"{self.instruction}: {self.lhs_dtype} x {self.rhs_dtype} -> {self.result_dtype}, "
                + ", ".join(sizes))


@dataclass(frozen=True)
class OpMath:
    """The math of one op (an instruction a trace times): its matmuls and a declared FLOP count."""

    op: str
    opcode: str
    matmuls: tuple[Matmul, ...]
    declared_flops: float | None = None  # a custom call's `cost_estimate`; None when it declares none
    declared_bytes: float | None = None
    # Collectives the op runs inside itself (v5e's async collective fusions carry an all-gather
    # beside the matmul): the op's time is shared with them.
    collectives: tuple[str, ...] = ()

    @cached_property
    def main(self) -> Matmul | None:
        """The matmul doing most of the op's FLOPs (first in program order on a tie)."""
        return max(self.matmuls, key=lambda mm: mm.flops, default=None)

    @property
    def matmul_flops(self) -> int:
        return sum(mm.flops for mm in self.matmuls)


def cost_estimate(backend_config: str) -> tuple[float, float] | None:
    """(flops, bytes_accessed) a custom call declares in its backend_config, else None.

    JAX writes a Pallas kernel's `pl.CostEstimate` there as `"cost_estimate": {"flops": ...}`,
    with the quotes escaped when the config is itself a string in HLO text.
    """
    m = _COST.search(backend_config or "")
    if m is None:
        return None
    body = m.group("body")
    flops = re.search(_FIELD.format("flops"), body)
    nbytes = re.search(_FIELD.format("bytes_accessed"), body)
    if flops is None:
        return None
    return float(flops.group("v")), float(nbytes.group("v")) if nbytes else 0.0


def matmul_from_shapes(result: tuple[int, ...], lhs: tuple[int, ...], rhs: tuple[int, ...]
                       ) -> tuple[tuple[int, ...], int, int, int] | None:
    """(batch dims, M, N, K) when `lhs x rhs -> result` composes as a (batched) matmul, else None.

    Rank 2 (`[M,K] x [K,N] -> [M,N]`) or rank 3 with one leading batch dim shared by all three;
    either operand may be stored transposed. An ambiguous square case reads lhs as [M,K].
    """
    if not len(result) == len(lhs) == len(rhs) or len(result) not in (2, 3):
        return None
    batch = result[:-2]
    if lhs[:-2] != batch or rhs[:-2] != batch:
        return None
    (m, n), a, b = result[-2:], lhs[-2:], rhs[-2:]
    k = a[1] if a[0] == m else a[0] if a[1] == m else None
    if k is None or b not in ((k, n), (n, k)):
        return None
    return batch, m, n, k


@dataclass(frozen=True)
class _Where:
    name: str
    computation: str = ""
    op_name: str = ""


def _dim_list(text: str | None) -> tuple[int, ...]:
    """`{0,2}` -> (0, 2)."""
    return tuple(int(d) for d in (text or "").strip("{} ").split(",") if d.strip().isdigit())


def _int(text: str | None, default: int) -> int:
    try:
        return int(str(text).strip().strip('"'))
    except ValueError:
        return default


def _spatial(labels: str) -> tuple[int, ...]:
    """Positions of the spatial dims `0`, `1`, ... in one part of `dim_labels`, in spatial order."""
    digits = sorted((int(ch), pos) for pos, ch in enumerate(labels) if ch.isdigit())
    return tuple(pos for _, pos in digits)


_WINDOW_SIZE = re.compile(r"\bsize=(\d+(?:x\d+)*)")
_LHS_DILATE = re.compile(r"\blhs_dilate=(\d+(?:x\d+)*)")
_RHS_DILATE = re.compile(r"\brhs_dilate=(\d+(?:x\d+)*)")
_STRIDE = re.compile(r"\bstride=(\d+(?:x\d+)*)")
_PAD = re.compile(r"\bpad=(-?\d+_-?\d+(?:x-?\d+_-?\d+)*)")


def _factors(pattern: re.Pattern, window: str) -> tuple[int, ...]:
    """`lhs_dilate=7x1` -> (7, 1); () when absent or all 1 (`window_factors`)."""
    found = pattern.search(window)
    return window_factors(tuple(int(x) for x in found.group(1).split("x")) if found else ())


def _pads(window: str) -> tuple[tuple[int, int], ...]:
    """`pad=7_7x1_1` -> ((7, 7), (1, 1)); () when absent or all 0 (`window_padding`)."""
    found = _PAD.search(window)
    pads = tuple((int(lo), int(hi)) for lo, hi in (d.split("_") for d in found.group(1).split("x"))) if found else ()
    return window_padding(pads)


def contraction_from_attributes(opcode: str, attrs: Mapping[str, str]) -> DotDims | ConvDims | None:
    """A dot's `lhs_contracting_dims={1}, ...` or a convolution's `dim_labels=` and `window=`, as HLO
    text prints them. A malformed attribute leaves the contraction unknown (None): the
    instruction's other facts are still good."""
    if opcode == "dot":
        return DotDims(_dim_list(attrs.get("lhs_contracting_dims")), _dim_list(attrs.get("rhs_contracting_dims")),
                       _dim_list(attrs.get("lhs_batch_dims")), _dim_list(attrs.get("rhs_batch_dims")))
    if opcode != "convolution" or "dim_labels" not in attrs:
        return None
    try:
        lhs, rest = attrs["dim_labels"].split("_", 1)
        rhs, out = rest.split("->", 1)
        window_text = attrs.get("window", "")
        window = _WINDOW_SIZE.search(window_text)
        return ConvDims(
            input_batch=lhs.index("b"), input_feature=lhs.index("f"), input_spatial=_spatial(lhs),
            kernel_input_feature=rhs.index("i"), kernel_output_feature=rhs.index("o"), kernel_spatial=_spatial(rhs),
            output_batch=out.index("b"), output_feature=out.index("f"), output_spatial=_spatial(out),
            window=tuple(int(x) for x in window.group(1).split("x")) if window else (),
            feature_group_count=_int(attrs.get("feature_group_count"), 1),
            batch_group_count=_int(attrs.get("batch_group_count"), 1),
            lhs_dilation=_factors(_LHS_DILATE, window_text), stride=_factors(_STRIDE, window_text),
            padding=_pads(window_text), rhs_dilation=_factors(_RHS_DILATE, window_text))
    except ValueError:
        return None


def _array(program: CompiledProgram, computation: str, name: str) -> ArrayShape | None:
    inst = program.instructions.get((computation, name))
    shape = inst.shape if inst is not None else None
    return shape if isinstance(shape, ArrayShape) else None


def _dot(at: _Where, dims: DotDims, lhs: ArrayShape | Shape, rhs: ArrayShape | Shape,
         out: ArrayShape | Shape) -> Matmul | None:
    used_l = set(dims.lhs_contracting) | set(dims.lhs_batch)
    used_r = set(dims.rhs_contracting) | set(dims.rhs_batch)
    if not used_l <= set(range(len(lhs.dims))) or not used_r <= set(range(len(rhs.dims))):
        return None
    return Matmul(
        instruction=at.name, computation=at.computation, opcode="dot",
        m_dims=tuple(d for i, d in enumerate(lhs.dims) if i not in used_l) or (1,),
        n_dims=tuple(d for i, d in enumerate(rhs.dims) if i not in used_r) or (1,),
        k_dims=tuple(lhs.dims[i] for i in dims.lhs_contracting) or (1,),
        batch_dims=tuple(lhs.dims[i] for i in dims.lhs_batch) or (1,),
        lhs_dtype=lhs.dtype, rhs_dtype=rhs.dtype, result_dtype=out.dtype, basis="dot_dimension_numbers",
        op_name=at.op_name)


def real_taps(o: int, in_size: int, window: int, stride: int, pad_low: int, lhs_dilation: int,
              rhs_dilation: int) -> list[int]:
    """The kernel taps of output position `o` (one spatial dim) that read a real input element.

    Tap t reads position o x stride + t x rhs_dilation - pad_low of the lhs-dilated input, which is
    real when it falls on one of its `in_size` elements (every `lhs_dilation`-th position), else
    padding or a dilation hole. `_window_taps` and `model.hlo_cost`'s FLOP count both read taps so.
    """
    last = (in_size - 1) * lhs_dilation
    return [t for t in range(window)
            if 0 <= (p := o * stride + t * rhs_dilation - pad_low) <= last and p % lhs_dilation == 0]


def _window_taps(in_size: int, window: int, out_size: int, stride: int, pad_low: int, lhs_dilation: int,
                 rhs_dilation: int) -> tuple[int, bool]:
    """(the most taps any output position sees land on real input, whether each output position sees
    exactly one and no two see the same tap) for one spatial dim of a convolution.

    Tap t of output o reads position o x stride + t x rhs_dilation - pad_low of the lhs-dilated
    input, which is real when it falls on one of its `in_size` elements (every `lhs_dilation`-th
    position), else padding or a dilation hole. XLA writes the batch dims of a batched dot as such
    windows (`size=8x2 stride=8x2 pad=7_7x1_1 lhs_dilate=7x1`): each output then pairs one input
    element with its own kernel tap.
    """
    if out_size * window > _MAX_WINDOW_CELLS:  # too large to enumerate: every tap counts
        return window, False
    taps = [real_taps(o, in_size, window, stride, pad_low, lhs_dilation, rhs_dilation) for o in range(out_size)]
    one_each = out_size > 1 and all(len(ts) == 1 for ts in taps) and len({ts[0] for ts in taps}) == out_size
    return max((len(ts) for ts in taps), default=0), one_each


def _convolution(at: _Where, dims: ConvDims, lhs: ArrayShape | Shape, rhs: ArrayShape | Shape,
                 out: ArrayShape | Shape) -> Matmul | None:
    """Per spatial dim: a window where each output position reads one real input element with a
    tap of its own (`_window_taps`; XLA's form of a batched dot) is a batch dim; otherwise its
    output positions are rows (M) and the most taps that land on real input, not on padding or
    dilation holes, contract (K)."""
    try:
        groups = max(1, dims.feature_group_count) * max(1, dims.batch_group_count)
        m_dims, k_dims = [out.dims[dims.output_batch]], [rhs.dims[dims.kernel_input_feature]]
        batch_dims = [groups] if groups > 1 else []
        for i, (s, o, k) in enumerate(zip(dims.input_spatial, dims.output_spatial, dims.kernel_spatial)):
            taps, one_each = _window_taps(
                lhs.dims[s], rhs.dims[k], out.dims[o], _at(dims.stride, i, 1), _at(dims.padding, i, (0, 0))[0],
                max(1, _at(dims.lhs_dilation, i, 1)), max(1, _at(dims.rhs_dilation, i, 1)))
            if one_each:
                batch_dims.append(out.dims[o])
            else:
                m_dims.append(out.dims[o])
                k_dims.append(taps)
        n_total = out.dims[dims.output_feature]
    except IndexError:
        return None
    return Matmul(
        instruction=at.name, computation=at.computation, opcode="convolution",
        m_dims=tuple(d for d in m_dims if d != 1) or (1,), n_dims=(max(1, n_total // groups),),
        k_dims=tuple(d for d in k_dims if d != 1) or (1,), batch_dims=tuple(d for d in batch_dims if d != 1) or (1,),
        lhs_dtype=lhs.dtype, rhs_dtype=rhs.dtype, result_dtype=out.dtype, basis="dim_labels",
        op_name=at.op_name)


def _at(values: tuple, i: int, default):
    """Per-dim attribute `i`, or its default when the dump states none (an empty tuple)."""
    return values[i] if i < len(values) else default


def _custom_call(inst: Instruction, operands: list[ArrayShape | None]) -> Matmul | None:
    out = inst.shape if isinstance(inst.shape, ArrayShape) else None
    arrays = [a for a in operands if a is not None]
    if out is None or len(arrays) != 2 or len(operands) != 2:
        return None
    found = matmul_from_shapes(out.dims, arrays[0].dims, arrays[1].dims)
    if found is None:
        return None
    batch, m, n, k = found
    return Matmul(
        instruction=inst.name, computation=inst.computation, opcode="custom-call", m_dims=(m,), n_dims=(n,),
        k_dims=(k,), batch_dims=batch or (1,), lhs_dtype=arrays[0].dtype, rhs_dtype=arrays[1].dtype,
        result_dtype=out.dtype, basis="operand shapes", op_name=inst.op_name)


def instruction_matmul(program: CompiledProgram, inst: Instruction) -> Matmul | None:
    """The matmul one dot, convolution or matmul-shaped custom call does; None for anything else."""
    operands = [_array(program, inst.computation, o) for o in inst.operands]
    if inst.opcode == "custom-call":
        return _custom_call(inst, operands)
    out = inst.shape if isinstance(inst.shape, ArrayShape) else None
    if inst.contraction is None or out is None or len(operands) < 2 or None in operands[:2]:
        return None
    lhs, rhs = operands[0], operands[1]
    at = _Where(inst.name, inst.computation, inst.op_name)
    if isinstance(inst.contraction, DotDims):
        return _dot(at, inst.contraction, lhs, rhs, out)
    return _convolution(at, inst.contraction, lhs, rhs, out)


def _feeds(program: CompiledProgram, computation: str) -> dict[str, tuple[int, ...]]:
    """Per instruction of `computation`, the indices of the root's outputs its value reaches."""
    comp = program.computations.get(computation)
    if comp is None:
        return {}
    root = program.instructions.get((computation, comp.root))
    if root is None:
        return {}
    outputs = list(root.operands) if root.opcode == "tuple" else [root.name]
    reach: dict[str, set[int]] = {}
    for index, start in enumerate(outputs):
        stack = [start]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            reach.setdefault(name, set()).add(index)
            inst = program.instructions.get((computation, name))
            if inst is not None:
                stack.extend(inst.operands)
    return {name: tuple(sorted(idx)) for name, idx in reach.items()}


def _inside(program: CompiledProgram, computation: str, depth: int) -> list[Matmul]:
    """The matmuls of one called computation, each with the outputs of that computation it feeds."""
    if depth > _MAX_DEPTH or computation not in program.computations:
        return []
    feeds = _feeds(program, computation)
    found: list[Matmul] = []
    for inst in program.computation_instructions(computation):
        own = _matmuls_of(program, inst, depth + 1)
        reach = feeds.get(inst.name, ())
        found.extend(dataclasses.replace(mm, feeds=reach) for mm in own)
    return found


def _matmuls_of(program: CompiledProgram, inst: Instruction, depth: int) -> list[Matmul]:
    if inst.opcode in ("dot", "convolution") or inst.opcode == "custom-call" and not inst.called_computations:
        mm = instruction_matmul(program, inst)
        return [mm] if mm is not None else []
    if inst.opcode not in _FOLLOWED:
        return []
    found: list[Matmul] = []
    for callee in inst.called_computations:
        found.extend(_inside(program, callee, depth))
    return found


def _collectives_inside(program: CompiledProgram, inst: Instruction) -> tuple[str, ...]:
    found: list[str] = []
    todo = list(inst.called_computations) if inst.opcode in _FOLLOWED else []
    seen: set[str] = set()
    while todo and len(seen) <= _MAX_DEPTH * 64:
        comp = todo.pop(0)
        if comp in seen or comp not in program.computations:
            continue
        seen.add(comp)
        for inner in program.computation_instructions(comp):
            if inner.collective_family and not inner.is_continuation:
                found.append(inner.name)  # a collective fusion is one collective: its step inside is not another
            elif inner.opcode in _FOLLOWED:
                todo.extend(inner.called_computations)
    return tuple(found)


def op_math(program: CompiledProgram, inst: Instruction) -> OpMath:
    """The matmuls of one op and what it declares; `feeds` index the op's own outputs."""
    matmuls = _matmuls_of(program, inst, 0)  # a dot's, convolution's or kernel's own matmul feeds its output (0,)
    declared = cost_estimate(inst.backend_config) if inst.opcode == "custom-call" else None
    return OpMath(op=inst.name, opcode=inst.opcode, matmuls=tuple(matmuls),
                  declared_flops=declared[0] if declared else None,
                  declared_bytes=declared[1] if declared else None, collectives=_collectives_inside(program, inst))


_TEXT_OPCODE = re.compile(r"\s(?P<op>[a-z][\w\-]*)\(")
_TEXT_ATTR = re.compile(r"\b(?P<k>[a-z_]+)=(?P<v>\{[^}]*\}|[^,\s]+)")


def op_math_from_text(name: str, hlo_text: str) -> OpMath | None:
    """An op's math from its own instruction line, as a trace's op metadata gives it (no program).

    A `dot` or `convolution` line is read like a program's instruction. A fusion or custom call
    shows only its operands, so it counts as one matmul only when exactly two operand arrays and
    its result compose as `[B,]M,K x [B,]K,N -> [B,]M,N` (basis `operand shapes`); otherwise None:
    nothing is said about dims the text does not show.
    """
    if not hlo_text or "=" not in hlo_text:
        return None
    m = _TEXT_OPCODE.search(hlo_text.split("=", 1)[1])
    if m is None:
        return None
    opcode = m.group("op")
    results, operands = result_shapes(hlo_text), operand_shapes(hlo_text)
    declared = cost_estimate(hlo_text) if opcode == "custom-call" else None
    mm = None
    if len(results) == 1 and len(operands) >= 2:
        at = _Where(name)
        if opcode in ("dot", "convolution"):
            attrs = {a.group("k"): a.group("v") for a in _TEXT_ATTR.finditer(hlo_text)}
            dims = contraction_from_attributes(opcode, attrs)
            if isinstance(dims, DotDims):
                mm = _dot(at, dims, operands[0], operands[1], results[0])
            elif isinstance(dims, ConvDims):
                mm = _convolution(at, dims, operands[0], operands[1], results[0])
        elif len(operands) == 2:
            found = matmul_from_shapes(results[0].dims, operands[0].dims, operands[1].dims)
            if found is not None:
                batch, mdim, ndim, kdim = found
                mm = Matmul(instruction=name, computation="", opcode=opcode, m_dims=(mdim,), n_dims=(ndim,),
                            k_dims=(kdim,), batch_dims=batch or (1,), lhs_dtype=operands[0].dtype,
                            rhs_dtype=operands[1].dtype, result_dtype=results[0].dtype, basis="operand shapes")
    if mm is None and declared is None:
        return None
    return OpMath(op=name, opcode=opcode, matmuls=(mm,) if mm is not None else (),
                  declared_flops=declared[0] if declared else None, declared_bytes=declared[1] if declared else None)


class ProgramMath:
    """`OpMath` by op name for one program, worked out on first use (a program has thousands of ops
    and a rule asks about a few)."""

    def __init__(self, program: CompiledProgram):
        self.program = program
        self._cache: dict[str, OpMath | None] = {}

    def __contains__(self, name: str) -> bool:
        return self.program.find(name) is not None

    def get(self, name: str) -> OpMath | None:
        """The op's math; None when the program has no instruction of that name."""
        if name not in self._cache:
            inst = self.program.find(name)
            self._cache[name] = op_math(self.program, inst) if inst is not None else None
        return self._cache[name]
