"""Data movement: copies, layout changes, dynamic-slice and dynamic-update-slice.

These ops compute nothing; their cost is the bytes they move and how (DMA descriptors, re-tiling).
Each op is one `pallas_call` without a grid:

- `copy` (a `copy-start/copy-done` prefetch, a plain copy): one DMA HBM -> HBM (`pl.ANY` on both
  sides, `pltpu.make_async_copy` with a DMA semaphore). On a TPU the captured copy moved HBM ->
  VMEM (memory-space assignment); one chip's reproduction moves the same bytes between HBM buffers.
- `relayout` (a copy or reshape that writes another tiled layout): the physical result is
  `transpose(reshape(x, dims), perm)` with `perm` the output's major-to-minor order; the whole array
  is one VMEM block, reshaped and transposed by the vector units (Mosaic supports only some
  relayouts: a deviceless compile says which).
- `dynamic_slice`: start indices in SMEM, clamped as XLA clamps them, one DMA of the window.
- `dynamic_update_slice`: the operand aliased to the output in HBM, one DMA of the update into the
  window (nothing else moves).
- `concatenate`: every input stays in HBM and is DMAed into its window of the output along `axis`
  (static offsets; all DMAs in flight together).
- `pad`: low/high edge padding with zeros (no interior padding): the whole array is one VMEM block,
  the output zero-filled and the input stored into its window.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import BlockSizeError, check_vmem, itemsize  # repro: inlined
from tpudiag.kernels_lab.problems.datamove import Problem  # repro: inlined

FAMILY = "datamove"
SCALES_BLOCKS = True  # `--scale-down` shrinks the blocks with the problem
DEFAULT_INTERPRET = None  # plain interpret mode runs it (no remote DMAs)
ici_seconds = None  # moves nothing over ICI


@dataclass(frozen=True)
class BlockSizes:
    """No blocking: one DMA or one whole-array VMEM block. `whole` is always 1."""

    whole: int = 1

    def vmem_bytes(self, p: Problem) -> int:
        if p.op == "pad":  # input and output, double-buffered
            return 2 * (math.prod(p.in_dims) + math.prod(p.out_dims)) * itemsize(p.dtype)
        if p.op != "relayout":
            return 0
        return 2 * 2 * math.prod(p.out_dims) * itemsize(p.dtype)  # input and output, double-buffered

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        if self.whole != 1:
            raise BlockSizeError(f"datamove has no block sizes: whole must be 1, got {self.whole}")
        check_vmem(f"{p.op} of {p.out_dims}", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, ...]:
        return ()

    def label(self) -> str:
        return "whole array"


def _part_dims(p: Problem) -> list[tuple[int, ...]]:
    return [tuple(n if d == p.axis else o for d, o in enumerate(p.out_dims)) for n in p.parts]


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    if p.op == "concatenate":
        return [(dims, p.dtype) for dims in _part_dims(p)]
    structs = [(p.in_dims, p.dtype)]
    if p.op == "dynamic_update_slice":
        structs.append((p.update_dims, p.dtype))
    if p.op in ("dynamic_slice", "dynamic_update_slice"):
        structs.append(((len(p.out_dims),), "int32"))
    return structs


def make_inputs(p: Problem, seed: int = 0) -> list:
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    out = []
    for i, (shape, dtype) in enumerate(input_structs(p)):
        if dtype == "int32" and i == len(input_structs(p)) - 1 and p.op.startswith("dynamic"):
            # start indices, some past the end so the clamp is exercised
            bound = p.in_dims if p.op == "dynamic_slice" else p.out_dims
            out.append(jax.random.randint(keys[2], shape, 0, jnp.asarray(bound) + 2, jnp.int32))
        elif jnp.issubdtype(jnp.dtype(dtype), jnp.integer):
            out.append(jax.random.randint(keys[i], shape, 0, 1 << 7, jnp.int32).astype(dtype))
        else:
            out.append(jax.random.normal(keys[i], shape, jnp.float32).astype(dtype))
    return out


def reference(p: Problem, *args):
    x = args[0]
    if p.op == "copy":
        return x.reshape(p.out_dims)
    if p.op == "relayout":
        return jnp.transpose(x.reshape(p.out_dims), p.perm)
    if p.op == "dynamic_slice":
        return jax.lax.dynamic_slice(x, tuple(args[1]), p.out_dims)
    if p.op == "concatenate":
        return jnp.concatenate(args, axis=p.axis)
    if p.op == "pad":
        return jnp.pad(x, list(zip(p.pad_low, p.pad_high, strict=True)))
    return jax.lax.dynamic_update_slice(x, args[1], tuple(args[2]))


def _starts(idx_ref, limits):
    # XLA clamps each start so the window stays inside the array
    return [jnp.clip(idx_ref[d], 0, lim) for d, lim in enumerate(limits)]


def _kernel(*refs, p: Problem):
    if p.op == "copy":
        x_ref, o_ref, sem = refs
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    elif p.op == "relayout":
        x_ref, o_ref = refs
        o_ref[...] = jnp.transpose(x_ref[...].reshape(p.out_dims), p.perm)
        return
    elif p.op == "pad":
        x_ref, o_ref = refs
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
        o_ref[tuple(pl.ds(lo, n) for lo, n in zip(p.pad_low, p.in_dims, strict=True))] = x_ref[...]
        return
    elif p.op == "concatenate":
        *in_refs, o_ref, sems = refs
        copies, offset = [], 0
        for i, (x_ref, n) in enumerate(zip(in_refs, p.parts, strict=True)):
            window = tuple(pl.ds(offset, n) if d == p.axis else slice(None) for d in range(len(p.out_dims)))
            copies.append(pltpu.make_async_copy(x_ref, o_ref.at[window], sems.at[i]))
            offset += n
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        return
    elif p.op == "dynamic_slice":
        x_ref, idx_ref, o_ref, sem = refs
        starts = _starts(idx_ref, [i - o for i, o in zip(p.in_dims, p.out_dims, strict=True)])
        window = tuple(pl.ds(s, n) for s, n in zip(starts, p.out_dims, strict=True))
        copy = pltpu.make_async_copy(x_ref.at[window], o_ref, sem)
    else:
        _x_ref, u_ref, idx_ref, o_ref, sem = refs
        starts = _starts(idx_ref, [o - u for o, u in zip(p.out_dims, p.update_dims, strict=True)])
        window = tuple(pl.ds(s, n) for s, n in zip(starts, p.update_dims, strict=True))
        copy = pltpu.make_async_copy(u_ref, o_ref.at[window], sem)
    copy.start()
    copy.wait()


@functools.partial(jax.jit, static_argnames=("p", "blocks", "interpret", "vmem_limit_bytes"))
def pallas(*args, p: Problem, blocks: BlockSizes, interpret: bool = False, vmem_limit_bytes: int | None = None):
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    dma = [pltpu.SemaphoreType.DMA(())]
    out_dims = p.out_dims if p.op != "relayout" else tuple(p.out_dims[d] for d in p.perm)
    args = list(args)
    if p.op == "copy":
        args[0] = args[0].reshape(p.out_dims)  # a bitcast: the DMA copies the same bytes
        in_specs, out_spec, scratch, aliases = [any_spec], any_spec, dma, {}
    elif p.op in ("relayout", "pad"):
        in_specs, out_spec, scratch, aliases = None, None, [], {}
    elif p.op == "concatenate":
        in_specs, out_spec = [any_spec] * len(p.parts), any_spec
        scratch, aliases = [pltpu.SemaphoreType.DMA((len(p.parts),))], {}
    elif p.op == "dynamic_slice":
        in_specs, out_spec, scratch, aliases = [any_spec, smem], any_spec, dma, {}
    else:
        in_specs, out_spec, scratch, aliases = [any_spec, any_spec, smem], any_spec, dma, {0: 0}
    kwargs = {} if in_specs is None else dict(in_specs=in_specs, out_specs=out_spec)
    return pl.pallas_call(
        functools.partial(_kernel, p=p),
        out_shape=jax.ShapeDtypeStruct(out_dims, p.dtype),
        scratch_shapes=scratch,
        input_output_aliases=aliases,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks)),
        interpret=interpret,
        **kwargs,
    )(*args)


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """What this kernel moves between HBM and VMEM, whatever the blocks: `Problem.min_hbm_bytes`."""
    return p.min_hbm_bytes


def fit(p: Problem, whole: int = 1) -> BlockSizes:
    return BlockSizes(1)


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    return BlockSizes(1)


def candidates(p: Problem) -> list[BlockSizes]:
    return [BlockSizes(1)]
