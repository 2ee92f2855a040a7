"""A compiled XLA program as the TPU compiler left it: computations, instructions, layouts, buffers.

Built by `tpudiag.parsers.hlo_text` (from an `--xla_dump_to` directory) and
`tpudiag.parsers.hlo_proto` (from the HloProto a capture embeds); both give the same objects so
later code does not care where a program came from. This module is HLO only: LLO facts (bundles,
spills) live with the LLO parser.

Bytes: `logical_bytes` counts the elements a shape names; `padded_bytes` counts what the tiled
TPU layout occupies (see `tpudiag.parsers.layout`). Tuples count the sum of their arrays, never
the tuple's own index table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from tpudiag.model.kernels import MosaicKernel
from tpudiag.model.schemas import Column, TableSchema

# Layout memory spaces (`S(n)` in shape text, LayoutProto.memory_space): the one map from a
# number to what it is. 0-2 as XLA's own memory-usage report names them on v5e/v6e (`default`,
# `vmem (color=1)`, `smem (color=2)`); 5 is host memory (XLA's `Layout::kHostMemorySpace`, what
# memory kinds `pinned_host`/`unpinned_host` compile to: offloaded and prefetched arrays); other
# numbers keep their raw form because their meaning varies by generation.
HOST_MEMORY_SPACE = 5
MEMORY_SPACE_NAMES = {0: "hbm", 1: "vmem", 2: "smem", HOST_MEMORY_SPACE: "host"}
_MEMORY_SPACE = re.compile(r"S\((\d+)\)(?=[^{}]*\})")  # inside a layout's braces: `{1,0:T(8,128)S(5)}`


def memory_space_name(space: int) -> str:
    return MEMORY_SPACE_NAMES.get(space, f"S({space})")


def memory_spaces_in(text: str) -> tuple[int, ...]:
    """The `S(n)` memory space of each layout in HLO shape text, in order (a layout without one is
    not listed: it is HBM); `(f32[8]{0:S(5)}, f32[8]{0})` -> (5,)."""
    return tuple(int(m.group(1)) for m in _MEMORY_SPACE.finditer(text or ""))


@dataclass(frozen=True)
class Layout:
    """A TPU layout: `{minor_to_major:T(tile)(subtile)E(bits)S(space)}`."""

    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...] = ()  # first = the padding tile; later ones pack within it
    element_size_bits: int = 0  # E(n); 0 = the dtype's own size
    memory_space: int = 0  # S(n); 0 = HBM


@dataclass(frozen=True)
class ArrayShape:
    """One array: element type, logical dims (major-first as written) and its layout if any."""

    dtype: str  # HLO spelling: f32, bf16, s8, pred, f8e4m3fn, token, ...
    dims: tuple[int, ...]
    layout: Layout | None
    logical_bytes: int
    padded_bytes: int

    @property
    def memory_space(self) -> int:
        return self.layout.memory_space if self.layout is not None else 0


@dataclass(frozen=True)
class TupleShape:
    elements: tuple[Shape, ...]

    @property
    def logical_bytes(self) -> int:
        return sum(e.logical_bytes for e in self.elements)

    @property
    def padded_bytes(self) -> int:
        return sum(e.padded_bytes for e in self.elements)


Shape = ArrayShape | TupleShape


def leaf_arrays(shape: Shape) -> list[ArrayShape]:
    """The arrays of a shape, tuples flattened in order."""
    if isinstance(shape, ArrayShape):
        return [shape]
    out: list[ArrayShape] = []
    for e in shape.elements:
        out.extend(leaf_arrays(e))
    return out


@dataclass(frozen=True)
class DotDims:
    """`dot_dimension_numbers`: which operand dims a dot contracts and which it batches over."""

    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()


@dataclass(frozen=True)
class ConvDims:
    """A convolution's dimension numbers (`dim_labels`), window sizes and group counts.

    Dims are operand positions: `0fb_0io->bf0` is input spatial (0,), feature 1, batch 2; kernel
    spatial (0,), input feature 1, output feature 2; output batch 0, feature 1, spatial (2,).
    """

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]
    window: tuple[int, ...] = ()  # window size per spatial dim; () when the dump does not say (size 1)
    feature_group_count: int = 1
    batch_group_count: int = 1
    lhs_dilation: tuple[int, ...] = ()  # per spatial dim (`lhs_dilate=8x2`, base_dilation); () = none
    stride: tuple[int, ...] = ()  # per spatial dim (`stride=8x2`); () = 1 everywhere
    padding: tuple[tuple[int, int], ...] = ()  # (low, high) per spatial dim (`pad=7_7x1_1`); () = none
    rhs_dilation: tuple[int, ...] = ()  # per spatial dim (`rhs_dilate=2x2`, window_dilation); () = none


def window_factors(factors: tuple[int, ...]) -> tuple[int, ...]:
    """Per-dim strides or dilations as `ConvDims` holds them: () when every one is 1, as HLO text
    then prints none, so that a program read from text and from its proto agree."""
    return factors if any(f > 1 for f in factors) else ()


def window_padding(pads: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Per-dim (low, high) padding as `ConvDims` holds it: () when no dim is padded, as HLO text
    then prints no `pad`."""
    return pads if any(low or high for low, high in pads) else ()


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction. Strings are '' and numbers None when the dump does not say.

    The fields after `parameter_number` are derived (`tpudiag.parsers.hlo_program`), the same
    way for text and proto input.
    """

    computation: str
    name: str  # without the leading %
    opcode: str  # canonical: text sugar such as `slice-start` is read as async-start wrapping slice
    shape_text: str  # as written, layout included
    shape: Shape | None  # None when the shape text could not be parsed (a warning says so)
    operands: tuple[str, ...]
    called_computations: tuple[str, ...]
    fusion_kind: str  # kLoop, kOutput, kInput, kCustom; '' when not a fusion
    custom_call_target: str
    op_name: str  # metadata op_name: the JAX name stack
    source_file: str
    source_line: int  # 0 when unknown
    backend_config: str  # raw text (usually JSON); '' when absent
    async_execution_thread: str  # e.g. 'sparsecore' for TPU7x offloads; '' = main thread
    frontend_attributes: tuple[tuple[str, str], ...]
    is_root: bool
    position: int  # index in its computation; the schedule order when the module is scheduled
    parameter_number: int | None = None  # for `parameter(N)`
    estimated_cycles: int | None = None  # compiler estimate, see cycles_source
    cycles_source: str = ""  # 'bundle_analysis_data' (static LLO profile), 'window_config' (classic model)
    collective_family: str = ""  # all-gather, all-reduce, reduce-scatter, ...; '' for non-collectives
    async_role: str = ""  # 'start', 'done' or ''
    is_continuation: bool = False  # v5e async_collective_fusion: compute that also advances a collective
    wrapped_opcode: str = ""  # for async-start/-update/-done: the op run asynchronously (slice, call, ...)
    # Attributes as printed after the operands (`replica_groups`, `lhs_contracting_dims`, `window`,
    # ...), text input only; metadata, backend_config and frontend_attributes have fields above.
    attributes: tuple[tuple[str, str], ...] = ()
    # The contraction of a dot or convolution, read the same way from text and proto; None otherwise.
    contraction: DotDims | ConvDims | None = None

    def attributes_text(self) -> str:
        """The attributes as `key=value, ...`, the form they are printed in."""
        return ", ".join(f"{k}={v}" for k, v in self.attributes)

    @property
    def logical_bytes(self) -> int:
        return self.shape.logical_bytes if self.shape is not None else 0

    @property
    def padded_bytes(self) -> int:
        return self.shape.padded_bytes if self.shape is not None else 0


@dataclass(frozen=True)
class Computation:
    name: str
    is_entry: bool
    instructions: tuple[str, ...]  # names in order (the schedule, for a scheduled module)
    root: str


@dataclass(frozen=True)
class AsyncPair:
    """An async start and its done, with what the schedule puts between them.

    `scheduled_between` lists what the schedule runs between the two, leaving out the
    instructions that cost nothing (parameters, tuples, get-tuple-elements, bitcasts, constants):
    when it is empty the start and the done are adjacent and nothing overlaps the transfer.

    The done is usually in the start's computation. Where the value crosses a `while` or `call`
    (a start before a loop whose done is in the body; a start in one iteration whose done is in
    the next; a start in the body whose done follows the loop), `done_computation` names the
    done's, and `scheduled_between` holds what runs at least once between them: the start's
    computation after it (up to the op that carries the value into the done's computation) and
    the done's computation before it (after the op that carries it out).
    """

    computation: str
    start: str
    done: str
    kind: str  # 'collective', 'copy', 'slice' or 'async' (any other async-start/done)
    family: str  # collective family; '' for copies and non-collective calls
    start_position: int
    done_position: int
    scheduled_between: tuple[str, ...]
    thread: str = ''  # async_execution_thread of the start, e.g. 'sparsecore' on TPU7x
    done_computation: str = ''  # the done's computation when not `computation` (see above)

    @property
    def done_in(self) -> str:
        """The computation that holds the done."""
        return self.done_computation or self.computation

    @property
    def adjacent(self) -> bool:
        return not self.scheduled_between


@dataclass(frozen=True)
class BufferValue:
    """One HLO value placed in an allocation (`value: <id name @pos> (size=,offset=): shape`)."""

    value_id: int
    name: str  # instruction name, with `{i}` shape index when it is a tuple element
    size_bytes: int
    offset_bytes: int
    shape_text: str


@dataclass(frozen=True)
class BufferAllocation:
    """One allocation of `*buffer-assignment.txt`. Color 0 is HBM, 1 VMEM (see the usage report)."""

    index: int
    size_bytes: int
    color: int
    parameter_number: int | None  # entry parameter it holds
    is_output: bool
    maybe_live_out: bool
    is_thread_local: bool
    is_temp: bool  # preallocated-temp
    is_constant: bool
    values: tuple[BufferValue, ...]


@dataclass(frozen=True)
class MemorySpaceUsage:
    """One `Memory Space:` block of `*memory-usage-report.txt`."""

    name: str  # as XLA names it: default (HBM), vmem, smem, host
    color: int
    total_bytes: int


# Entry ops that run other computations as separately compiled programs.
CONTROL_FLOW_OPCODES = frozenset({"while", "call", "conditional"})


@dataclass
class CompiledProgram:
    """One HLO module after optimisation, with its buffers when the dump has them."""

    module: str
    path: str  # the HLO text file, or '<proto>' with the program id
    source: str  # 'hlo_text' or 'hlo_proto'
    entry: str  # entry computation name
    is_scheduled: bool
    computations: dict[str, Computation]
    instructions: dict[tuple[str, str], Instruction]  # (computation, name) -> instruction
    async_pairs: tuple[AsyncPair, ...] = ()
    program_id: int | None = None
    entry_layout: str = ""  # `entry_computation_layout` text; '' from protos
    allocations: tuple[BufferAllocation, ...] = ()
    total_bytes_used: int | None = None  # `Total bytes used` (head of `*-buffer-assignment-values.txt`)
    memory_spaces: tuple[MemorySpaceUsage, ...] = ()
    target: str = ""  # from target_arguments.txt, e.g. 'TPU_VERSION_VIPERFISH lite'
    # `*-live-range.txt`: HLO value (`name{index}`) -> (first, last) program position, and the
    # number of positions; empty when not dumped.
    live_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    live_range_positions: int = 0
    oom_recorded: bool = False  # the compiler wrote `*.oom_intermediate_module.txt`: it ran out of memory
    # The module's `num_partitions` and `replica_count` (its `HloModule` line); 1 where not stated.
    num_partitions: int = 1
    replica_count: int = 1
    # Pallas (Mosaic TPU) kernels read from their custom calls' serialised bodies, by instruction name
    # (`parsers.mosaic`); empty where the program kept no body (a runtime's, a capture's own HloProto).
    kernels: dict[str, MosaicKernel] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _by_name: dict[str, Instruction] | None = field(default=None, repr=False, compare=False)

    def instruction(self, name: str, computation: str | None = None) -> Instruction:
        """An instruction by name, in the entry computation unless another is given."""
        return self.instructions[(computation or self.entry, name)]

    def find(self, name: str) -> Instruction | None:
        """The instruction named `name` in any computation, the entry's first (buffer values and
        VMEM reports name instructions without their computation). The index is built once."""
        if self._by_name is None:
            index: dict[str, Instruction] = {}
            for (computation, n), inst in self.instructions.items():
                if computation == self.entry or n not in index:
                    index[n] = inst
            self._by_name = index
        return self._by_name.get(name)

    def computation_instructions(self, computation: str) -> list[Instruction]:
        comp = self.computations[computation]
        return [self.instructions[(computation, n)] for n in comp.instructions]

    @property
    def schedule(self) -> tuple[str, ...]:
        """The entry computation's instruction order: the schedule when `is_scheduled`."""
        return self.computations[self.entry].instructions

    @cached_property
    def entry_op_of(self) -> dict[str, str]:
        """Instruction name -> the entry instruction that runs it: itself at entry level; for one
        inside a control-flow op's computations (`while` body and condition, `call`, `conditional`
        branches, at any depth) that entry op. What a timeline of entry ops times it as: a Pallas
        kernel's custom call in a scanned layer runs, and spends its time, inside the `while`.
        (A fusion's or an async op's computations are compiled with it, never as programs of their own.)"""
        owner: dict[str, str] = {}
        for name in self.computations[self.entry].instructions:
            inst = self.instructions[(self.entry, name)]
            if inst.opcode not in CONTROL_FLOW_OPCODES:
                continue
            stack = list(inst.called_computations)
            while stack:
                comp = stack.pop()
                if comp in owner or comp not in self.computations or comp == self.entry:
                    continue
                owner[comp] = name
                stack.extend(c for n in self.computations[comp].instructions
                             for c in self.instructions[(comp, n)].called_computations)
        out = {name: owner[comp] for comp, name in self.instructions if comp in owner}
        out.update((name, name) for name in self.computations[self.entry].instructions)
        return out

    def entry_parameters(self) -> list[Instruction]:
        params = [i for i in self.computation_instructions(self.entry) if i.opcode == "parameter"]
        return sorted(params, key=lambda i: (i.parameter_number is None, i.parameter_number or 0))


@dataclass
class CompiledDump:
    """Everything `load_hlo_dump` found in one `--xla_dump_to` directory."""

    path: str
    programs: list[CompiledProgram]
    warnings: list[str] = field(default_factory=list)

    def program(self, module: str) -> CompiledProgram:
        """The program whose module name is `module` (the last one compiled if several are)."""
        matches = [p for p in self.programs if p.module == module]
        if not matches:
            raise KeyError(module)
        return matches[-1]


INSTRUCTION_BYTES = TableSchema("instruction_bytes", (
    Column("module", "category", "HLO module name"),
    Column("computation", "category", "computation holding the instruction"),
    Column("name", "string", "HLO instruction name"),
    Column("opcode", "category", "HLO opcode"),
    Column("result_logical_bytes", "int64", "result elements x element size"),
    Column("result_padded_bytes", "int64", "result bytes in its tiled layout"),
    Column("operand_logical_bytes", "int64", "sum over operands of their logical bytes"),
    Column("operand_padded_bytes", "int64", "sum over operands of their padded bytes"),
    Column("logical_bytes", "int64", "operands + result, logical"),
    Column("padded_bytes", "int64", "operands + result, as laid out"),
    Column("padding_factor", "float64", "padded_bytes / logical_bytes; NaN when logical is 0"),
    Column("memory_spaces", "category", "memory spaces the result lives in, e.g. 'hbm' or 'vmem'"),
))
