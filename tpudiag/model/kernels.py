"""What a Pallas (Mosaic TPU) kernel is, as its serialised body states it: grid, blocks, semantics.

A `tpu_custom_call`'s backend_config carries the kernel as MLIR bytecode
(`custom_call_config.body`, base64): one `func.func` whose attributes give the grid
(`iteration_bounds`), each operand's and output's block (`window_params[i].window_bounds`, else
the whole array), the dimension semantics of each grid axis (`parallel`, `arbitrary`), the scratch
operands and the scalar-prefetch count. `tpudiag.parsers.mosaic` reads it with the MLIR bindings
jaxlib ships; nothing here is guessed from the HLO around the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.model.units import element_bytes


@dataclass(frozen=True)
class KernelBlock:
    """One operand, output or scratch buffer of a kernel, as one grid step sees it."""

    role: str  # 'input', 'output' or 'scratch'
    index: int  # position among the kernel's inputs, outputs or scratch buffers
    shape: tuple[int, ...]  # the block (window_bounds), or the whole array when it has no window
    dtype: str  # HLO spelling: bf16, f32, s32, pred, ...; `semaphore` for semaphores
    memory_space: str  # vmem, smem, any (left in HBM, copied by the kernel itself), semaphore_mem, ...
    windowed: bool  # a BlockSpec window the pipeline copies in per step; False: the whole array
    # The window's index map, one term per block index: `g<axis>` (that grid index) or an integer
    # literal; None without a window or when a block index is computed (`index_map_note` says why).
    index_map: tuple[str, ...] | None = None
    index_map_note: str = ""

    @property
    def nbytes(self) -> int | None:
        """Bytes of one block; None for a dtype without a known size (semaphores)."""
        size = element_bytes(self.dtype)
        return None if size is None else int(math.prod(self.shape) * size)

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape)) or "scalar"


@dataclass(frozen=True)
class MosaicKernel:
    """One Mosaic TPU kernel: the facts its serialised body states."""

    name: str  # the kernel function's symbol (`_kernel`)
    grid: tuple[int, ...]  # iteration bounds, outermost first
    dimension_semantics: tuple[str, ...]  # per grid axis: parallel, arbitrary (core_parallel, ...)
    blocks: tuple[KernelBlock, ...]  # inputs, then outputs, then scratch
    scalar_prefetch: int = 0
    source_file: str = ""  # the kernel body's file, from the body's locations; '' when it has none
    first_line: int = 0  # the body's first and last source lines; 0 when unknown
    last_line: int = 0
    matmul_ops: int = 0  # MXU matmuls (`tpu.matmul`) in the body
    # The top-level function around the `pallas_call` (the custom call's source line), when its file
    # is here: `lab tune` target `file.py:FN`, its keyword parameters, and whether the module has the
    # `example_args` that `lab tune` compiles it on ('' / () / False when unknown).
    caller: str = ""
    caller_params: tuple[str, ...] = ()
    caller_example_args: bool = False

    @property
    def matmul_blocks(self) -> tuple[int, int, int] | None:
        """(block_m, block_k, block_n) when the body multiplies on the MXU and its two 2-D input
        blocks and one 2-D output block compose as [bm, bk] x [bk, bn] -> [bm, bn]; None otherwise."""
        ins, outs = [b.shape for b in self.of("input")], [b.shape for b in self.of("output")]
        if self.matmul_ops < 1 or len(ins) != 2 or len(outs) != 1 or not all(len(s) == 2 for s in (*ins, *outs)):
            return None
        (bm, bk), (bk2, bn), out = ins[0], ins[1], outs[0]
        return (bm, bk, bn) if bk == bk2 and out == (bm, bn) else None

    def of(self, role: str) -> tuple[KernelBlock, ...]:
        return tuple(b for b in self.blocks if b.role == role)

    @property
    def grid_text(self) -> str:
        return "(" + ",".join(map(str, self.grid)) + ")"

    @property
    def steps(self) -> int:
        return math.prod(self.grid)

    @property
    def source_text(self) -> str:
        """`file:first-last`, or '' when the body carries no location."""
        if not self.source_file:
            return ""
        lines = f"{self.first_line}" if self.last_line in (0, self.first_line) else f"{self.first_line}-{self.last_line}"
        return f"{self.source_file}:{lines}"

    @property
    def source_name(self) -> str:
        """`pallas_matmul.py:27-35`: `source_text` with the file's name only, as reports print sources."""
        return self.source_text.rsplit("/", 1)[-1]

    def blocks_text(self) -> str:
        """`in 512x512 bf16, 512x512 bf16; out 512x512 bf16; scratch 512x512 f32 vmem`."""
        parts = []
        for role, label in (("input", "in"), ("output", "out"), ("scratch", "scratch")):
            blocks = self.of(role)
            if blocks:
                shown = ", ".join(f"{b.shape_text} {b.dtype}" + ("" if b.windowed or role == "scratch" else " whole")
                                  + (f" {b.memory_space}" if role == "scratch" else "") for b in blocks)
                parts.append(f"{label} {shown}")
        return "; ".join(parts)

    def semantics_text(self) -> str:
        return ",".join(self.dimension_semantics)

    def describe(self) -> str:
        """One line: `` `_kernel` grid (4,4,4) parallel,parallel,arbitrary; blocks bm x bk x bn 512x512x512;
        in 512x512 bf16, ...``."""
        mm = self.matmul_blocks
        blocks = f"blocks bm x bk x bn {'x'.join(map(str, mm))}; " if mm is not None else ""
        semantics = f" {self.semantics_text()}" if self.dimension_semantics else ""
        return f"`{self.name}` grid {self.grid_text}{semantics}; {blocks}{self.blocks_text()}"

    def to_json(self) -> dict:
        return {"name": self.name, "grid": list(self.grid), "dimension_semantics": list(self.dimension_semantics),
                "scalar_prefetch": self.scalar_prefetch, "source_file": self.source_file,
                "first_line": self.first_line, "last_line": self.last_line, "matmul_ops": self.matmul_ops,
                "caller": self.caller, "caller_params": list(self.caller_params),
                "caller_example_args": self.caller_example_args,
                "matmul_blocks": list(self.matmul_blocks) if self.matmul_blocks else None,
                "blocks": [{"role": b.role, "index": b.index, "shape": list(b.shape), "dtype": b.dtype,
                            "memory_space": b.memory_space, "windowed": b.windowed, "bytes": b.nbytes,
                            "index_map": list(b.index_map) if b.index_map is not None else None,
                            "index_map_note": b.index_map_note}
                           for b in self.blocks]}


@dataclass(frozen=True)
class BlockHalving:
    """Halving one block dim of a matmul kernel, and the vector tiles of one grid step it halves:
    A (bm x bk) and B (bk x bn), each in its own input's dtype, and the f32 product (bm x bn)."""

    dim: str  # block_m, block_k or block_n
    before: int
    after: int
    tiles: tuple[str, ...]  # the tiles it halves, e.g. ("B 512x512 bf16", "the f32 product 512x512")
    tiles_bytes: int  # those tiles' bytes before
    step_bytes: int  # every tile of a step, before

    def text(self) -> str:
        return (f"{self.dim} {self.before} -> {self.after} halves {' and '.join(self.tiles)} "
                f"({self.tiles_bytes / 2**20:.2f} -> {self.tiles_bytes / 2**21:.2f} MiB of the step's "
                f"{self.step_bytes / 2**20:.2f} MiB of vector values)")


def halving(kernel: MosaicKernel) -> BlockHalving | None:
    """The block dim of a matmul kernel whose halving shrinks one step's vector tiles most, where
    half of it stays a multiple of 128 (the lane width); None for another kernel or no such dim."""
    mm = kernel.matmul_blocks
    if mm is None:
        return None
    lhs, rhs = (b.dtype for b in kernel.of("input"))  # a matmul's blocks: exactly two inputs
    size_a, size_b = element_bytes(lhs), element_bytes(rhs)
    if size_a is None or size_b is None:
        return None
    bm, bk, bn = mm
    a, b, acc = bm * bk * size_a, bk * bn * size_b, bm * bn * 4
    tiles = {"block_m": (bm, (f"A {bm}x{bk} {lhs}", a), (f"the f32 product {bm}x{bn}", acc)),
             "block_k": (bk, (f"A {bm}x{bk} {lhs}", a), (f"B {bk}x{bn} {rhs}", b)),
             "block_n": (bn, (f"B {bk}x{bn} {rhs}", b), (f"the f32 product {bm}x{bn}", acc))}
    best = None
    for dim in ("block_n", "block_m", "block_k"):  # ties: the output's dims first (the product is f32)
        value, *parts = tiles[dim]
        if value % 256:
            continue
        freed = int(sum(n for _, n in parts))
        if best is None or freed > best.tiles_bytes:
            best = BlockHalving(dim, value, value // 2, tuple(t for t, _ in parts), freed, int(a + b + acc))
    return best


# How a user's function may spell a matmul block dim's keyword, most common first.
_BLOCK_KEYWORDS = {"block_m": ("bm", "block_m", "tm", "tile_m", "blk_m", "block_size_m"),
                   "block_k": ("bk", "block_k", "tk", "tile_k", "blk_k", "block_size_k"),
                   "block_n": ("bn", "block_n", "tn", "tile_n", "blk_n", "block_size_n")}


def tune_command(kernel: MosaicKernel, dim: str, values: tuple[int, ...] = ()) -> str:
    """The `tpudiag lab tune` line that compiles `values` (`V1,V2` when none) of one block dim of the
    kernel deviceless: with the function around its `pallas_call` and that function's keyword for
    the dim filled in when its source is here, else with `MODULE:FN` / `NAME` and what to
    substitute for them."""
    import shlex

    keyword = next((k for k in _BLOCK_KEYWORDS.get(dim, ()) if k in kernel.caller_params), "")
    target = shlex.quote(kernel.caller) if kernel.caller else "MODULE:FN"
    line = f"`tpudiag lab tune {target} --param {keyword or 'NAME'}={','.join(map(str, values)) or 'V1,V2'}`"
    todo = []
    if not kernel.caller:
        todo.append("MODULE:FN: the file and the function that call `pallas_call`")
    if not keyword:
        whose = "its" if kernel.caller else "that function's"
        todo.append(f"NAME: {whose} keyword argument for {dim}")
    if kernel.caller and not kernel.caller_example_args:
        todo.append("the module needs `example_args(mesh)`, the arguments it is compiled on")
    return line + (f" ({'; '.join(todo)})" if todo else "")


def mxu_block_fix(kernel: MosaicKernel, mxu_dim: int, spills: int) -> str | None:
    """The fix a low MXU utilization of a Pallas matmul kernel takes from its blocks (bm x bk x bn),
    first cause first: block_k or block_n off the MXU's multiple (the systolic array's weight tile
    is mxu_dim x mxu_dim; rows stream, so block_m is not judged); blocks that spill (halve the one
    that frees most); else a larger block_k (half the grid's k steps, and of the f32 accumulator's
    loads and stores per MXU pass). None for a kernel whose blocks do not compose as a matmul."""
    mm = kernel.matmul_blocks
    if mm is None:
        return None
    bm, bk, bn = mm
    off = [(dim, v) for dim, v in (("block_k", bk), ("block_n", bn)) if v % mxu_dim]
    if off:
        dim, v = off[0]
        up = -(-v // mxu_dim) * mxu_dim
        return (f"{dim} {v} -> {up}: the MXU's weight tile is {mxu_dim}x{mxu_dim}, and a block off its multiple "
                f"leaves MXU columns idle; compare deviceless with {tune_command(kernel, dim, (v, up))}")
    half = halving(kernel) if spills > 0 else None
    if half is not None:
        return (f"smaller blocks, as the kernel spills: {half.text()}; compare deviceless with "
                f"{tune_command(kernel, half.dim, (half.after, half.before))}")
    return (f"a larger block_k: {bk} -> {2 * bk} halves the grid's k steps and the f32 accumulator's "
            f"({bm}x{bn}) loads and stores per MXU pass, where the double-buffered blocks still fit the scoped "
            f"VMEM; compare deviceless with {tune_command(kernel, 'block_k', (bk, 2 * bk))}")


@dataclass(frozen=True)
class UnitShare:
    """One unit's use in a kernel's static bundles, as the LLO bundle profile counts it: the share of
    the unit's slots its bundles issue (loop bodies once); an indexed unit (MXU_i, XLU_i) is the mean
    over its instances of the sum over its ops (`matmul`, `matmul_packed`, ... are one slot's modes)."""

    unit: str  # `MXU matmul`, `XLU`, or the profile's own name: VECTOR_ALU, VECTOR_LOAD_AND_MISC, ...
    fraction: float


@dataclass(frozen=True)
class KernelView:
    """A Pallas kernel of the report: its facts, its VMEM against the scoped limit, and what the
    LLO dump says of its bundles (None where the input has no LLO dump). Every figure is the
    compiler's (static), none measured."""

    op: str
    program: str
    kernel: MosaicKernel
    call_site: str = ""  # `file.py:LINE` of the `pallas_call` (the custom call's metadata)
    vmem_used_bytes: int | None = None  # `used_scoped_memory_configs` (VMEM) of the compiled call
    vmem_limit_bytes: int | None = None  # the scoped VMEM limit (`ProgramMemory.vmem_scoped_limit_bytes`)
    vmem_limit_source: str = ""  # `default for v5e, measured` or `compiler error`
    estimated_cycles: int | None = None
    bundles: int | None = None  # static bundles (the bundle profile's counter lines' denominator)
    units: tuple[UnitShare, ...] = ()
    spill_stores: int | None = None
    spill_fills: int | None = None
    # The kernel's LLO program's `final_bundles` (None without them): bundles that start a DMA and
    # bundles that wait on one, of `final_bundles` bundles; and the static profile's DMA type
    # (`LOCAL`, `LOCAL_AND_REMOTE`, `NONE`; '' without it). No dump gives a kernel's critical path.
    final_bundles: int | None = None
    dma_issue_bundles: int | None = None
    dma_wait_bundles: int | None = None
    dma_instruction_type: str = ""

    def lines(self) -> list[str]:
        """What the terminal and markdown print under the kernel's op name."""
        k = self.kernel
        out = [k.describe()]
        where = [w for w in (f"body {k.source_name}" if k.source_file else "",
                             f"called at {self.call_site}" if self.call_site else "") if w]
        if where:
            out.append(", ".join(where))
        if self.vmem_used_bytes is not None:
            limit = (f" of the {self.vmem_limit_bytes / 2**20:.0f} MiB scoped limit ({self.vmem_limit_source}; "
                     f"{self.vmem_used_bytes / self.vmem_limit_bytes:.0%})" if self.vmem_limit_bytes else "")
            out.append(f"scoped VMEM {self.vmem_used_bytes / 2**20:.2f} MiB{limit} (compiler)")
        llo = []
        if self.bundles is not None:
            llo.append(f"{self.bundles:,} static bundles")
        if self.units:
            llo.append("slots used: " + ", ".join(f"{u.unit} {u.fraction:.0%}" for u in self.units))
        if self.spill_stores is not None:
            llo.append(f"spills {self.spill_stores}, fills {self.spill_fills}")
        if llo:
            out.append("; ".join(llo) + " (LLO static profile)")
        dma = []
        if self.final_bundles:
            dma.append(f"DMA started in {self.dma_issue_bundles:,} of {self.final_bundles:,} final bundles "
                       f"({self.dma_issue_bundles / self.final_bundles:.1%}), waited on in {self.dma_wait_bundles:,} "
                       "(LLO final_bundles)")
        if self.dma_instruction_type:
            dma.append(f"DMA type {self.dma_instruction_type} (static profile)")
        if dma:
            out.append("; ".join(dma))
        return out

    def to_json(self) -> dict:
        return {"op": self.op, "program": self.program, "kernel": self.kernel.to_json(), "call_site": self.call_site,
                "vmem_used_bytes": self.vmem_used_bytes, "vmem_limit_bytes": self.vmem_limit_bytes,
                "vmem_limit_source": self.vmem_limit_source,
                "estimated_cycles": self.estimated_cycles, "bundles": self.bundles,
                "units": [{"unit": u.unit, "fraction": u.fraction} for u in self.units],
                "spill_stores": self.spill_stores, "spill_fills": self.spill_fills,
                "final_bundles": self.final_bundles, "dma_issue_bundles": self.dma_issue_bundles,
                "dma_wait_bundles": self.dma_wait_bundles, "dma_instruction_type": self.dma_instruction_type}
