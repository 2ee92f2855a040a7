"""An HLO op's FLOPs and bytes as XProf counts them for GPU kernels, from the compiled program.

A GPU trace carries no per-op FLOPs or bytes: XProf gets them from XLA's cost analysis of the
program the capture embeds (`/host:metadata`), per HLO op, and charges them to every kernel the op
launches. What this module reproduces, checked against `xprof get_hlo_stats` on real GPU captures
(`tests/parsers/test_gpu_captures.py`):

- bytes: the op's operands plus its result (a tuple's arrays); a convolution custom call
  (`__cudnn$conv...`) counts its result array, not the scratch buffer beside it in the tuple;
  other custom calls (cuBLAS, Transformer Engine, ...) count nothing, as XProf's analysis gives
  them no cost;
- FLOPs: 2 per multiply-add of every dot and convolution the op runs (inside its fusion), a
  convolution counting only the kernel taps that land on real input (not padding), as XLA's
  `HloCostAnalysis` does.

Not reproduced, and documented in `docs/xprof-differences.md`: the FLOPs XProf adds for
elementwise work (XLA's GPU analysis charges each elementwise instruction per-element costs from
per-device op profiles), so an elementwise fusion's FLOP rate here is 0 where XProf shows a small
number; bytes, and so GiB/s, agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model.compiled import ArrayShape, CompiledProgram, ConvDims, Instruction, leaf_arrays
from tpudiag.model.matmuls import op_math, real_taps

_CONV_TARGET = "__cudnn$conv"  # cuDNN and MIOpen convolution custom calls: __cudnn$convForward, ...
_MAX_DEPTH = 8


@dataclass(frozen=True)
class OpCost:
    flops: float  # per occurrence
    bytes_accessed: float  # per occurrence
    category: str  # XProf's category on GPU: `loop fusion`, `input fusion`, `custom-call`, ...


def gpu_category(inst: Instruction) -> str:
    """XProf's category of a GPU op: `<kind> fusion` from the fusion kind, else the opcode."""
    if inst.opcode == "fusion":
        kind = {"kLoop": "loop", "kInput": "input", "kOutput": "output", "kCustom": "custom"}.get(inst.fusion_kind)
        return f"{kind} fusion" if kind else "fusion"
    return inst.opcode


def _operand_bytes(program: CompiledProgram, inst: Instruction) -> int:
    total = 0
    for name in inst.operands:
        operand = program.instructions.get((inst.computation, name))
        if operand is not None:
            total += operand.logical_bytes
    return total


def _taps(in_size: int, window: int, out_size: int, stride: int, pad_low: int, lhs_dilation: int,
          rhs_dilation: int) -> int:
    """(output position, kernel tap) pairs of one spatial dim that read real input, not padding."""
    return sum(len(real_taps(o, in_size, window, stride, pad_low, lhs_dilation, rhs_dilation))
               for o in range(out_size))


def convolution_flops(dims: ConvDims, lhs: ArrayShape, rhs: ArrayShape, out: ArrayShape) -> float:
    """XLA's count: 2 x input features per group x output features x batch x, per spatial dim,
    the (output, tap) pairs that read real input."""
    def at(values: tuple, i: int, default):
        return values[i] if i < len(values) else default

    groups = max(1, dims.feature_group_count)
    in_features = lhs.dims[dims.input_feature] // groups
    valid = 1
    for i, (s, o, k) in enumerate(zip(dims.input_spatial, dims.output_spatial, dims.kernel_spatial)):
        if lhs.dims[s] * rhs.dims[k] > 1 << 22:  # too many pairs to walk: every tap counts
            valid *= out.dims[o] * rhs.dims[k]
            continue
        valid *= _taps(lhs.dims[s], rhs.dims[k], out.dims[o], at(dims.stride, i, 1), at(dims.padding, i, (0, 0))[0],
                       max(1, at(dims.lhs_dilation, i, 1)), max(1, at(dims.rhs_dilation, i, 1)))
    batch = out.dims[dims.output_batch] // max(1, dims.batch_group_count)
    return 2.0 * in_features * out.dims[dims.output_feature] * batch * valid


def _array_operands(program: CompiledProgram, inst: Instruction) -> list[ArrayShape | None]:
    out = []
    for name in inst.operands:
        operand = program.instructions.get((inst.computation, name))
        out.append(operand.shape if operand is not None and isinstance(operand.shape, ArrayShape) else None)
    return out


def _conv_flops(program: CompiledProgram, inst: Instruction, result: ArrayShape | None) -> float:
    operands = _array_operands(program, inst)
    if not isinstance(inst.contraction, ConvDims) or result is None or len(operands) < 2 or None in operands[:2]:
        return 0.0
    try:
        return convolution_flops(inst.contraction, operands[0], operands[1], result)
    except IndexError:  # dimension numbers that do not fit the shapes: a damaged program
        return 0.0


def _flops_inside(program: CompiledProgram, computation: str, depth: int) -> float:
    if depth > _MAX_DEPTH or computation not in program.computations:
        return 0.0
    total = 0.0
    for sub in program.computation_instructions(computation):
        total += _own_flops(program, sub, depth)
    return total


def _own_flops(program: CompiledProgram, inst: Instruction, depth: int) -> float:
    if inst.opcode == "convolution":
        return _conv_flops(program, inst, inst.shape if isinstance(inst.shape, ArrayShape) else None)
    if inst.opcode == "dot":
        return float(sum(mm.flops for mm in op_math(program, inst).matmuls))
    if inst.opcode in ("fusion", "call"):
        return sum(_flops_inside(program, c, depth + 1) for c in inst.called_computations)
    return 0.0


def gpu_op_cost(program: CompiledProgram, inst: Instruction) -> OpCost:
    """The op's FLOPs and bytes per occurrence, as XProf charges each of its kernels."""
    category = gpu_category(inst)
    if inst.opcode == "custom-call":
        if not inst.custom_call_target.startswith(_CONV_TARGET) or inst.shape is None:
            return OpCost(0.0, 0.0, category)
        arrays = leaf_arrays(inst.shape)
        result = arrays[0] if arrays else None
        return OpCost(_conv_flops(program, inst, result),
                      float(_operand_bytes(program, inst) + (result.logical_bytes if result else 0)), category)
    flops = _own_flops(program, inst, 0)
    return OpCost(flops, float(_operand_bytes(program, inst) + inst.logical_bytes), category)


__all__ = ["OpCost", "convolution_flops", "gpu_category", "gpu_op_cost"]
