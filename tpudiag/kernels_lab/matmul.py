"""Matmul with a fused epilogue: `convert(activation(x @ w + bias))`, f32 accumulation in VMEM.

Grid `(M/bm, N/bn, K/bk)` with semantics ("parallel", "parallel", "arbitrary"): the K axis is the
reduction and must stay sequential on one core; M and N blocks are independent. M and N may end in
a partial block (its out-of-range rows/cols are never written); K blocks must divide K, since a
partial K block would add padding into the accumulator.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import (  # repro: inlined
    cdiv, check_divides, check_minor_dims, check_vmem, fit_dim, itemsize, matmul_traffic)
from tpudiag.kernels_lab.problems.matmul import Problem  # repro: inlined

FAMILY = "matmul"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI


@dataclass(frozen=True)
class BlockSizes:
    """Block of M rows, K depth and N columns per grid step."""

    block_m: int
    block_k: int
    block_n: int

    def vmem_bytes(self, p: Problem) -> int:
        """Double-buffered x, w, (bias) and out blocks plus the single f32 accumulator."""
        in_b, out_b = itemsize(p.in_dtype), itemsize(p.out_dtype)
        blocks = (self.block_m * self.block_k + self.block_k * self.block_n) * in_b
        blocks += self.block_m * self.block_n * out_b
        if p.bias:
            blocks += self.block_n * in_b
        return 2 * blocks + self.block_m * self.block_n * 4

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        check_minor_dims("x block (block_m, block_k)", (self.block_m, self.block_k), (p.m, p.k))
        check_minor_dims("w block (block_k, block_n)", (self.block_k, self.block_n), (p.k, p.n))
        check_divides("block_k", self.block_k, p.k)
        check_vmem(f"matmul blocks {self.block_m},{self.block_k},{self.block_n}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, int, int]:
        return (cdiv(p.m, self.block_m), cdiv(p.n, self.block_n), p.k // self.block_k)

    def label(self) -> str:
        return f"bm={self.block_m} bk={self.block_k} bn={self.block_n}"


def _activate(y, activation: str):
    if activation == "gelu":
        return jax.nn.gelu(y, approximate=True)
    if activation == "relu":
        return jnp.maximum(y, 0.0)
    if activation == "silu":
        return y / (1.0 + jnp.exp(-y))
    return y


def reference(p: Problem, x, w, bias=None):
    """What XLA computes for the op: dot in f32, epilogue in f32, one final convert."""
    y = jnp.dot(x, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    if p.bias:
        y = y + bias.astype(jnp.float32)
    return _activate(y, p.activation).astype(p.out_dtype)


def _kernel(x_ref, w_ref, *refs, activation: str, has_bias: bool):
    if has_bias:
        b_ref, o_ref, acc_ref = refs
    else:
        (o_ref, acc_ref), b_ref = refs, None
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _epilogue():
        y = acc_ref[...]
        if has_bias:
            y = y + b_ref[...].astype(jnp.float32)
        o_ref[...] = _activate(y, activation).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(x, w, bias=None, *, p: Problem, blocks: BlockSizes, interpret: bool = False,
           vmem_limit_bytes: int | None = None):
    """The Pallas kernel; `p` and `blocks` are static (one compile per configuration)."""
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    in_specs = [pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))]
    operands = [x, w]
    if p.bias:
        in_specs.append(pl.BlockSpec((1, bn), lambda i, j, k: (0, j)))
        operands.append(bias.reshape(1, p.n))
    return pl.pallas_call(
        functools.partial(_kernel, activation=p.activation, has_bias=p.bias),
        out_shape=jax.ShapeDtypeStruct((p.m, p.n), p.out_dtype),
        grid=blocks.grid(p),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=p.flops, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(*operands)


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    structs = [((p.m, p.k), p.in_dtype), ((p.k, p.n), p.in_dtype)]
    if p.bias:
        structs.append(((p.n,), p.in_dtype))
    return structs


def make_inputs(p: Problem, seed: int = 0) -> list:
    """Inputs scaled so outputs stay O(1) whatever K is (keeps tolerances meaningful)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(keys[0], (p.m, p.k), jnp.float32).astype(p.in_dtype)
    w = (jax.random.normal(keys[1], (p.k, p.n), jnp.float32) / np.sqrt(p.k)).astype(p.in_dtype)
    arrays = [x, w]
    if p.bias:
        arrays.append(jax.random.normal(keys[2], (p.n,), jnp.float32).astype(p.in_dtype))
    return arrays


def hbm_bytes(p: Problem, blocks: BlockSizes) -> int:
    """Bytes the blocking moves between HBM and VMEM (`matmul_traffic` of its grid)."""
    return matmul_traffic(p.m, p.k, p.n, p.in_dtype, p.out_dtype, blocks.grid(p), p.bias)


def _fit_k(block: int, k: int) -> int:
    """The largest multiple of 128 not above `block` that divides K, else K itself."""
    b = min(block, k) // 128 * 128
    while b >= 128:
        if k % b == 0:
            return b
        b -= 128
    return k


def fit(p: Problem, block_m: int, block_k: int, block_n: int) -> BlockSizes:
    """Nearest legal block sizes for this problem (clamped to dims, K block dividing K)."""
    return BlockSizes(fit_dim(block_m, p.m, 8), _fit_k(block_k, p.k), fit_dim(block_n, p.n, 128))


# Tuned configurations: (generation, smallest of M/K/N at least, (bm, bk, bn)), sorted.
# Source: the compiler's estimated cycles for a 2048^3 bf16 matmul on each generation
# (`shared/reference/tpu-compiler-dumps.md` §8.2), i.e. compiler estimates, not measurements.
TUNED: tuple[tuple[str, int, tuple[int, int, int]], ...] = (
    ("v5e", 2048, (512, 2048, 512)),
    ("v5p", 2048, (512, 2048, 512)),
    ("v6e", 2048, (1024, 1024, 1024)),
)
SAFE_DEFAULT = (256, 512, 256)


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    smallest = min(p.m, p.k, p.n)
    chosen = SAFE_DEFAULT
    for gen, at_least, sizes in TUNED:
        if gen == generation and smallest >= at_least:
            chosen = sizes
    return fit(p, *chosen)


def candidates(p: Problem) -> list[BlockSizes]:
    """Sweep candidates, most promising first (bigger blocks, fewer grid steps), deduplicated."""
    raw = [(512, 2048, 512), (1024, 1024, 1024), (1024, 512, 1024), (512, 1024, 512), (512, 512, 512),
           (256, 2048, 256), (256, 1024, 512), (256, 512, 256), (256, 256, 256), (128, 512, 128),
           (128, 256, 256), (128, 128, 128), (2048, 512, 2048)]
    seen, out = set(), []
    for sizes in raw:
        b = fit(p, *sizes)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out
