"""A tiled Pallas TPU matmul (BlockSpecs, a 3-D grid, an f32 VMEM accumulator): the kernel example.

C[M, N] = A[M, K] @ B[K, N] in bf16 with blocks (BM, BK, BN) = (512, 512, 512) over a
(M/BM, N/BN, K/BK) grid; K is the reduction axis ("arbitrary"), the others "parallel".
`mesh_shape` puts every device on one axis `x`; A's rows are sharded over it and the kernel
runs per device inside `jax.shard_map` (Mosaic kernels are not partitioned automatically), so
each device multiplies a 2048 x 2048 x 2048 slice and there are no collectives. The static LLO
profile gives the kernel's cycles (compare `shared/reference/tpu-compiler-dumps.md` §8.2).

`tpudiag compile examples/models/pallas_matmul.py:matmul --topology v5e:2x2`
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ROWS_PER_DEVICE = K = N = 2048
BM = BK = BN = 512


def _kernel(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def tiled_matmul(a, b, bm=BM, bk=BK, bn=BN):
    """The kernel on one device's blocks."""
    m, k = a.shape
    _, n = b.shape
    return pl.pallas_call(
        _kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(flops=2 * m * k * n, bytes_accessed=2 * (m * k + k * n + m * n),
                                      transcendentals=0),
    )(a, b)


@jax.jit
def matmul(a, b):
    """A's rows sharded over `x`, B replicated: each device runs the kernel on its rows."""
    return jax.shard_map(functools.partial(tiled_matmul), in_specs=(P("x", None), P()),
                         out_specs=P("x", None), check_vma=False)(a, b)


def mesh_shape(n_devices):
    return {"x": n_devices}


def example_args(mesh):
    rows = ROWS_PER_DEVICE * mesh.devices.size
    return (jax.ShapeDtypeStruct((rows, K), jnp.bfloat16, sharding=NamedSharding(mesh, P("x", None))),
            jax.ShapeDtypeStruct((K, N), jnp.bfloat16, sharding=NamedSharding(mesh, P())))
