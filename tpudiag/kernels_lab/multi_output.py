"""Multi-output fusions: one Pallas kernel with a tuple `out_shape`, each output checked on its own.

XLA fuses producers that share inputs into one fusion returning a tuple. On TPU the hottest ones
are async collective fusions: a matmul (output 0) that also threads its collective's buffers and
sync flags through (the other outputs, aliased to operands by `output_to_operand_aliasing`).

The reproduction keeps the tuple's array outputs and their roles:

- `primary`: the fusion's compute, a matmul `x[m,k] @ w[k,n]` (f32 accumulator) or, for loop
  fusions, an elementwise sum of n inputs of [m, n]; grid `(M/bm, N/bn, K/bk)`.
- `carried` extras: buffers aliased to an operand (the collective's in-flight data). They stay in
  HBM (`pl.ANY`) and are aliased input -> output (`input_output_aliases`), untouched, as on one chip
  the collective's DMA step that writes them does not exist (the collective family reproduces it).
- `computed` extras: other array outputs of the fusion, whose body a profile rarely shows; a
  stand-in `2 * e` of their own input, one whole-array block (written at every grid step, so the
  grid runs "arbitrary": no core split races on it).

Scalar outputs (sync flags, `s32[2]` indices) are collective state, not reproduced.
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
    BlockSizeError, cdiv, check_divides, check_minor_dims, check_vmem, fit_dim, itemsize)
from tpudiag.kernels_lab.problems.multi_output import Problem  # repro: inlined

FAMILY = "multi_output"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI


@dataclass(frozen=True)
class BlockSizes:
    block_m: int
    block_k: int  # the matmul's K block; 1 for elementwise
    block_n: int

    def vmem_bytes(self, p: Problem) -> int:
        in_b, out_b = itemsize(p.in_dtype), itemsize(p.out_dtype)
        if p.kind == "matmul":
            blocks = (self.block_m * self.block_k + self.block_k * self.block_n) * in_b
            scratch = self.block_m * self.block_n * 4
        else:
            blocks, scratch = p.n_inputs * self.block_m * self.block_n * in_b, 0
        blocks += self.block_m * self.block_n * out_b
        blocks += sum(2 * r * c * itemsize(d) for r, c, d, role in p.extras if role == "computed")
        return 2 * blocks + scratch

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        check_minor_dims("primary output block (block_m, block_n)", (self.block_m, self.block_n), (p.m, p.n))
        if p.kind == "matmul":
            check_minor_dims("x block (block_m, block_k)", (self.block_m, self.block_k), (p.m, p.k))
            check_divides("block_k", self.block_k, p.k)
        elif self.block_k != 1:
            raise BlockSizeError(f"elementwise primary: block_k must be 1, got {self.block_k}")
        check_vmem(f"multi-output blocks {self.label()}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, int, int]:
        gk = p.k // self.block_k if p.kind == "matmul" else 1
        return (cdiv(p.m, self.block_m), cdiv(p.n, self.block_n), gk)

    def label(self) -> str:
        return f"bm={self.block_m} bk={self.block_k} bn={self.block_n}"


def _primary_inputs(p: Problem) -> list[tuple[tuple[int, int], str]]:
    if p.kind == "matmul":
        return [((p.m, p.k), p.in_dtype), ((p.k, p.n), p.in_dtype)]
    return [((p.m, p.n), p.in_dtype)] * p.n_inputs


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    return _primary_inputs(p) + [((r, c), d) for r, c, d, _role in p.extras]


def make_inputs(p: Problem, seed: int = 0) -> list:
    structs = input_structs(p)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(structs))
    arrays = []
    for i, (key, (shape, dtype)) in enumerate(zip(keys, structs, strict=True)):
        x = jax.random.normal(key, shape, jnp.float32)
        if p.kind == "matmul" and i == 1:
            x = x / np.sqrt(p.k)  # keeps outputs O(1) whatever K is
        arrays.append(x.astype(dtype))
    return arrays


def _elementwise(xs):
    y = xs[0].astype(jnp.float32)
    for i, x in enumerate(xs[1:], start=1):
        y = y + (2.0 ** -i) * x.astype(jnp.float32)
    return y


def reference(p: Problem, *args):
    n_primary = len(_primary_inputs(p))
    prim, extras = args[:n_primary], args[n_primary:]
    if p.kind == "matmul":
        y = jnp.dot(prim[0], prim[1], preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    else:
        y = _elementwise(prim)
    outs = [y.astype(p.out_dtype)]
    for e, (_r, _c, dtype, role) in zip(extras, p.extras, strict=True):
        outs.append(e if role == "carried" else (2.0 * e.astype(jnp.float32)).astype(dtype))
    return tuple(outs)


def _kernel(*refs, p: Problem):
    n_primary = len(_primary_inputs(p))
    n_extra = len(p.extras)
    ins = refs[:n_primary + n_extra]
    outs = refs[n_primary + n_extra:n_primary + 2 * n_extra + 1]
    scratch = refs[n_primary + 2 * n_extra + 1:]
    o_ref = outs[0]
    if p.kind == "matmul":
        acc_ref = scratch[0]
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(ins[0][...], ins[1][...], preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
    else:
        o_ref[...] = _elementwise([r[...] for r in ins[:n_primary]]).astype(o_ref.dtype)
    for e_in, e_out, (_r, _c, _d, role) in zip(ins[n_primary:], outs[1:], p.extras, strict=True):
        if role == "computed":
            e_out[...] = (2.0 * e_in[...].astype(jnp.float32)).astype(e_out.dtype)
        # carried: aliased in HBM, nothing to do on one chip


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(*args, p: Problem, blocks: BlockSizes, interpret: bool = False, vmem_limit_bytes: int | None = None):
    bm, bk, bn = blocks.block_m, blocks.block_k, blocks.block_n
    if p.kind == "matmul":
        in_specs = [pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))]
        scratch = [pltpu.VMEM((bm, bn), jnp.float32)]
    else:
        in_specs = [pl.BlockSpec((bm, bn), lambda i, j, k: (i, j))] * p.n_inputs
        scratch = []
    out_specs = [pl.BlockSpec((bm, bn), lambda i, j, k: (i, j))]
    out_shape = [jax.ShapeDtypeStruct((p.m, p.n), p.out_dtype)]
    aliases = {}
    n_primary = len(in_specs)
    for idx, (r, c, dtype, role) in enumerate(p.extras):
        if role == "carried":
            spec = pl.BlockSpec(memory_space=pl.ANY)
            aliases[n_primary + idx] = 1 + idx
        else:
            spec = pl.BlockSpec((r, c), lambda i, j, k: (0, 0))
        in_specs.append(spec)
        out_specs.append(spec)
        out_shape.append(jax.ShapeDtypeStruct((r, c), dtype))
    computed = any(role == "computed" for *_x, role in p.extras)
    semantics = ("arbitrary",) * 3 if computed else ("parallel", "parallel", "arbitrary")
    return pl.pallas_call(
        functools.partial(_kernel, p=p),
        out_shape=tuple(out_shape),
        grid=blocks.grid(p),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        scratch_shapes=scratch,
        input_output_aliases=aliases,
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=p.flops, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
    )(*args)


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """Bytes the blocking moves between HBM and VMEM (`Problem.traffic` of its grid)."""
    return p.traffic(blocks.grid(p) if blocks is not None else (1, 1, 1))


def _fit_k(block: int, k: int) -> int:
    b = min(block, k) // 128 * 128
    while b >= 128:
        if k % b == 0:
            return b
        b -= 128
    return k


def fit(p: Problem, block_m: int, block_k: int, block_n: int) -> BlockSizes:
    bk = _fit_k(block_k, p.k) if p.kind == "matmul" else 1
    return BlockSizes(fit_dim(block_m, p.m, 8), bk, fit_dim(block_n, p.n, 128))


# No sweep of its own yet: the matmul family's safe default (bf16 blocks well inside 16 MiB).
SAFE_DEFAULT = (256, 512, 256)


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    return fit(p, *SAFE_DEFAULT)


def candidates(p: Problem) -> list[BlockSizes]:
    raw = [(512, 2048, 512), (512, 1024, 512), (512, 512, 512), (256, 512, 256), (256, 256, 256), (128, 512, 128),
           (128, 128, 128)]
    seen, out = set(), []
    for sizes in raw:
        b = fit(p, *sizes)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out
