"""What a profiled op is, as far as the lab needs: kernel family, problem shapes, dtypes, basis.

Pure inference over the capture's op tables and the op's instructions (no jax): every family but
collective reads opcodes and attributes from `model.compiled.Instruction`s (the dump's own, or the
capture's op text read by the dump parser); collective still reads the HLO text (`collective_spec`). Every inferred fact records how
it was inferred (`basis`), because a profile often carries only the output shape: a matmul's K then
comes from its FLOP count, an elementwise fusion's input count from its bytes.

Family rules, first match wins:

1. all-gather, reduce-scatter, all-reduce (async start/done included) -> collective, with the ring
   from the replica groups (`collective_spec`); other collectives, while loops, custom calls -> not
   reproducible (one-line reason); tuple outputs -> multi_output; a copy into the column-major
   layout {0,1} -> transpose;
2. a `dot`/`convolution` instruction (the op or in its fused computation), or the category
   `convolution fusion` -> matmul;
3. a `reduce` instruction -> column reduction when it reduces dims before the minor one, else row
   reduction (sum);
4. a `loop fusion` whose framework op name says softmax / layer norm / rms norm -> that reduction
   (the capture's HLO text for loop fusions often omits the body);
5. `loop fusion`, `copy`, elementwise categories -> elementwise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

from tpudiag.analysis.ops import BoundBy
from tpudiag.errors import InputError, UsageError
from tpudiag.kernels_lab import op_text
from tpudiag.kernels_lab.problems import AnyProblem, collective, pallas, problem_fields, problem_from_fields
from tpudiag.model.hardware import CHIPS, chip_for, smallest_topology
from tpudiag.model.hlo_shapes import Shape, parse_array, parse_shapes
from tpudiag.model.kernels import MosaicKernel
from tpudiag.model.matmuls import Matmul, OpMath, ProgramMath, cost_estimate, op_math_from_text
from tpudiag.kernels_lab.collective_spec import KINDS as COLLECTIVE_KINDS
from tpudiag.kernels_lab.collective_spec import gathered_dim, kind_of, mesh_axes, replica_groups
from tpudiag.model.compiled import CompiledProgram, Instruction
from tpudiag.model.hlo_names import collective_family
from tpudiag.model.profile import Platform
from tpudiag.model.units import jnp_dtypes
from tpudiag.model.inputs import CompiledInputs

if TYPE_CHECKING:
    from tpudiag.analysis.profile_analysis import Analysis
    from tpudiag.pipeline import Diagnosis


class NotReproducible(UsageError):
    """The op exists but no kernel family reproduces it yet; the message says why."""


HLO_DTYPES = jnp_dtypes("bf16", "f32")  # the float types the compute families take
MATMUL_CATEGORIES = ("convolution fusion", "convolution", "dot", "output fusion")
MATMUL_OPCODES = frozenset({"dot", "convolution"})
ELEMENTWISE_CATEGORIES = ("loop fusion", "copy", "non-fusion elementwise", "data formatting")
REDUCTION_HINTS = (("softmax", "softmax"), ("layer_norm", "layernorm"), ("layernorm", "layernorm"),
                   ("rms_norm", "rmsnorm"), ("rmsnorm", "rmsnorm"))

# Smallest single-host topology per generation; the lab compiles against one device of it.
DEFAULT_TOPOLOGY = {c.generation: smallest_topology(c) for c in CHIPS}


# Arrays read from HLO text: the one reader rules and the op math use too (`model.hlo_shapes`).
ArrayText = Shape


def topology_generation(topology: str) -> str:
    """`v6e:2x2` -> `v6e` (the canonical generation name of tpudiag.model.hardware)."""
    prefix = re.split(r"[:=_]", topology, maxsplit=1)[0]
    chip = chip_for(prefix)
    if chip is None:
        raise UsageError(f"unknown TPU generation in topology {topology!r}",
                         hint="use a libtpu topology name such as `v5e:2x2`, `v5p:2x2x1` or `v6e:2x2`")
    return chip.generation


@dataclass(frozen=True)
class OpSpec:
    """Everything `spec.json` holds; `problem` (the op as profiled) and `run_problem` (what the CPU
    runs) are the family's typed Problem (`kernels_lab.problems`)."""

    op_name: str
    category: str
    program: str
    family: str
    problem: AnyProblem
    run_problem: AnyProblem
    scale_down: int
    shape_with_layout: str
    operands: tuple[str, ...]
    hlo_text: str
    tf_op: str
    source: str
    basis: tuple[str, ...]
    device_type: str
    generation: str
    topology: str
    vmem_bytes: int
    hbm_bytes_per_s: float
    clock_hz: float | None
    occurrences: int
    measured_time_ps: float | None  # per occurrence, from the capture
    flops: float  # per occurrence, from the capture
    bytes_accessed: float  # per occurrence, from the capture
    capture: str
    notes: tuple[str, ...] = field(default=())
    # How the capture timed the op: "measured" (a real capture) or "modelled" (`simulate`, static mode).
    captured_basis: str = "measured"

    @property
    def left_out(self) -> tuple[str, ...]:
        """What the reproduction does not do that the op does (fused collectives and aliased outputs
        carried untouched, epilogues and relayouts not reproduced), from its basis lines; for the
        user's own Pallas kernel, what its repro.py leaves out of the captured call."""
        if self.family == "pallas":
            return pallas.LEFT_OUT
        return tuple(line for line in self.basis if _LEFT_OUT.search(line))

    def to_json(self) -> str:
        """The spec as `spec.json`: a flat object whose `problem` and `run_problem` are the Problem's
        fields (every field, tuples as lists), as `repro.py` passes them to `Problem(**...)`."""
        data = asdict(self)
        data.update(problem=problem_fields(self.problem), run_problem=problem_fields(self.run_problem))
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, path: Path) -> OpSpec:
        """Read `spec.json`. Problems written by earlier versions (fields at their defaults left out)
        load as they are; anything this version cannot read is one InputError naming the file."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the reproduction's spec: {exc}", path=path) from exc
        if not isinstance(data, dict):
            raise InputError("spec.json is not a JSON object", path=path)
        for key in ("basis", "operands", "notes"):
            data[key] = tuple(data.get(key, ()))
        try:
            for key in ("problem", "run_problem"):
                if not isinstance(data.get(key), dict):
                    raise ValueError(f"`{key}` is not an object")
                data[key] = problem_from_fields(str(data.get("family")), data[key])
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise InputError(f"spec.json does not match this tpudiag version: {exc}", path=path,
                             hint="re-run `tpudiag lab extract` to regenerate it") from None


def _jnp_dtype(hlo_dtype: str, what: str, name: str) -> str:
    if hlo_dtype not in HLO_DTYPES:
        raise NotReproducible(f"`{name}` has {what} dtype {hlo_dtype}; the lab's kernels take "
                              f"{' or '.join(HLO_DTYPES)} only")
    return HLO_DTYPES[hlo_dtype]


def _rows_cols(a: ArrayText) -> tuple[int, int]:
    """Collapse leading dims (row-major layout) into rows; the minor dim is cols."""
    if len(a.dims) == 1:
        return 1, a.dims[0]
    return math.prod(a.dims[:-1]), a.dims[-1]


# Observed on a 2-core VM (jax 0.10.2): the TPU-semantics interpreter hangs on a ring whose buffers
# reach 64 KiB: one simulated device's thread waits in `_allocate_buffer` for an array computed in
# the graph while the others wait on semaphores, holding XLA's CPU thread pool (one thread per core);
# 32 KiB buffers run. The CPU run of a collective therefore keeps its largest buffer at 32 KiB.
CPU_COLLECTIVE_BUFFER_BYTES = 32 << 10


def cpu_problem(problem: AnyProblem, factor: int) -> tuple[AnyProblem, list[str]]:
    """The problem the CPU interpreter runs (scaled down by `factor`), and notes when it was capped."""
    q = problem.scaled(factor)
    if not isinstance(q, collective.Problem):
        return q, []
    cols = min(q.cols, 128 if q.cols % 128 == 0 else 130)
    # the biggest buffer: n chunks in f32 (the reduce's receive slots, or the gathered output)
    rows_cap = max(1, CPU_COLLECTIVE_BUFFER_BYTES // (q.devices * cols * 4))
    rows = q.rows if q.rows <= rows_cap else (rows_cap // 8 * 8 or rows_cap) + (q.rows % 8 != 0)
    if (rows, cols) == (q.rows, q.cols):
        return q, []
    return dataclasses.replace(q, rows=rows, cols=cols), [
        f"the CPU run's shard is capped at {rows}x{cols} (buffers <= 32 KiB): the TPU-semantics "
        "interpreter was seen to hang on larger rings on a 2-core machine; the full problem is what runs "
        "on a TPU and what `tune` compiles"]


def _batch_folded(main: Matmul) -> list[str]:
    """The basis line for a batched matmul reproduced as one: its batch joins M."""
    if main.batch == 1:
        return []
    return [f"its batch of {main.batch} is folded into M: the reproduction multiplies one [{main.batch}x{main.m}, "
            f"{main.k}] by one [{main.k}, {main.n}] where the op multiplies {main.batch} pairs (the same FLOPs and "
            f"output; the op reads {main.batch} right-hand sides, the reproduction one)"]


def _opcodes(*instructions: Instruction | None) -> set[str]:
    return {i.opcode for i in instructions if i is not None}


def _epilogue(called: tuple[Instruction, ...]) -> tuple[str, bool, list[str]]:
    """Activation and bias from a fused computation's instructions (none: none known)."""
    rules = (("gelu", ("tanh", "erf"), "tanh/erf"), ("silu", ("logistic",), "logistic"),
             ("relu", ("maximum",), "maximum"))
    opcodes = _opcodes(*called)
    activation, notes = "none", []
    for act, wanted, seen in rules:
        if opcodes.intersection(wanted):
            activation = act
            notes.append(f"activation {act}: {seen} in the fusion body")
            break
    bias = {"add", "broadcast"} <= opcodes
    if bias:
        notes.append("bias: an add of a broadcast in the fusion body")
    return activation, bias, notes


def infer(*, name: str, category: str, shape_with_layout: str, hlo_text: str, tf_op: str, flops: float,
          bytes_accessed: float, body: str = "", operands: list[ArrayText] | None = None,
          operands_from: str = "", chips: int = 0, op_math: OpMath | None = None,
          instructions: tuple[Instruction | None, tuple[Instruction, ...]] | None = None,
          kernel: MosaicKernel | None = None, backend_config: str = "") -> tuple[str, dict, list[str]]:
    """(family, problem fields, basis) for one op, or NotReproducible with the reason. `operands`
    (resolved by the caller) default to the shapes printed in `hlo_text` or the body's parameters;
    `chips` (the capture's chip count) is a collective's ring size when nothing else gives it;
    `op_math` is the op's matmul model (`model.matmuls`), whose K wins when its M and N are the output's;
    `instructions` (the op's instruction and its called computation's, from the program) default to
    `hlo_text` and `body` read by the dump parser; `kernel` is a Pallas custom call's kernel as its
    serialised body states it (`CompiledProgram.kernels`), `backend_config` its custom call's (the
    program's, where the capture's op text has none)."""
    if operands is None:
        found = op_text.from_text(hlo_text, lambda _name: "", body)
        operands, operands_from = list(found.operands), found.operands_from
    inst, called = instructions if instructions is not None else op_text.parsed(hlo_text, body)
    opcodes = _opcodes(inst, *called)
    cat = category.lower()
    family = collective_family(name, category)
    if family:
        return _infer_collective(name=name, family=family, category=category,
                                 shape_text=shape_with_layout or hlo_text.split("=", 1)[-1],
                                 text=hlo_text + "\n" + body, operands=operands, operands_from=operands_from,
                                 chips=chips)
    if "while" in cat or name.startswith("while") or _opcodes(inst) == {"while"}:
        raise NotReproducible(f"`{name}` is a while loop; its body's ops are reproducible one by one, "
                              "the loop is not")
    if "custom-call" in cat or _opcodes(inst) == {"custom-call"}:
        if kernel is not None:
            config = backend_config or (inst.backend_config if inst is not None else "")
            return _infer_pallas(name, kernel, config, operands, operands_from, shape_with_layout or hlo_text)
        if "custom_call_config" in backend_config:  # the body is there: jaxlib is what is missing
            raise NotReproducible(f"`{name}` is a Pallas kernel; reading its serialised body needs jaxlib's MLIR "
                                  "bindings (`pip install 'tpudiag[tpu]'`)")
        if inst is not None and inst.custom_call_target == "tpu_custom_call" or "tpu_custom_call" in hlo_text:
            raise NotReproducible(f"`{name}` is a Pallas kernel whose serialised body is not in the capture "
                                  "(a runtime's program drops it): pass the XLA dump of its compile with --dump")
        raise NotReproducible(f"`{name}` is a custom call (already a hand-written kernel)")
    shape_text = (shape_with_layout or hlo_text.split("=", 1)[-1]).strip()
    if shape_text.startswith("("):
        return _infer_tuple(name=name, category=category, shape_text=shape_text, flops=flops, operands=operands,
                            op_math=op_math, inst=inst, opcodes=opcodes)
    out = parse_array(shape_text)
    if out is not None and not out.dims:
        raise NotReproducible(f"`{name}` returns a scalar ({out.text}); nothing worth a kernel")
    if out is None or not out.dims:
        shown = shape_with_layout or "none"
        raise NotReproducible(f"`{name}` has no array output shape the lab can read (shape: {shown})")
    if 0 in out.dims:
        raise NotReproducible(f"`{name}` has an empty output ({out.text}): nothing to reproduce")
    is_copy = "copy" in cat or name.startswith("copy") or "copy" in opcodes
    if not out.row_major and len(out.dims) == 2 and out.minor_to_major == (0, 1) and is_copy:
        dtype = _jnp_dtype(out.dtype, "output", name)
        return "transpose", dict(rows=out.dims[0], cols=out.dims[1], dtype=dtype), [
            "family transpose: a copy into layout {0,1} (column-major) is physically a 2-D transpose; the "
            "reproduction writes x.T as a row-major array",
            f"output {out.text} from the capture's shape_with_layout; input assumed {out.dtype}"
            f"[{out.dims[0]},{out.dims[1]}]{{1,0}}"]
    moved = _infer_datamove(name=name, cat=cat, out=out, inst=inst, called=called, operands=operands,
                            operands_from=operands_from, is_copy=bool(is_copy))
    if moved is not None:
        return moved
    if not out.row_major:
        raise NotReproducible(f"`{name}` writes layout {{{','.join(map(str, out.minor_to_major))}}}; the lab "
                              "reproduces row-major outputs and 2-D copies into {0,1} only")
    out_dtype = _jnp_dtype(out.dtype, "output", name)
    # Masks and indices (pred, s32) among the operands are not the data: take the first float operand.
    float_operands = [a for a in operands if a.dtype in HLO_DTYPES]
    if operands and not float_operands:
        _jnp_dtype(operands[0].dtype, "operand", name)  # raises with the operand's dtype
    operands = float_operands
    in_dtype = HLO_DTYPES[operands[0].dtype] if operands else out_dtype
    basis = [f"output {out.text} from the capture's shape_with_layout"]
    basis.append(f"operand dtype {in_dtype} from {operands_from}" if operands else
                 f"operand dtype {in_dtype}: assumed equal to the output's (no operands in the HLO text)")
    rows, cols = _rows_cols(out)
    tf_lower = tf_op.lower()

    contracts = bool(opcodes & MATMUL_OPCODES)
    if contracts or cat in MATMUL_CATEGORIES:
        basis.insert(0, "family matmul: " + ("a dot/convolution in the HLO text" if contracts
                                              else f"category `{category}`"))
        m, n = rows, cols
        # The FLOP count is the robust source: operands of real fusions are often transposed
        # (dim_labels=fb_io->bf) or include non-dot inputs; the first operand is the fallback.
        k = None
        main = op_math.main if op_math is not None else None
        if main is not None and (main.batch * main.m, main.n) == (m, n):
            k = main.k
            basis.append(f"K={k} from the compiled HLO ({main.describe()})")
            basis += _batch_folded(main)
        if k is None and flops > 0 and m * n > 0:
            k_float = flops / (2.0 * m * n)
            if abs(k_float - round(k_float)) < 1e-6 * k_float and round(k_float) >= 1:
                k = int(round(k_float))
                basis.append(f"K={k} from flops / (2*M*N) = {flops:.4g} / (2*{m}*{n})")
        if k is None and operands and len(operands[0].dims) >= 2 and math.prod(operands[0].dims[:-1]) == m:
            k = operands[0].dims[-1]
            basis.append(f"K={k} from the first operand {operands[0].text} (no usable FLOP count)")
        if k is None:
            raise NotReproducible(f"`{name}` looks like a matmul but its contracting dim is unknown "
                                  "(no operands in the HLO text and no whole K from its FLOP count)")
        activation, bias, notes = _epilogue(called)
        basis += notes or [("epilogue: no activation or bias add of a broadcast in the fusion body"
                            if called else "epilogue: none known (no fusion body)")
                           + "; convert only if dtypes differ"]
        return "matmul", dict(m=m, k=k, n=n, in_dtype=in_dtype, out_dtype=out_dtype, bias=bias,
                              activation=activation), basis

    colsum = _non_minor_reduce(inst, called)
    if colsum is not None:
        operand, reduced, (outer, r_rows, r_cols) = colsum
        basis.insert(0, f"family reduction (colsum): a reduce over dims {list(reduced)} of {operand.text}, not its "
                        "minor dim")
        basis.append(f"x[{outer}, {r_rows}, {r_cols}] summed over the middle dim (outer = the dims before, cols = "
                     "the dims after the reduced ones); a sum is assumed for the reducer")
        return "reduction", dict(rows=r_rows, cols=r_cols, op="colsum", dtype=HLO_DTYPES.get(operand.dtype, in_dtype),
                                 out_dtype=out_dtype, outer=outer), basis

    if "reduce" in opcodes:
        basis.insert(0, "family reduction (row sum): a reduce in the HLO text")
        if operands:
            r_cols = operands[0].numel // max(1, out.numel)
            basis.append(f"reduced dim {r_cols} from the operand {operands[0].text}")
        else:
            in_bytes = bytes_accessed - out.numel * (2 if out_dtype == "bfloat16" else 4)
            r_cols = int(round(in_bytes / (out.numel * (2 if in_dtype == "bfloat16" else 4))))
            basis.append(f"reduced dim {r_cols} from bytes accessed minus the output's")
        if r_cols < 1:
            raise NotReproducible(f"`{name}` is a reduce whose input size is unknown")
        return "reduction", dict(rows=out.numel, cols=r_cols, op="sum", dtype=in_dtype, out_dtype=out_dtype), basis

    for needle, op in REDUCTION_HINTS:
        if needle in tf_lower and "fusion" in cat:
            basis.insert(0, f"family reduction ({op}): framework op `{tf_op}` names it (the HLO text "
                            "has no fusion body)")
            if op in ("layernorm", "rmsnorm"):
                basis.append("per-column scale" + (" and shift" if op == "layernorm" else "")
                             + " parameters assumed, as in a standard layer; eps 1e-6")
            return "reduction", dict(rows=rows, cols=cols, op=op, dtype=in_dtype, out_dtype=out_dtype), basis

    if cat in ELEMENTWISE_CATEGORIES or "fusion" in cat:
        basis.insert(0, f"family elementwise: category `{category}`")
        if operands:
            n_inputs = sum(1 for a in operands if a.numel == out.numel) or 1
            basis.append(f"{n_inputs} same-shaped inputs from the HLO operands")
        elif bytes_accessed > 0:
            out_b = out.numel * (2 if out_dtype == "bfloat16" else 4)
            n_inputs = int(round(bytes_accessed / out_b)) - 1
            basis.append(f"{max(1, min(8, n_inputs))} inputs from bytes accessed / output bytes - 1 = "
                         f"{bytes_accessed:.4g} / {out_b} - 1 (a stand-in body: weighted sum)")
        else:
            n_inputs = 1
            basis.append("1 input: no operands or byte count (a copy)")
        return "elementwise", dict(rows=rows, cols=cols, n_inputs=max(1, min(8, n_inputs)), dtype=in_dtype,
                                   out_dtype=out_dtype, activation=_epilogue(called)[0]), basis

    raise NotReproducible(f"`{name}` has category `{category}`, which no kernel family covers yet")


def _infer_pallas(name: str, kernel: MosaicKernel, backend_config: str, operands: list[ArrayText],
                  operands_from: str, shape_text: str) -> tuple[str, dict, list[str]]:
    """The pallas family: the user's own kernel, with the grid and blocks its body states."""
    declared = cost_estimate(backend_config)
    outs = [str(a) for a in parse_shapes(shape_text)] if shape_text else []
    basis = [f"family pallas: `{name}` is a Mosaic TPU custom call; its grid {kernel.grid_text}, blocks and "
             "dimension semantics are read from its serialised kernel (MLIR, `custom_call_config.body`)",
             f"operands from {operands_from or 'none known'}"]
    if kernel.source_file:
        basis.append(f"kernel `{kernel.name}` at {kernel.source_text} (the body's source locations)")
    basis.append(f"FLOPs and bytes as the kernel declares them (`pl.CostEstimate`): {declared[0]:.4g} FLOPs, "
                 f"{declared[1]:.4g} bytes" if declared is not None else
                 "the kernel declares no `pl.CostEstimate`: its FLOPs and bytes are unknown to XLA")
    return "pallas", dict(kernel=kernel, operands=tuple(str(a) for a in operands), outputs=tuple(outs),
                          declared_flops=int(declared[0]) if declared else 0,
                          declared_bytes=int(declared[1]) if declared else 0), basis


def _non_minor_reduce(inst: Instruction | None, called: tuple[Instruction, ...]
                      ) -> tuple[ArrayText, tuple[int, ...], tuple[int, int, int]] | None:
    """(operand, reduced dims, (outer, rows, cols)) for the first array-shaped reduce (the op, else in
    its fused computation) when it reduces contiguous dims that exclude its operand's minor dim and
    that operand is an instruction of the fused computation; None otherwise."""
    reduce = next((i for i in (inst, *called) if i is not None and i.opcode == "reduce" and i.operands
                   and parse_array(i.shape_text) is not None), None)
    if reduce is None:
        return None
    source = next((i for i in called if i.name == reduce.operands[0]), None)
    operand = parse_array(source.shape_text) if source is not None else None
    dims = tuple(sorted(int(d) for d in dict(reduce.attributes).get("dimensions", "").strip("{}").split(",")
                        if d.strip()))
    if operand is None or not dims or not operand.row_major or operand.dtype not in HLO_DTYPES:
        return None
    last = len(operand.dims) - 1
    if last in dims or dims != tuple(range(dims[0], dims[-1] + 1)):
        return None  # over the minor dim (a row reduction) or not contiguous
    outer = math.prod(operand.dims[:dims[0]])
    rows = math.prod(operand.dims[dims[0]:dims[-1] + 1])
    cols = math.prod(operand.dims[dims[-1] + 1:])
    return operand, dims, (outer, rows, cols)


DATAMOVE_DTYPES = jnp_dtypes("bf16", "f32", "s32", "u32", "s8")


def _root(inst: Instruction | None, called: tuple[Instruction, ...], opcode: str) -> Instruction | None:
    """The instruction itself or its fusion's root when it is an `opcode`: a fusion that merely
    contains one (e.g. `pad_maximum_fusion`, a max of pads) is not that op."""
    return next((i for i in (inst, *called) if i is not None and i.opcode == opcode
                 and (i is inst or i.is_root)), None)


def _attribute(inst: Instruction | None, called: tuple[Instruction, ...], opcode: str, key: str) -> str:
    """`key` as printed on the op's `opcode` root (`_root`), else on the first `opcode` instruction
    that has it; '' when none does."""
    root = _root(inst, called, opcode)
    found = [root] if root is not None else []
    found += [i for i in (inst, *called) if i is not None and i.opcode == opcode]
    return next((dict(i.attributes)[key] for i in found if key in dict(i.attributes)), "")


def _infer_datamove(*, name: str, cat: str, out: ArrayText, inst: Instruction | None,
                    called: tuple[Instruction, ...], operands: list[ArrayText], operands_from: str,
                    is_copy: bool) -> tuple[str, dict, list[str]] | None:
    """The datamove family for prefetch copies, relayouts, dynamic slices and updates; None otherwise."""
    opcodes = _opcodes(inst, *called)
    if cat in ("copy-done", "copy-start") or name.startswith(("copy-done", "copy-start")):
        op = "copy"
    elif cat == "dynamic-slice" or name.startswith("dynamic-slice") or "dynamic-slice" in opcodes:
        op = "dynamic_slice"
    elif cat == "dynamic-update-slice" or name.startswith("dynamic-update-slice") or "dynamic-update-slice" in opcodes:
        op = "dynamic_update_slice"
    elif cat == "concatenate" or name.startswith("concatenate") or _root(inst, called, "concatenate"):
        op = "concatenate"
    elif cat == "pad" or name.startswith("pad.") or name == "pad" or _root(inst, called, "pad"):
        op = "pad"
    elif cat == "reshape" or name.startswith("reshape") or (is_copy and not out.row_major):
        op = "relayout"
    else:
        return None
    if out.dtype not in DATAMOVE_DTYPES:
        raise NotReproducible(f"`{name}` moves dtype {out.dtype}; the datamove family takes "
                              f"{', '.join(DATAMOVE_DTYPES)}")
    dtype = DATAMOVE_DTYPES[out.dtype]
    dims = out.dims
    basis = [f"family datamove ({op}): " + {"copy": f"category `{cat}` (a memory-space prefetch copy; "
                                                    "reproduced as one HBM -> HBM DMA of the same bytes)",
                                            "dynamic_slice": "a dynamic-slice (one DMA of the window)",
                                            "dynamic_update_slice": "a dynamic-update-slice (the update DMAed "
                                                                    "into the aliased operand)",
                                            "relayout": "a reshape or copy that writes another tiled layout",
                                            "concatenate": "a concatenate (each input DMAed into its window)",
                                            "pad": "a pad (zero-filled output, input stored into its window)"}[op],
             f"output {out.text} from the capture's shape_with_layout"]
    first = operands[0] if operands else None
    if op == "copy":
        return "datamove", dict(op=op, in_dims=list(dims), out_dims=list(dims), dtype=dtype), basis
    if op == "concatenate":
        axis_text = _attribute(inst, called, "concatenate", "dimensions").strip("{}")
        axis = int(axis_text) if axis_text.isdigit() else None
        parts_in = [a for a in operands if len(a.dims) == len(dims)]
        if axis is None or axis >= len(dims) or not parts_in or sum(a.dims[axis] for a in parts_in) != dims[axis]:
            raise NotReproducible(f"`{name}` is a concatenate whose inputs or axis are not in the HLO text (pass "
                                  "--dump)")
        basis.append(f"{len(parts_in)} inputs along dim {axis} from {operands_from}")
        return "datamove", dict(op=op, in_dims=list(dims), out_dims=list(dims), dtype=dtype,
                                parts=[a.dims[axis] for a in parts_in], axis=axis), basis
    if op == "pad":
        padding = _attribute(inst, called, "pad", "padding")
        if not re.fullmatch(r"[\d_x\-]+", padding):
            raise NotReproducible(f"`{name}` is a pad whose padding is not in the HLO text (pass --dump)")
        config = [[int(v) for v in d.split("_")] for d in padding.split("x")]
        if len(config) != len(dims) or any(len(c) > 2 and c[2] != 0 for c in config) or \
                any(v < 0 for c in config for v in c):
            raise NotReproducible(f"`{name}` pads with {padding}: interior or negative padding is not reproduced")
        low, high = [c[0] for c in config], [c[1] for c in config]
        in_dims = [o - lo - hi for o, lo, hi in zip(dims, low, high, strict=True)]
        basis.append(f"padding {padding} from the HLO text; the pad value is assumed 0")
        return "datamove", dict(op=op, in_dims=in_dims, out_dims=list(dims), dtype=dtype, pad_low=low,
                                pad_high=high), basis
    if op == "dynamic_slice":
        if first is not None and len(first.dims) == len(dims) and all(i >= o for i, o in zip(first.dims, dims)):
            in_dims = list(first.dims)
            basis.append(f"operand {first.text} from {operands_from}")
        else:
            in_dims = [2 * dims[0], *dims[1:]]
            basis.append(f"operand shape unknown: assumed {in_dims} (twice the window's leading dim)")
        return "datamove", dict(op=op, in_dims=in_dims, out_dims=list(dims), dtype=dtype), basis
    if op == "dynamic_update_slice":
        upd = operands[1] if len(operands) > 1 else None
        if upd is not None and len(upd.dims) == len(dims) and all(u <= o for u, o in zip(upd.dims, dims)):
            update = list(upd.dims)
            basis.append(f"update {upd.text} from {operands_from}")
        else:
            update = [max(1, dims[0] // 2), *dims[1:]]
            basis.append(f"update shape unknown: assumed {update} (half the leading dim)")
        return "datamove", dict(op=op, in_dims=list(dims), out_dims=list(dims), dtype=dtype, update_dims=update), basis
    perm = list(reversed(out.minor_to_major)) if out.minor_to_major is not None else list(range(len(dims)))
    if first is not None and first.numel == out.numel:
        in_dims = list(first.dims)
        basis.append(f"operand {first.text} from {operands_from}")
    else:
        in_dims = list(dims)
        basis.append("operand shape unknown: assumed the output's logical shape")
    basis.append(f"physical order (major to minor) {perm} from the output layout; the reproduction writes "
                 "transpose(reshape(x), perm) row-major")
    return "datamove", dict(op=op, in_dims=in_dims, out_dims=list(dims), dtype=dtype, perm=perm), basis


_ALIAS = re.compile(r"\{(\d+)\}:\s*\((\d+),")


def _infer_tuple(*, name: str, category: str, shape_text: str, flops: float,
                 operands: list[ArrayText], op_math: OpMath | None, inst: Instruction | None,
                 opcodes: set[str]) -> tuple[str, dict, list[str]]:
    """A fusion returning a tuple -> the multi_output family: its bf16/f32 arrays are the kernel's
    outputs (the first non-aliased one is the primary, or the one the op's main matmul writes when
    its math is known), scalars and integer outputs are state."""
    elements = [parse_array(t) for t in re.findall(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^}]*\})?", shape_text)]
    n = len(elements)
    aliasing = dict(inst.attributes).get("output_to_operand_aliasing", "") if inst is not None else ""
    aliased = {int(o) for o, _ in _ALIAS.findall(aliasing)}
    arrays = [(i, a) for i, a in enumerate(elements) if a is not None and a.dims and a.dtype in HLO_DTYPES
              and 0 not in a.dims]
    state = [a.text for a in elements if a is not None and (a.dtype not in HLO_DTYPES or not a.dims)]
    main = op_math.main if op_math is not None else None
    written = [(i, a) for i, a in arrays if main is not None and i in main.feeds
               and i not in aliased and _rows_cols(a) == (main.batch * main.m, main.n)]
    primary = next(iter(written), None) or next(((i, a) for i, a in arrays if i not in aliased), None)
    if primary is None:
        raise NotReproducible(f"`{name}` returns a tuple of {n} arrays with no bf16/f32 output that is not "
                              "aliased to an operand (state only): nothing to compute")
    i0, out = primary
    m, ncols = _rows_cols(out)
    basis = [f"family multi_output: a tuple of {n} arrays; output {i0} {out.text} is the primary"]
    if state:
        basis.append(f"{len(state)} state outputs not reproduced (scalars / integer indices and sync flags, "
                     f"e.g. {state[0]})")
    if aliased:
        basis.append(f"outputs {sorted(aliased)} alias operands (output_to_operand_aliasing): carried in HBM, "
                     "untouched on one chip")
    extras = []
    for i, a in arrays:
        if i == i0:
            continue
        r, c = _rows_cols(a)
        extras.append([r, c, HLO_DTYPES[a.dtype], "carried" if i in aliased else "computed"])
    if any(not a.row_major for _, a in arrays):
        basis.append("non-row-major output layouts are written row-major (the relayout is not reproduced)")
    out_dtype = HLO_DTYPES[out.dtype]
    in_dtype = HLO_DTYPES.get(operands[0].dtype, out_dtype) if operands else out_dtype
    is_matmul = bool(opcodes & MATMUL_OPCODES) or category.lower() in MATMUL_CATEGORIES
    if written:
        basis.append(f"primary is the output of a matmul: K={main.k} from the compiled HLO ({main.describe()})")
        basis += _batch_folded(main)
        in_dtype = HLO_DTYPES.get(main.lhs_dtype, in_dtype)  # the matmul's own operands, not the fusion's first
        return "multi_output", dict(kind="matmul", m=m, n=ncols, k=main.k, n_inputs=1, in_dtype=in_dtype,
                                    out_dtype=out_dtype, extras=extras), basis
    if is_matmul:
        k_float = flops / (2.0 * m * ncols) if flops > 0 else 0.0
        if k_float < 1 or abs(k_float - round(k_float)) > 1e-6 * k_float:
            raise NotReproducible(f"`{name}` is a multi-output matmul fusion whose contracting dim is unknown "
                                  f"(no whole K from its FLOP count {flops:.4g})")
        k = int(round(k_float))
        basis.append(f"primary is a matmul: K={k} from flops / (2*M*N) = {flops:.4g} / (2*{m}*{ncols})")
        return "multi_output", dict(kind="matmul", m=m, n=ncols, k=k, n_inputs=1, in_dtype=in_dtype,
                                    out_dtype=out_dtype, extras=extras), basis
    n_inputs = max(1, min(8, sum(1 for a in operands if a.numel == out.numel)))
    basis.append(f"primary is elementwise over {n_inputs} same-sized inputs (a stand-in body: weighted sum); "
                 "computed extras are 2*e of their own input (stand-in)")
    return "multi_output", dict(kind="elementwise", m=m, n=ncols, k=1, n_inputs=n_inputs, in_dtype=in_dtype,
                                out_dtype=out_dtype, extras=extras), basis


# pred travels as int8: the collective kernels move bytes, and a bool array has no ring arithmetic
COLLECTIVE_DTYPES = jnp_dtypes("bf16", "f32", "s32", "s8") | {"pred": "int8"}


def _infer_collective(*, name: str, family: str, category: str, shape_text: str, text: str,
                      operands: list[ArrayText], operands_from: str, chips: int) -> tuple[str, dict, list[str]]:
    """A captured all-gather / reduce-scatter / all-reduce (async start and done included) -> the
    collective family: its ring from the replica groups, the per-device shard as rows x cols."""
    kind = kind_of(family, category, text)
    if not kind:
        raise NotReproducible(f"`{name}` is a collective ({family}); the lab's collective family reproduces "
                              f"{', '.join(COLLECTIVE_KINDS)} only")
    elements = [parse_array(t) for t in re.findall(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^}]*\})?", shape_text)]
    arrays = [a for a in elements if a is not None and a.dims]
    if not arrays and any(a is not None for a in elements):
        raise NotReproducible(f"`{name}` is a {kind} of a scalar: nothing worth a ring kernel")
    if not arrays:
        raise NotReproducible(f"`{name}` is a {kind} with no array output shape the lab can read")
    # an async start returns (operand, result, state...): the result is the largest array
    out = max(arrays, key=lambda a: a.numel)
    if out.numel == 0:
        raise NotReproducible(f"`{name}` is a {kind} of an empty array ({out.text}): nothing to move")
    if out.dtype not in COLLECTIVE_DTYPES or (kind != "all-gather" and out.dtype not in HLO_DTYPES):
        raise NotReproducible(f"`{name}` is a {kind} of dtype {out.dtype}; the collective family takes "
                              f"{', '.join(HLO_DTYPES)} ({', '.join(COLLECTIVE_DTYPES)} for all-gather)")
    dtype = COLLECTIVE_DTYPES[out.dtype]
    basis = [f"family collective ({kind}): " + (f"category `{category}`" if family in COLLECTIVE_KINDS
                                                else f"a {kind} inside the async collective's fused computation"),
             f"output {out.text} from the capture's shape_with_layout"]
    if out.dtype == "pred":
        basis.append("pred gathered as int8 (one byte per element, as TPU stores pred)")
    found = replica_groups(text)
    operand = next((a for a in operands if a.dims and a.numel and a.numel != out.numel), None)
    if found is not None:
        groups, how = found
        group = groups[0]
        basis.append(f"ring of {len(group)} devices {group} (first of {len(groups)} groups) from the {how}")
    elif operand is not None and kind in ("all-gather", "reduce-scatter"):
        ratio = max(out.numel, operand.numel) // min(out.numel, operand.numel)
        group = list(range(ratio))
        basis.append(f"ring of {ratio} devices from the output / operand sizes ({operand.text}, from "
                     f"{operands_from}); which devices is not known: 0..{ratio - 1} assumed")
    else:
        n = max(2, chips)
        d = gathered_dim(text) or 0
        split = out.dims[d] if kind == "all-gather" and d < len(out.dims) else n
        if split % n and math.gcd(split, n) >= 2:
            n = math.gcd(split, n)  # the gathered dim must split over the ring: the largest ring that does
        group = list(range(n))
        basis.append(f"ring of {n} devices assumed: no replica_groups in the HLO text (pass --dump) and no operand "
                     "shape; the capture's chip count" + (" cut to a divisor of the gathered dim" if n != max(2, chips)
                                                          else ""))
    n = len(group)
    if n < 2:
        raise NotReproducible(f"`{name}` runs over a group of one device: nothing crosses ICI")
    total = out.numel
    cols = out.dims[-1]
    if kind == "all-gather":
        d = gathered_dim(text)
        if out.dims[d if d is not None and d < len(out.dims) else 0] % n:
            raise NotReproducible(f"`{name}`: the gathered dim of {out.text} does not divide over {n} devices")
        if d is not None and d == len(out.dims) - 1:
            cols = cols // n
        shard = total // n
        rows = shard // cols
        if d is not None and d != 0:
            basis.append(f"gathered dim {d} is not the major dim: the reproduction gathers the same bytes along "
                         "rows (the order of the result differs; the ICI traffic does not)")
        basis.append(f"shard {rows}x{cols} per device (the output / {n})")
    elif kind == "reduce-scatter":
        rows = total // cols
        basis.append(f"shard {rows}x{cols} per device (the output); each device reduces {n} of them")
    else:
        rows_total = total // cols
        rows = -(-rows_total // n)
        basis.append(f"all-reduce of {rows_total}x{cols} as reduce-scatter + all-gather of {n} chunks of {rows} rows"
                     + (f" (padded to {n * rows} rows)" if rows * n != rows_total else ""))
    problem = dict(kind=kind, devices=n, rows=rows, cols=cols, dtype=dtype, group=group)
    axes = mesh_axes(text)
    if axes:
        problem["mesh_axis"] = ",".join(axes)
    return "collective", problem, basis


@dataclass(frozen=True)
class SurveyRow:
    """One op of a capture and what the lab can do with it."""

    op_name: str
    category: str
    self_time_ps: int  # summed over the capture (first host)
    time_share: float  # of the host's summed op self time
    family: str  # '' when not reproducible
    problem: AnyProblem | None  # None when not reproducible
    reason: str  # why not, when family is ''
    left_out: tuple[str, ...] = ()  # what the reproduction leaves out of the op (`OpSpec.left_out`)


def survey(diagnosis: Diagnosis, top: int | None = None) -> list[SurveyRow]:
    """The first host's ops by self time, each with its family and problem or the reason it has none."""
    analysis = _analysis(diagnosis)
    ops = analysis.ops[analysis.ops["host"] == analysis.ops["host"].iloc[0]] if len(analysis.ops) else analysis.ops
    ops = ops.sort_values("self_time_ps", ascending=False)
    total = float(ops["self_time_ps"].sum()) or 1.0
    rows = []
    index = _OpIndex(analysis)
    for _, r in ops.head(top if top is not None else len(ops)).iterrows():
        try:
            spec = _spec(diagnosis, index, str(r["name"]), topology=None, scale_down=1)
            family, problem, reason, left_out = spec.family, spec.problem, "", spec.left_out
        except UsageError as exc:
            family, problem, reason, left_out = "", None, exc.one_line(), ()
        rows.append(SurveyRow(str(r["name"]), str(r["category"]), int(r["self_time_ps"]),
                              float(r["self_time_ps"]) / total, family, problem, reason, left_out))
    return rows


@dataclass(frozen=True)
class Coverage:
    """Share of a host's op self time the lab reproduces, split into compute and collectives."""

    compute_ps: int
    compute_reproducible_ps: int
    collective_ps: int
    collective_reproducible_ps: int
    collective_families: tuple[str, ...]  # families present in the capture
    collective_families_reproducible: tuple[str, ...]

    @property
    def compute_share(self) -> float:
        return self.compute_reproducible_ps / self.compute_ps if self.compute_ps else 0.0

    @property
    def collective_share(self) -> float:
        return self.collective_reproducible_ps / self.collective_ps if self.collective_ps else 0.0


def coverage(rows: list[SurveyRow]) -> Coverage:
    """Coverage over a full survey (call `survey` with top=None)."""
    comp = [r for r in rows if not collective_family(r.op_name, r.category)]
    coll = [r for r in rows if collective_family(r.op_name, r.category)]
    def kind(r: SurveyRow) -> str:
        # v5e's async-collective-start/-done name no family; their category (or the reproduced problem) does
        family = collective_family(r.op_name, r.category)
        kind = r.problem.kind if isinstance(r.problem, collective.Problem) else ""
        return kind or kind_of(family, r.category, "") or family

    fams = sorted({kind(r) for r in coll})
    done = sorted({kind(r) for r in coll if r.family})
    return Coverage(sum(r.self_time_ps for r in comp), sum(r.self_time_ps for r in comp if r.family),
                    sum(r.self_time_ps for r in coll), sum(r.self_time_ps for r in coll if r.family),
                    tuple(fams), tuple(done))


def _analysis(diagnosis: Diagnosis) -> Analysis:
    if diagnosis.analysis is None:
        raise InputError("the lab needs a capture or dumps of a known TPU generation", path=diagnosis.input_path,
                         hint="pass a capture, or --chip with the dumps' generation to `tpudiag report`")
    return diagnosis.analysis


def _dump_origin(compiled: CompiledInputs, program: CompiledProgram | None) -> str:
    """The XLA dump directory `program` was read from; '' for a capture's own program or none."""
    return next((h.origin for h in compiled.hlo if h.program is program), "") if program is not None else ""


class _OpIndex:
    """An analysis' ops looked up by name, its op metadata by (name, program) and the trace's
    shapes by program, each table read once for a survey of every op."""

    def __init__(self, analysis: Analysis):
        self.analysis = analysis
        ops = analysis.ops.sort_values("total_time_ps", ascending=False, kind="stable")
        self.rows = ops.drop_duplicates("name").set_index("name", drop=False)
        self._meta: dict[str, dict] = {}
        self._shapes: dict[object, dict[str, str]] = {}

    def row(self, op: str):
        """The op's row (the host and program where it took longest); None when absent."""
        return self.rows.loc[op] if op in self.rows.index else None

    def metadata(self, host, op: str, program_id) -> tuple[float, float, str] | None:
        """(flops, bytes accessed, HLO text) of one execution, from the host's op metadata."""
        if host.host not in self._meta:
            meta = host.op_metadata.drop_duplicates(["name", "program_id"])
            self._meta[host.host] = {(n, p): (f, b, t) for n, p, f, b, t in zip(
                meta["name"], meta["program_id"], meta["flops"], meta["bytes_accessed"], meta["hlo_text"],
                strict=True)}
        return self._meta[host.host].get((op, program_id))

    def shapes(self, program_id) -> dict[str, str]:
        """The trace's `shape_with_layout` by op name, for one program."""
        if program_id not in self._shapes:
            ops = self.analysis.ops[self.analysis.ops["program_id"] == program_id]
            self._shapes[program_id] = dict(zip(ops["name"].astype(str), ops["shape_with_layout"].astype(str),
                                                strict=True))
        return self._shapes[program_id]


# Basis lines that state something of the op the reproduction leaves out.
_LEFT_OUT = re.compile(r"untouched|not reproduced|left out|dropped|ignored|no collective|on one chip")


def spec_from_diagnosis(diagnosis: Diagnosis, op: str, *, topology: str | None = None,
                        scale_down: int = 1) -> OpSpec:
    """Find `op` in a diagnosis (`tpudiag.diagnose(capture, dumps=...)`: the lab reads captures and
    compiled programs through the one pipeline), infer its family and problem. Its HLO text and
    fused body come from the XLA dump the join matched to its program, else from the capture
    (`op_text`). Raises the project's errors."""
    return _spec(diagnosis, _OpIndex(_analysis(diagnosis)), op, topology=topology, scale_down=scale_down)


def _spec(diagnosis: Diagnosis, index: _OpIndex, op: str, *, topology: str | None, scale_down: int) -> OpSpec:
    if scale_down < 1:
        raise UsageError(f"--scale-down must be at least 1, got {scale_down}")
    analysis = index.analysis
    capture = diagnosis.input_path
    row = index.row(op)
    if row is None:
        names = sorted(set(analysis.ops["name"]))
        hint = (f"ops in it include {', '.join(f'`{n}`' for n in names[:8])}" if names
                else "the capture has no device ops (a CPU-only profile?); the lab needs a TPU capture")
        raise UsageError(f"op `{op}` is not in the capture", path=capture, hint=hint)
    if row["bound_by"] == BoundBy.HOST_LINK:
        # Its time is the host link's (tens of GB/s), which no kernel on one chip exercises: a repro
        # would time an HBM -> HBM copy of the same bytes, tens of times faster than the op.
        raise NotReproducible(f"`{op}` is an async copy between host memory and HBM, bound by the host link; a "
                              "kernel on one chip would time an HBM copy instead (see host-transfer-bound)")
    host = next(h for h in analysis.profile.hosts if h.host == row["host"])
    if host.device.platform is Platform.GPU:
        # The lab's kernels are Pallas TPU kernels, compiled for a TPU topology: a GPU kernel's time
        # says nothing about theirs (its fusions' shapes are in the program, so "no shape" misled).
        raise NotReproducible(f"`{op}` ran on a GPU; the lab reproduces ops as Pallas kernels for a TPU")
    meta = index.metadata(host, op, row["program_id"])
    flops = float(meta[0]) if meta is not None else float(row["flops"]) / max(1, row["occurrences"])
    nbytes = float(meta[1]) if meta is not None else float(row["bytes_accessed"]) / max(1, row["occurrences"])
    capture_shapes = index.shapes(row["program_id"])

    def shape_of(name: str) -> str:
        return capture_shapes.get(name, "")

    join = diagnosis.join
    program = join.program_for(row["program_id"], row["module"]) if join is not None else None
    origin = _dump_origin(diagnosis.compiled, program)
    text = op_text.from_program(program, op, shape_of) if origin else None
    notes = []
    if text is not None:
        notes.append(f"HLO text and fusion body from the dump `{origin}`")
    else:
        text = op_text.from_text(str(meta[2]) if meta is not None else "", shape_of)
        if diagnosis.compiled.hlo:
            where = ", ".join(f"`{h.origin}`" for h in diagnosis.compiled.hlo)
            notes.append(f"`{op}` is not in a dump joined to its program ({where}); used the capture's HLO text")
    found = ProgramMath(program).get(op) if program is not None else None
    family, fields, basis = infer(name=op, category=str(row["category"]),
                                  shape_with_layout=str(row["shape_with_layout"]),
                                  hlo_text=text.line, tf_op=str(row["tf_op"] or ""), flops=flops,
                                  bytes_accessed=nbytes, body=text.body, operands=list(text.operands),
                                  operands_from=text.operands_from,
                                  chips=host.device.n_chips * len(analysis.profile.hosts),
                                  op_math=found or op_math_from_text(op, text.line),
                                  instructions=(text.instruction, text.called),
                                  kernel=program.kernels.get(op) if program is not None else None,
                                  backend_config=(program.find(op).backend_config
                                                  if program is not None and program.find(op) is not None else ""))
    try:
        problem = problem_from_fields(family, fields)
    except ValueError as exc:
        raise NotReproducible(f"`{op}`: {exc}") from None
    device = host.device
    chip = device.chip
    if topology is None:
        if chip is None or chip.generation not in DEFAULT_TOPOLOGY:
            raise UsageError(f"the capture's device `{device.device_type or 'unknown'}` is not a known TPU",
                             hint="pass --topology, e.g. `--topology v5e:2x2`")
        topology = DEFAULT_TOPOLOGY[chip.generation]
    generation = topology_generation(topology)
    target = chip_for(generation)
    occurrences = int(row["occurrences"])
    measured = float(row["self_time_ps"]) / occurrences if occurrences else None
    if scale_down > 1:
        notes.append(f"--scale-down {scale_down}: the CPU run divides every dim by {scale_down}, keeping "
                     "multiples of 128 / 8 as such and ragged dims ragged; the full problem is what tune compiles")
    run_problem, cap_notes = cpu_problem(problem, scale_down)
    notes += cap_notes
    return OpSpec(
        op_name=op, category=str(row["category"]), program=str(row["module"]), family=family, problem=problem,
        run_problem=run_problem, scale_down=scale_down,
        shape_with_layout=str(row["shape_with_layout"]),
        operands=tuple(a.text for a in text.operands), hlo_text=text.line,
        tf_op=str(row["tf_op"] or ""),
        source=str(row["source"] or ""), basis=tuple(basis), device_type=device.device_type, generation=generation,
        topology=topology, vmem_bytes=target.vmem_bytes, hbm_bytes_per_s=target.hbm_bytes_per_s,
        clock_hz=target.clock_hz, occurrences=occurrences, measured_time_ps=measured, flops=flops,
        bytes_accessed=nbytes, capture=str(capture), notes=tuple(notes),
        captured_basis="modelled" if diagnosis.report.summary.modelled or diagnosis.mode == "static" else "measured")
