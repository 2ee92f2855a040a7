"""Memory-bound elementwise fusions: `out = convert(activation(sum_i c_i * x_i))` over n inputs.

A loop fusion's body is rarely known from a profile, so this is a stand-in with the same traffic:
n same-shaped inputs read once, one output written once, a few VPU ops per element (`c_i = 2**-i`;
one input with no activation is a copy). 2-D blocks `(block_rows, block_cols)`; grid
`(R/br, C/bc)`, both "parallel"; partial edge blocks are fine (never written out of range).
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
from tpudiag.kernels_lab.problems.elementwise import Problem  # repro: inlined

FAMILY = "elementwise"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI


@dataclass(frozen=True)
class BlockSizes:
    block_rows: int
    block_cols: int

    def vmem_bytes(self, p: Problem) -> int:
        """n input blocks and one output block, each double-buffered."""
        elems = self.block_rows * self.block_cols
        return 2 * elems * (p.n_inputs * itemsize(p.dtype) + itemsize(p.out_dtype))

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        check_minor_dims("block (block_rows, block_cols)", (self.block_rows, self.block_cols), (p.rows, p.cols))
        check_vmem(f"elementwise blocks {self.block_rows}x{self.block_cols}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, int]:
        return (cdiv(p.rows, self.block_rows), cdiv(p.cols, self.block_cols))

    def label(self) -> str:
        return f"rows={self.block_rows} cols={self.block_cols}"


def _body(xs, activation: str):
    y = xs[0].astype(jnp.float32)
    for i, x in enumerate(xs[1:], start=1):
        y = y + (2.0 ** -i) * x.astype(jnp.float32)
    if activation == "gelu":
        return jax.nn.gelu(y, approximate=True)
    if activation == "relu":
        return jnp.maximum(y, 0.0)
    if activation == "silu":
        return y / (1.0 + jnp.exp(-y))
    return y


def reference(p: Problem, *xs):
    return _body(xs, p.activation).astype(p.out_dtype)


def _kernel(*refs, activation: str):
    *in_refs, o_ref = refs
    o_ref[...] = _body([r[...] for r in in_refs], activation).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(*xs, p: Problem, blocks: BlockSizes, interpret: bool = False, vmem_limit_bytes: int | None = None):
    spec = pl.BlockSpec((blocks.block_rows, blocks.block_cols), lambda i, j: (i, j))
    return pl.pallas_call(
        functools.partial(_kernel, activation=p.activation),
        out_shape=jax.ShapeDtypeStruct((p.rows, p.cols), p.out_dtype),
        grid=blocks.grid(p),
        in_specs=[spec] * p.n_inputs,
        out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=p.flops, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(*xs)


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    return [((p.rows, p.cols), p.dtype)] * p.n_inputs


def make_inputs(p: Problem, seed: int = 0) -> list:
    keys = jax.random.split(jax.random.PRNGKey(seed), p.n_inputs)
    return [jax.random.normal(k, (p.rows, p.cols), jnp.float32).astype(p.dtype) for k in keys]


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """What this kernel moves between HBM and VMEM, whatever the blocks: `Problem.min_hbm_bytes`."""
    return p.min_hbm_bytes


def fit(p: Problem, block_rows: int, block_cols: int) -> BlockSizes:
    return BlockSizes(fit_dim(block_rows, p.rows, 8), fit_dim(block_cols, p.cols, 128))


# Tuned (generation, block_cols, VMEM budget), sorted: as many rows of block_cols as fit the budget.
# From deviceless sweeps of a 2-input f32 4096x4096 fusion (compiler estimates, libtpu 0.0.42.1,
# docs/kernels-lab.md): v5e best at 512x1024 (12 MiB; 24 MiB blocks break the 16 MiB scoped
# limit), v6e at 512x2048 (24 MiB). The safe default (256x1024 bf16 x 2 inputs: 3 MiB) fits all.
TUNED: tuple[tuple[str, int, int], ...] = (("v5e", 1024, 12 << 20), ("v6e", 2048, 24 << 20))
SAFE_DEFAULT = (1024, 3 << 20)


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    cols, budget = next(((c, b) for gen, c, b in TUNED if gen == generation), SAFE_DEFAULT)
    cols = min(cols, p.cols)
    per_row = BlockSizes(1, cols).vmem_bytes(p)
    return fit(p, max(8, budget // per_row), cols)


def candidates(p: Problem) -> list[BlockSizes]:
    raw = [(512, 2048), (1024, 1024), (512, 1024), (256, 2048), (256, 1024), (256, 512), (128, 1024),
           (128, 512), (64, 512), (64, 128), (8, 128)]
    seen, out = set(), []
    for sizes in raw:
        b = fit(p, *sizes)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out
