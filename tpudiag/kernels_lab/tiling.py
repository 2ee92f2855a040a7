"""The (8,128) block rule and the VMEM budget, shared by every kernel family. Standard library only.

This module's body is also copied verbatim into each generated `repro.py`, so it must stay
self-contained: no imports from tpudiag, no jax.

Rule (Pallas TPU): a block's two minor dims must each be a multiple of the hardware tile, (8, 128)
on the second-minor and minor dim, or equal to the full array dim. bf16 packs 2 rows per 32-bit
sublane and its native tile is (16, 128), but the compiler accepts 8-row bf16 blocks and HBM
layouts pad packed rows only to 8 (measured: `shared/reference/tpu-compiler-dumps.md` §9), so the
hard rule is 8 for every dtype. An 8-row bf16 block compiles (deviceless, v6e: a bf16 softmax with
8-row blocks); whether it is fast is for the sweep to say.

VMEM: a pipelined block is double-buffered (two copies in flight per input and output), scratch is
single. The sum must fit the generation's VMEM; the compiler's scoped limit (16 MiB default on v5e)
is lower and is checked by compiling (`tpudiag lab tune`).
"""

from __future__ import annotations

SUBLANE = 8  # second-minor tile
LANE = 128  # minor tile
BUFFERING = 2  # pipeline buffers per blocked input/output

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "int32": 4, "uint32": 4}
_SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "s8", "int32": "s32", "uint32": "u32"}


class BlockSizeError(ValueError):
    """Block sizes that break the tiling rule or do not fit VMEM; the message shows expected vs actual."""


class OneDtype:
    """A problem that computes and writes in its input's `dtype` (copies, transposes, collectives):
    the two dtype properties every family's Problem provides, written once."""

    dtype: str

    @property
    def out_dtype(self) -> str:
        return self.dtype

    @property
    def compute_dtype(self) -> str:
        return self.dtype


def itemsize(dtype: str) -> int:
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        raise BlockSizeError(f"unsupported dtype {dtype!r}; expected one of {sorted(_ITEMSIZE)}") from None


def short_dtype(dtype: str) -> str:
    """`bfloat16` -> `bf16`, as HLO spells it."""
    return _SHORT_DTYPE.get(dtype, dtype)


def check_minor_dims(what: str, block: tuple[int, int], full: tuple[int, int]) -> None:
    """Raise unless `block` (second-minor, minor) obeys the (8,128) rule against array dims `full`."""
    (rows, cols), (full_rows, full_cols) = block, full
    for name, b, f in (("rows", rows, full_rows), ("cols", cols, full_cols)):
        if b <= 0:
            raise BlockSizeError(f"{what}: block {name} must be positive, got {b}")
        if b > f:
            raise BlockSizeError(f"{what}: block {name} {b} exceeds the array dim {f}; expected at most {f}")
    if rows != full_rows and rows % SUBLANE:
        raise BlockSizeError(f"{what}: block second-minor dim must be a multiple of {SUBLANE} or the full "
                             f"dim {full_rows}, got {rows}")
    if cols != full_cols and cols % LANE:
        raise BlockSizeError(f"{what}: block minor dim must be a multiple of {LANE} or the full dim "
                             f"{full_cols}, got {cols}")


def check_divides(what: str, block: int, full: int) -> None:
    """Raise unless `block` divides `full` (for dims whose padding would corrupt a reduction)."""
    if full % block:
        raise BlockSizeError(f"{what}: block {block} must divide the dim {full} (a partial block would add "
                             f"garbage to the reduction); expected a divisor of {full}")


def check_vmem(what: str, needed_bytes: int, vmem_bytes: int) -> None:
    """Raise when a kernel's buffers (double-buffered blocks plus scratch) exceed VMEM."""
    if needed_bytes > vmem_bytes:
        raise BlockSizeError(f"{what}: blocks need {needed_bytes / 2**20:.2f} MiB of VMEM "
                             f"({BUFFERING} buffers per blocked operand, plus scratch); "
                             f"expected at most {vmem_bytes / 2**20:.2f} MiB")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fit_dim(block: int, dim: int, unit: int) -> int:
    """The nearest legal block for one dim: `block` rounded down to the tiling unit (at least one
    unit), or the full dim when that reaches it."""
    b = max(unit, block // unit * unit)
    return dim if b >= dim else b


def scale_dim(d: int, factor: int) -> int:
    """One dim shrunk by `factor`, keeping its alignment class: a multiple of 128 stays a multiple
    of 128 (at least 128), of 8 stays of 8 (at least 8); a ragged dim stays ragged (ceil, nudged
    off a multiple of 8), so edge blocks and padding are still exercised."""
    if factor <= 1:
        return d
    for unit in (128, 8):
        if d % unit == 0:
            return max(unit, d // factor // unit * unit)
    scaled = max(1, -(-d // factor))
    return scaled + 1 if scaled > 8 and scaled % 8 == 0 else scaled


def matmul_traffic(m: int, k: int, n: int, in_dtype: str, out_dtype: str, grid: tuple[int, int, int],
                   bias: bool = False) -> int:
    """Bytes an (M/bm, N/bn, K/bk) matmul grid moves between HBM and VMEM: x is re-read once per N
    block and w once per M block, except that a block whose index does not change between
    consecutive grid steps is not fetched again (x when K fits one block). A (1, 1, 1) grid is the
    ideal kernel: each operand read once, the output written once."""
    gm, gn, gk = grid
    in_b = itemsize(in_dtype)
    x_reads = 1 if gk == 1 else gn
    total = m * k * in_b * x_reads + k * n * in_b * gm + m * n * itemsize(out_dtype)
    return total + (n * in_b * gm if bias else 0)
