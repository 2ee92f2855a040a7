"""Layout-changing copies: `{1,0}` -> `{0,1}` is, physically, a 2-D transpose.

XLA's `copy` of `bf16[R,C]{1,0}` into `bf16[R,C]{0,1}` keeps the logical shape and reorders memory;
plain JAX has no layouts, so the reproduction writes the physical result, `x.T` as a row-major
`[C, R]` array. Grid `(R/br, C/bc)`, both "parallel": block (i, j) of x becomes block (j, i) of the
output, so each block dim is a minor dim on one side and a second-minor dim on the other: both
must satisfy the (8,128) rule in both roles (in practice multiples of 128, or the full dim).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import (  # repro: inlined
    cdiv, check_minor_dims, check_vmem, fit_dim, itemsize)
from tpudiag.kernels_lab.problems.transpose import Problem  # repro: inlined

FAMILY = "transpose"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI


@dataclass(frozen=True)
class BlockSizes:
    block_rows: int
    block_cols: int

    def vmem_bytes(self, p: Problem) -> int:
        """Input and output blocks, each double-buffered."""
        return 2 * 2 * self.block_rows * self.block_cols * itemsize(p.dtype)

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        check_minor_dims("input block (block_rows, block_cols)", (self.block_rows, self.block_cols),
                         (p.rows, p.cols))
        check_minor_dims("output block (block_cols, block_rows)", (self.block_cols, self.block_rows),
                         (p.cols, p.rows))
        check_vmem(f"transpose blocks {self.block_rows}x{self.block_cols}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, int]:
        return (cdiv(p.rows, self.block_rows), cdiv(p.cols, self.block_cols))

    def label(self) -> str:
        return f"rows={self.block_rows} cols={self.block_cols}"


def reference(p: Problem, x):
    return jnp.transpose(x)


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(x, *, p: Problem, blocks: BlockSizes, interpret: bool = False, vmem_limit_bytes: int | None = None):
    br, bc = blocks.block_rows, blocks.block_cols
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((p.cols, p.rows), p.dtype),
        grid=blocks.grid(p),
        in_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bc, br), lambda i, j: (j, i)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(x)


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    return [((p.rows, p.cols), p.dtype)]


def make_inputs(p: Problem, seed: int = 0) -> list:
    return [jax.random.normal(jax.random.PRNGKey(seed), (p.rows, p.cols), jnp.float32).astype(p.dtype)]


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """What this kernel moves between HBM and VMEM, whatever the blocks: `Problem.min_hbm_bytes`."""
    return p.min_hbm_bytes


def fit(p: Problem, block_rows: int, block_cols: int) -> BlockSizes:
    # each block dim is a minor dim on one side of the transpose: 128-aligned or full
    return BlockSizes(fit_dim(block_rows, p.rows, 128), fit_dim(block_cols, p.cols, 128))


# Tuned (generation, VMEM budget), sorted: the biggest square block (multiple of 128) within it.
# Deviceless sweeps of a bf16 8192x4096 transpose (compiler estimates, libtpu 0.0.42.1): 1024x1024
# (8 MiB) best on both v5e and v6e. Safe default: 2 MiB (512x512 bf16).
TUNED: tuple[tuple[str, int], ...] = (("v5e", 8 << 20), ("v6e", 8 << 20))
SAFE_VMEM_BYTES = 2 << 20


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    budget = dict(TUNED).get(generation, SAFE_VMEM_BYTES)
    side = 128
    while BlockSizes(2 * side, 2 * side).vmem_bytes(p) <= budget and 2 * side <= max(p.rows, p.cols):
        side *= 2
    return fit(p, side, side)


def candidates(p: Problem) -> list[BlockSizes]:
    seen, out = set(), []
    for sizes in [(1024, 1024), (512, 1024), (1024, 512), (512, 512), (256, 512), (256, 256), (128, 256),
                  (128, 128)]:
        b = fit(p, *sizes)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out
