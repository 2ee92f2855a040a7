"""Reductions: row-wise over the minor dim (softmax, layernorm, rmsnorm, a plain row sum) and a sum
over a non-minor dim (`colsum`).

Row ops: each grid step holds `block_rows` whole rows in VMEM (the reduced dim is never split, so the
block's minor dim is always the full row), computes in f32 and writes the rows back. Grid `(R/br,)`,
semantics ("parallel",): rows are independent, and a partial last block is fine because its
out-of-range rows are never written.

`colsum`: x[outer, rows, cols] summed over `rows` (a non-minor dim, e.g. a bias gradient over the
batch) -> out[outer, cols]. Grid `(outer, R/br)`, ("parallel", "arbitrary"): each step adds a
`block_rows x cols` slab into an f32 VMEM accumulator along the sublanes; rows past the end of a
partial last block are masked to 0 (they would add padding garbage). The output block is the last
step's accumulator, `(1, 1, cols)` of a 3-D result (a (1, cols) block of a 2-D one would break the
(8,128) rule).
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
from tpudiag.kernels_lab.problems.reduction import Problem  # repro: inlined

FAMILY = "reduction"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI
EPS = 1e-6


@dataclass(frozen=True)
class BlockSizes:
    """Whole rows per grid step."""

    block_rows: int

    def vmem_bytes(self, p: Problem) -> int:
        """Double-buffered in/out blocks and parameter rows, plus one f32 working copy of the block
        (an estimate of the compiler's temporaries)."""
        if p.op == "colsum":  # input slab and output row double-buffered, one f32 accumulator row (8 sublanes)
            return 2 * (self.block_rows * p.cols * itemsize(p.dtype) + p.cols * itemsize(p.out_dtype)) \
                + 8 * p.cols * 4
        blocks = self.block_rows * (p.cols * itemsize(p.dtype) + p.out_cols * itemsize(p.out_dtype))
        blocks += p.n_params * p.cols * itemsize(p.dtype)
        return 2 * blocks + self.block_rows * p.cols * 4

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        check_minor_dims("x block (block_rows, cols)", (self.block_rows, p.cols), (p.rows, p.cols))
        check_vmem(f"{p.op} block_rows={self.block_rows}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, ...]:
        if p.op == "colsum":
            return (p.outer, cdiv(p.rows, self.block_rows))
        return (cdiv(p.rows, self.block_rows),)

    def label(self) -> str:
        return f"rows={self.block_rows}"


def _rowwise(x, params, op: str):
    """The math, shared by kernel and reference: x is f32 [r, c], params f32 [1, c] each."""
    if op == "softmax":
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)
    if op == "sum":
        return jnp.sum(x, axis=-1, keepdims=True)
    if op == "rmsnorm":
        (gamma,) = params
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * gamma
    gamma, beta = params
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + EPS) * gamma + beta


def reference(p: Problem, x, *params):
    """What XLA computes for the op, in plain JAX (f32 inside, one convert at the end)."""
    if p.op == "colsum":
        return jnp.sum(x.astype(jnp.float32), axis=1).astype(p.out_dtype)
    f32 = [v.astype(jnp.float32).reshape(1, p.cols) for v in params]
    return _rowwise(x.astype(jnp.float32), f32, p.op).astype(p.out_dtype)


def _kernel(x_ref, *refs, op: str, n_params: int):
    param_refs, o_ref = refs[:n_params], refs[n_params]
    params = [r[...].astype(jnp.float32) for r in param_refs]
    o_ref[...] = _rowwise(x_ref[...].astype(jnp.float32), params, op).astype(o_ref.dtype)


def _colsum_kernel(x_ref, o_ref, acc_ref, *, rows: int, block_rows: int):
    step = pl.program_id(1)

    @pl.when(step == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[0].astype(jnp.float32)
    if rows % block_rows:  # the partial last block: rows past the end hold padding, not data
        row = step * block_rows + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        x = jnp.where(row < rows, x, 0.0)
    acc_ref[...] += jnp.sum(x, axis=0, keepdims=True)

    @pl.when(step == pl.num_programs(1) - 1)
    def _store():
        o_ref[0] = acc_ref[...].astype(o_ref.dtype)


def _colsum(x, p: Problem, blocks: BlockSizes, interpret, vmem_limit_bytes):
    br = blocks.block_rows
    out = pl.pallas_call(
        functools.partial(_colsum_kernel, rows=p.rows, block_rows=br),
        out_shape=jax.ShapeDtypeStruct((p.outer, 1, p.cols), p.out_dtype),
        grid=blocks.grid(p),
        in_specs=[pl.BlockSpec((1, br, p.cols), lambda o, i: (o, i, 0))],
        out_specs=pl.BlockSpec((1, 1, p.cols), lambda o, i: (o, 0, 0)),
        scratch_shapes=[pltpu.VMEM((1, p.cols), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=p.flops, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(x)
    return out.reshape(p.outer, p.cols)


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(x, *params, p: Problem, blocks: BlockSizes, interpret: bool = False,
           vmem_limit_bytes: int | None = None):
    if p.op == "colsum":
        return _colsum(x, p, blocks, interpret, vmem_limit_bytes)
    br = blocks.block_rows
    in_specs = [pl.BlockSpec((br, p.cols), lambda i: (i, 0))]
    in_specs += [pl.BlockSpec((1, p.cols), lambda i: (0, 0)) for _ in range(p.n_params)]
    return pl.pallas_call(
        functools.partial(_kernel, op=p.op, n_params=p.n_params),
        out_shape=jax.ShapeDtypeStruct((p.rows, p.out_cols), p.out_dtype),
        grid=blocks.grid(p),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((br, p.out_cols), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=p.flops, transcendentals=p.rows * p.cols if p.op == "softmax" else 0,
                                      bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(x, *[v.reshape(1, p.cols) for v in params])


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    return [(p.in_shape, p.dtype)] + [((p.cols,), p.dtype)] * p.n_params


def make_inputs(p: Problem, seed: int = 0) -> list:
    keys = jax.random.split(jax.random.PRNGKey(seed), 1 + p.n_params)
    x = (3.0 * jax.random.normal(keys[0], p.in_shape, jnp.float32)).astype(p.dtype)
    params = [(1.0 + 0.1 * jax.random.normal(k, (p.cols,), jnp.float32)).astype(p.dtype) for k in keys[1:]]
    return [x, *params]


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """What this kernel moves between HBM and VMEM, whatever the blocks: `Problem.min_hbm_bytes`."""
    return p.min_hbm_bytes


def fit(p: Problem, block_rows: int) -> BlockSizes:
    return BlockSizes(fit_dim(block_rows, p.rows, 8))


# Tuned VMEM budget per generation, sorted: the most rows whose `vmem_bytes` fit it. From deviceless
# sweeps of a bf16 softmax over 8192x4096 (compiler estimates, libtpu 0.0.42.1, docs/kernels-lab.md):
# v5e best at rows=256 (12 MiB; 512 rows break the 16 MiB scoped limit), v6e at rows=512 (24 MiB,
# scoped limit 32 MiB). The safe default (3 MiB) fits every generation's scoped limit.
TUNED: tuple[tuple[str, int], ...] = (("v5e", 12 << 20), ("v6e", 24 << 20))
SAFE_VMEM_BYTES = 3 << 20


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    budget = dict(TUNED).get(generation, SAFE_VMEM_BYTES)
    per_row = BlockSizes(1).vmem_bytes(p) - BlockSizes(0).vmem_bytes(p)
    fixed = BlockSizes(0).vmem_bytes(p)
    return fit(p, max(8, (budget - fixed) // per_row))


def candidates(p: Problem) -> list[BlockSizes]:
    seen, out = set(), []
    for rows in (1024, 512, 256, 128, 64, 32, 16, 8):
        b = fit(p, rows)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out
