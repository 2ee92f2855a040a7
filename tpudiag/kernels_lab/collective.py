"""Collectives as Pallas kernels: all-gather, reduce-scatter, all-reduce on a ring of devices.

Each device runs one kernel (under `jax.shard_map` over one mesh axis of n devices) that talks to
its ring neighbour with remote DMAs (`pltpu.make_async_remote_copy`) and DMA semaphores; a barrier
semaphore handshake with both neighbours comes first, so no device writes into a neighbour that has
not entered the kernel. `direction` picks the neighbour data flows to (+1 "right" or -1 "left").

- all-gather (`[r, c]` per device -> `[n*r, c]`): the local shard is DMAed into its slot, then n-1
  steps each forward the slot received last to the neighbour (slots never collide, HBM only).
- reduce-scatter (`[n*r, c]` -> `[r, c]`, sum): the partial sum of chunk `me - 1 - s` travels one hop
  per step s and each device adds its own chunk in VMEM (f32); every step lands in its own receive
  slot, so a slow neighbour is never overwritten.
- all-reduce: reduce-scatter, then all-gather of the reduced chunks, in one kernel.

Checked against `jax.lax.all_gather` / `psum_scatter` / `psum` in the TPU-semantics interpreter
(`pltpu.InterpretParams`), which simulates several devices, their DMAs and semaphores on a CPU.
Known problem: they agree with `dma_execution_mode="eager"` (a DMA moves its data when started);
under the default "on_wait" (data moves when a semaphore is waited on) some gathered slots stay
uninitialised (NaN), differently from run to run. Whether that is an interpreter limitation or a
race in the protocol that hardware would also hit is not settled: treat these kernels as
unverified on TPU. Not yet wired into `lab extract` / `tune` (no spec inference for collectives,
no deviceless compile for the capture's topology yet).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import BlockSizeError, check_vmem, itemsize  # repro: inlined

FAMILY = "collective"
KINDS = ("all-gather", "reduce-scatter", "all-reduce")
AXIS = "ring"


@dataclass(frozen=True)
class Problem:
    """`kind` over `devices` on one ring; each device's shard is `rows x cols` (all-gather's input,
    reduce-scatter's output, all-reduce's chunk)."""

    kind: str
    devices: int
    rows: int
    cols: int
    dtype: str = "float32"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise BlockSizeError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.devices < 2:
            raise BlockSizeError(f"a ring needs at least 2 devices, got {self.devices}")

    @property
    def out_dtype(self) -> str:
        return self.dtype

    @property
    def compute_dtype(self) -> str:
        return self.dtype

    @property
    def ici_bytes_per_device(self) -> int:
        """Bytes each device sends over ICI: (n-1) chunks per phase (two phases for all-reduce)."""
        phases = 2 if self.kind == "all-reduce" else 1
        return phases * (self.devices - 1) * self.rows * self.cols * itemsize(self.dtype)


@dataclass(frozen=True)
class BlockSizes:
    """`direction` +1 sends to the next device on the ring, -1 to the previous one."""

    direction: int = 1

    def vmem_bytes(self, p: Problem) -> int:
        if p.kind == "all-gather":
            return 0
        chunk = p.rows * p.cols
        # the input, one receive slot per step, the f32 running sum (and the gathered output)
        total = p.devices * chunk * itemsize(p.dtype) + (p.devices - 1) * chunk * 4 + chunk * 4
        if p.kind == "all-reduce":
            total += p.devices * chunk * itemsize(p.dtype)
        return total

    def validate(self, p: Problem, vmem_bytes: int) -> BlockSizes:
        if self.direction not in (1, -1):
            raise BlockSizeError(f"direction must be 1 or -1, got {self.direction}")
        check_vmem(f"{p.kind} ring buffers", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, ...]:
        return ()

    def label(self) -> str:
        return f"ring direction {'+1' if self.direction == 1 else '-1'}"


def _neighbours(n: int, direction: int):
    me = jax.lax.axis_index(AXIS)
    to = jax.lax.rem(me + n + direction, n)
    frm = jax.lax.rem(me + n - direction, n)
    return me, to, frm


def _barrier(to, frm):
    """Both neighbours have entered the kernel before anyone writes into them."""
    sem = pltpu.get_barrier_semaphore()
    for dev in (frm, to):
        pl.semaphore_signal(sem, 1, device_id=(dev,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(sem, 2)


def _gather_steps(o_ref, me, to, n, rows, direction, send_sem, recv_sem):
    for step in range(n - 1):
        slot = jax.lax.rem(me + n * (step + 1) - direction * step, n)
        window = o_ref.at[pl.ds(slot * rows, rows)]
        copy = pltpu.make_async_remote_copy(window, window, send_sem, recv_sem, device_id=(to,),
                                            device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()  # our send done and the neighbour's slot from the other side received


def _all_gather_kernel(x_ref, o_ref, local_sem, send_sem, recv_sem, *, p: Problem, direction: int):
    me, to, frm = _neighbours(p.devices, direction)
    _barrier(to, frm)
    local = pltpu.make_async_copy(x_ref, o_ref.at[pl.ds(me * p.rows, p.rows)], local_sem)
    local.start()
    local.wait()
    _gather_steps(o_ref, me, to, p.devices, p.rows, direction, send_sem, recv_sem)


def _reduce_scatter(x_ref, send_ref, recv_ref, send_sem, recv_sem, me, to, p: Problem, direction: int):
    """Leaves this device's fully reduced chunk (f32) in send_ref; returns nothing."""
    n, r = p.devices, p.rows

    def chunk(k):
        return x_ref[pl.ds(k * r, r), :].astype(jnp.float32)

    send_ref[...] = chunk(jax.lax.rem(me + n - direction, n))
    for step in range(n - 1):
        copy = pltpu.make_async_remote_copy(send_ref, recv_ref.at[step], send_sem, recv_sem, device_id=(to,),
                                            device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()
        k = jax.lax.rem(me + n * (step + 2) - direction * (step + 2), n)
        send_ref[...] = recv_ref[step] + chunk(k)


def _reduce_scatter_kernel(x_ref, o_ref, send_ref, recv_ref, send_sem, recv_sem, *, p: Problem, direction: int):
    me, to, frm = _neighbours(p.devices, direction)
    _barrier(to, frm)
    _reduce_scatter(x_ref, send_ref, recv_ref, send_sem, recv_sem, me, to, p, direction)
    o_ref[...] = send_ref[...].astype(o_ref.dtype)


def _all_reduce_kernel(x_ref, o_ref, send_ref, recv_ref, send_sem, recv_sem, *, p: Problem, direction: int):
    me, to, frm = _neighbours(p.devices, direction)
    _barrier(to, frm)
    _reduce_scatter(x_ref, send_ref, recv_ref, send_sem, recv_sem, me, to, p, direction)
    o_ref[pl.ds(me * p.rows, p.rows), :] = send_ref[...].astype(o_ref.dtype)
    _gather_steps(o_ref, me, to, p.devices, p.rows, direction, send_sem, recv_sem)


def _local_shape(p: Problem) -> tuple[int, int]:
    return (p.rows if p.kind == "all-gather" else p.devices * p.rows, p.cols)


def _per_device(x, *, p: Problem, blocks: BlockSizes, interpret):
    n, r, c = p.devices, p.rows, p.cols
    dma = pltpu.SemaphoreType.DMA(())
    params = pltpu.CompilerParams(collective_id=0)
    if p.kind == "all-gather":
        return pl.pallas_call(
            functools.partial(_all_gather_kernel, p=p, direction=blocks.direction),
            out_shape=jax.ShapeDtypeStruct((n * r, c), p.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[dma, dma, dma], compiler_params=params, interpret=interpret)(x)
    kernel = _reduce_scatter_kernel if p.kind == "reduce-scatter" else _all_reduce_kernel
    out_rows = r if p.kind == "reduce-scatter" else n * r
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    return pl.pallas_call(
        functools.partial(kernel, p=p, direction=blocks.direction),
        out_shape=jax.ShapeDtypeStruct((out_rows, c), p.dtype),
        in_specs=[vmem], out_specs=vmem,
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32), pltpu.VMEM((n - 1, r, c), jnp.float32), dma, dma],
        compiler_params=params, interpret=interpret)(x)


def pallas(x, *, p: Problem, blocks: BlockSizes, mesh, interpret=False):
    """The collective over `mesh` (one axis named `ring` of p.devices devices); `x` is the global
    array, sharded along rows."""
    spec = jax.sharding.PartitionSpec(AXIS)
    return jax.shard_map(functools.partial(_per_device, p=p, blocks=blocks, interpret=interpret), mesh=mesh,
                         in_specs=spec, out_specs=spec, check_vma=False)(x)


def reference(x, *, p: Problem, mesh):
    """The same collective with jax.lax (what XLA emits)."""
    def body(a):
        if p.kind == "all-gather":
            return jax.lax.all_gather(a, AXIS, tiled=True)
        if p.kind == "reduce-scatter":
            return jax.lax.psum_scatter(a.astype(jnp.float32), AXIS, tiled=True).astype(a.dtype)
        return jax.lax.psum(a.astype(jnp.float32), AXIS).astype(a.dtype)

    spec = jax.sharding.PartitionSpec(AXIS)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


def global_shape(p: Problem) -> tuple[int, int]:
    rows, cols = _local_shape(p)
    return (p.devices * rows, cols)


def candidates(p: Problem) -> list[BlockSizes]:
    return [BlockSizes(1), BlockSizes(-1)]


def to_dict(p: Problem) -> dict:
    return asdict(p)
