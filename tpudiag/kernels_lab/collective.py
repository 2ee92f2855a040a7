"""Collectives as Pallas kernels: all-gather, reduce-scatter, all-reduce on a ring of devices.

Each device runs one kernel (under `jax.shard_map` over one mesh axis of n devices) that talks to
its ring neighbours with remote DMAs (`pltpu.make_async_remote_copy`) and DMA semaphores; a barrier
semaphore handshake with both neighbours comes first, so no device writes into a neighbour that has
not entered the kernel.

The shard (`rows x cols` per device) is cut into streams along its rows. A stream is a row window
with a ring direction: `direction` +1 sends to the next device, -1 to the previous one;
`bidirectional` sends the first half of the rows one way and the second half the other way (both
ICI links of the ring axis busy); `chunks` cuts each direction's rows into that many pieces, each
its own DMA, all in flight together (more descriptors, smaller transfers: what `tune` sweeps).

- all-gather (`[r, c]` per device -> `[n*r, c]`): the local shard is DMAed into its slot, then n-1
  steps each forward the window received last to the neighbour (HBM only).
- reduce-scatter (`[n*r, c]` -> `[r, c]`, sum): the partial sum of one chunk travels one hop per
  step and each device adds its own rows in VMEM (f32); every step lands in its own receive slot.
- all-reduce: reduce-scatter, then all-gather of the reduced chunks, in one kernel.

Every (stream, step) DMA has its own send and receive semaphore. With one semaphore shared by all
steps, a fast neighbour's step s+1 DMA can signal the semaphore a device waits on for step s, and
the device then forwards a slot that has not arrived: the TPU-semantics interpreter's default
`dma_execution_mode="on_wait"` (a DMA moves its data only when its semaphore is waited on) exposes
exactly that race, which eager DMAs hide. Checked against `jax.lax.all_gather` / `psum_scatter` /
`psum` in that interpreter (`pltpu.InterpretParams`) over several simulated CPU devices.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import SUBLANE, BlockSizeError, cdiv, check_vmem, itemsize  # repro: inlined
from tpudiag.kernels_lab.problems.collective import Problem  # repro: inlined

FAMILY = "collective"
# Block sizes do not scale with `--scale-down`: a direction and a DMA count are not dims.
SCALES_BLOCKS = False
AXIS = "ring"
# Plain `interpret=True` (the HLO interpreter) has no remote DMAs: interpret with TPU semantics.
DEFAULT_INTERPRET = dict(dma_execution_mode="on_wait")


@dataclass(frozen=True)
class BlockSizes:
    """`direction` +1 / -1 (ignored when `bidirectional`); `chunks` DMAs per direction per step."""

    direction: int = 1
    chunks: int = 1
    bidirectional: bool = False

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
        if self.chunks < 1:
            raise BlockSizeError(f"chunks must be at least 1, got {self.chunks}")
        if self.bidirectional and p.rows < 2:
            raise BlockSizeError(f"a bidirectional ring splits the shard's rows in two; expected at least 2 "
                                 f"rows, got {p.rows}")
        per_direction = p.rows // 2 if self.bidirectional else p.rows
        if self.chunks > per_direction:
            raise BlockSizeError(f"chunks {self.chunks} exceed the {per_direction} rows each direction carries; "
                                 f"expected at most {per_direction}")
        check_vmem(f"{p.kind} ring buffers", self.vmem_bytes(p), vmem_bytes)
        return self

    def grid(self, p: Problem) -> tuple[int, ...]:
        return ()

    def streams(self, p: Problem) -> tuple[tuple[int, int, int], ...]:
        """(direction, first row, rows) of every DMA stream within a shard."""
        # packed dtypes tile more rows: 16 for bf16, 32 for int8 (8 sublanes of 32-bit words)
        unit = SUBLANE * max(1, 4 // itemsize(p.dtype))
        if not self.bidirectional:
            return tuple((self.direction, o, n) for o, n in _split(0, p.rows, self.chunks, unit))
        half = cdiv(p.rows, 2)
        if p.rows >= 2 * unit:
            half = cdiv(half, unit) * unit
        return (tuple((self.direction, o, n) for o, n in _split(0, half, self.chunks, unit))
                + tuple((-self.direction, o, n) for o, n in _split(half, p.rows - half, self.chunks, unit)))

    def label(self) -> str:
        ring = "bidirectional ring" if self.bidirectional else f"ring {'+1' if self.direction == 1 else '-1'}"
        return f"{ring}, {self.chunks} chunk{'s' if self.chunks > 1 else ''}"


def _split(first: int, count: int, pieces: int, unit: int = SUBLANE) -> list[tuple[int, int]]:
    """Row windows covering [first, first + count) in at most `pieces` parts, tile-aligned
    (multiples of `unit` rows) when each part can hold that many rows."""
    size = cdiv(count, max(1, pieces))
    if count >= unit * pieces:
        size = cdiv(size, unit) * unit
    return [(first + o, min(size, count - o)) for o in range(0, count, size)]


def _neighbours(n: int, direction: int):
    me = jax.lax.axis_index(AXIS)
    return me, jax.lax.rem(me + n + direction, n)


def _barrier(n: int):
    """Both neighbours have entered the kernel before anyone writes into them."""
    me = jax.lax.axis_index(AXIS)
    sem = pltpu.get_barrier_semaphore()
    for dev in (jax.lax.rem(me + n - 1, n), jax.lax.rem(me + 1, n)):
        pl.semaphore_signal(sem, 1, device_id=(dev,), device_id_type=pl.DeviceIdType.MESH)
    pl.semaphore_wait(sem, 2)


def _remote(src, dst, send_sems, recv_sems, index, to):
    return pltpu.make_async_remote_copy(src, dst, send_sems.at[index], recv_sems.at[index], device_id=(to,),
                                        device_id_type=pl.DeviceIdType.MESH)


def _gather_steps(o_ref, p: Problem, streams, send_sems, recv_sems, step0: int):
    """n-1 steps; each stream forwards its window of the slot it received last. Semaphore index
    (stream, step0 + step): one per DMA, so a wait cannot be satisfied by a later step's DMA."""
    n = p.devices
    for step in range(n - 1):
        copies = []
        for s, (d, first, count) in enumerate(streams):
            me, to = _neighbours(n, d)
            slot = jax.lax.rem(me + n * (step + 1) - d * step, n)
            window = o_ref.at[slot, pl.ds(first, count)]
            copies.append(_remote(window, window, send_sems, recv_sems, (s, step0 + step), to))
        for c in copies:
            c.start()
        for c in copies:
            c.wait()  # our send done and the neighbour's window for this step received


def _all_gather_kernel(x_ref, o_ref, local_sem, send_sems, recv_sems, *, p: Problem, streams):
    _barrier(p.devices)
    me = jax.lax.axis_index(AXIS)
    local = pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem)
    local.start()
    local.wait()
    _gather_steps(o_ref, p, streams, send_sems, recv_sems, 0)


def _reduce_scatter(x_ref, send_ref, recv_ref, send_sems, recv_sems, p: Problem, streams):
    """Leaves this device's fully reduced chunk (f32) in send_ref."""
    n = p.devices

    def own(k, first, count):
        return x_ref[k, pl.ds(first, count), :].astype(jnp.float32)

    for d, first, count in streams:
        me, _ = _neighbours(n, d)
        send_ref[pl.ds(first, count), :] = own(jax.lax.rem(me + n - d, n), first, count)
    for step in range(n - 1):
        copies = []
        for s, (d, first, count) in enumerate(streams):
            _, to = _neighbours(n, d)
            copies.append(_remote(send_ref.at[pl.ds(first, count)], recv_ref.at[step, pl.ds(first, count)],
                                  send_sems, recv_sems, (s, step), to))
        for c in copies:
            c.start()
        for c, (d, first, count) in zip(copies, streams, strict=True):
            c.wait()
            me, _ = _neighbours(n, d)
            k = jax.lax.rem(me + n * (step + 2) - d * (step + 2), n)
            send_ref[pl.ds(first, count), :] = recv_ref[step, pl.ds(first, count), :] + own(k, first, count)


def _reduce_scatter_kernel(x_ref, o_ref, send_ref, recv_ref, send_sems, recv_sems, *, p: Problem, streams):
    _barrier(p.devices)
    _reduce_scatter(x_ref, send_ref, recv_ref, send_sems, recv_sems, p, streams)
    o_ref[...] = send_ref[...].astype(o_ref.dtype)


def _all_reduce_kernel(x_ref, o_ref, send_ref, recv_ref, send_sems, recv_sems, *, p: Problem, streams):
    _barrier(p.devices)
    _reduce_scatter(x_ref, send_ref, recv_ref, send_sems, recv_sems, p, streams)
    me = jax.lax.axis_index(AXIS)
    o_ref[me] = send_ref[...].astype(o_ref.dtype)
    _gather_steps(o_ref, p, streams, send_sems, recv_sems, p.devices - 1)


def _per_device(x, *, p: Problem, blocks: BlockSizes, interpret):
    n, r, c = p.devices, p.rows, p.cols
    streams = blocks.streams(p)
    sems = pltpu.SemaphoreType.DMA((len(streams), p.phases * (n - 1)))
    params = pltpu.CompilerParams(collective_id=0, vmem_limit_bytes=max(32 << 20, 2 * blocks.vmem_bytes(p)))
    cost = pl.CostEstimate(flops=p.flops, transcendentals=0, bytes_accessed=hbm_bytes(p, blocks))
    # Slots are a leading (untiled) dim: a slot's offset is then always tile-aligned, whatever r is
    # (a DMA at row offset k*r of an [n*r, c] array is refused unless r is a multiple of the tile).
    if p.kind == "all-gather":
        out = pl.pallas_call(
            functools.partial(_all_gather_kernel, p=p, streams=streams),
            out_shape=jax.ShapeDtypeStruct((n, r, c), p.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA(()), sems, sems], compiler_params=params,
            cost_estimate=cost, interpret=interpret)(x)
        return out.reshape(n * r, c)
    kernel = _reduce_scatter_kernel if p.kind == "reduce-scatter" else _all_reduce_kernel
    out_shape = (r, c) if p.kind == "reduce-scatter" else (n, r, c)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    out = pl.pallas_call(
        functools.partial(kernel, p=p, streams=streams),
        out_shape=jax.ShapeDtypeStruct(out_shape, p.dtype),
        in_specs=[vmem], out_specs=vmem,
        scratch_shapes=[pltpu.VMEM((r, c), jnp.float32), pltpu.VMEM((n - 1, r, c), jnp.float32), sems, sems],
        compiler_params=params, cost_estimate=cost, interpret=interpret)(x.reshape(n, r, c))
    return out.reshape(-1, c)


def device_mesh(p: Problem, devices=None):
    """A one-axis mesh named `ring` over the problem's devices: `devices` (e.g. a deviceless
    topology's) indexed by `p.group`, or the first p.devices local devices (simulated CPU devices
    under `--xla_force_host_platform_device_count`)."""
    if devices is None:
        devices = jax.devices()
        if len(devices) < p.devices:
            raise BlockSizeError(f"{p.kind} over {p.devices} devices needs {p.devices} devices, found "
                                 f"{len(devices)}; on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
                                 f"{p.devices} before jax starts")
        chosen = devices[:p.devices]
    else:
        chosen = [devices[i] for i in (p.group or range(p.devices))]
    return jax.sharding.Mesh(np.array(chosen), (AXIS,))


def _interpret_mode(interpret):
    if interpret is True:
        return pltpu.InterpretParams(**DEFAULT_INTERPRET)
    return interpret


def pallas(x, *, p: Problem, blocks: BlockSizes, interpret=False, mesh=None):
    """The collective; `x` is the global array (rows sharded over the ring)."""
    mesh = mesh if mesh is not None else device_mesh(p)
    spec = jax.sharding.PartitionSpec(AXIS)
    body = functools.partial(_per_device, p=p, blocks=blocks, interpret=_interpret_mode(interpret))
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


def reference(p: Problem, x, mesh=None):
    """The same collective with jax.lax (what XLA emits), f32 sums as the kernel does."""
    mesh = mesh if mesh is not None else device_mesh(p)

    def body(a):
        if p.kind == "all-gather":
            return jax.lax.all_gather(a, AXIS, tiled=True)
        if p.kind == "reduce-scatter":
            return jax.lax.psum_scatter(a.astype(jnp.float32), AXIS, tiled=True).astype(a.dtype)
        return jax.lax.psum(a.astype(jnp.float32), AXIS).astype(a.dtype)

    spec = jax.sharding.PartitionSpec(AXIS)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


def global_shape(p: Problem) -> tuple[int, int]:
    rows, cols = p.local_shape
    return (p.devices * rows, cols)


def input_structs(p: Problem) -> list[tuple[tuple[int, ...], str]]:
    """The global input; compile it sharded over the ring (`input_sharding`)."""
    return [(global_shape(p), p.dtype)]


def input_sharding(mesh):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS))


def make_inputs(p: Problem, seed: int = 0) -> list:
    x = jax.random.normal(jax.random.PRNGKey(seed), global_shape(p), jnp.float32).astype(p.dtype)
    return [jax.device_put(x, input_sharding(device_mesh(p)))]


def hbm_bytes(p: Problem, blocks: BlockSizes | None) -> int:
    """What this kernel moves between HBM and VMEM, whatever the blocks: `Problem.min_hbm_bytes`."""
    return p.min_hbm_bytes


def ici_seconds(p: Problem, blocks: BlockSizes, link_bytes_per_s: float) -> float:
    """Modelled ICI time: the bytes each device sends over the links the ring uses (one outgoing
    link per direction: two when bidirectional), at one link's one-way bandwidth. No latency, no
    per-DMA cost: it cannot rank chunk counts."""
    links = 2 if blocks.bidirectional else 1
    return p.ici_bytes_per_device / (links * link_bytes_per_s)


def fit(p: Problem, direction: int = 1, chunks: int = 1, bidirectional: bool = False) -> BlockSizes:
    """The nearest legal configuration: chunks clamped to the rows each direction carries."""
    bidirectional = bool(bidirectional) and p.rows >= 2
    per_direction = p.rows // 2 if bidirectional else p.rows
    return BlockSizes(direction, max(1, min(chunks, per_direction)), bidirectional)


def default_blocks(p: Problem, generation: str | None) -> BlockSizes:
    return fit(p, 1, 1, False)


def tile_aligned(p: Problem, blocks: BlockSizes) -> bool:
    """Every stream's window starts on a row tile and spans whole tiles (or runs to the shard's end):
    Mosaic refuses DMA windows along a tiled dim that are not ("Offsets / Slice sizes along tiled
    dimensions must be aligned to tiles", seen compiling for v5e and v6e)."""
    unit = SUBLANE * max(1, 4 // itemsize(p.dtype))
    return all(first % unit == 0 and (count % unit == 0 or first + count == p.rows)
               for _, first, count in blocks.streams(p))


def candidates(p: Problem) -> list[BlockSizes]:
    """Direction (+1, -1, both) x chunk count (1, 2, 4): the legal, tile-aligned ones."""
    seen, out = set(), []
    for bidirectional in (False, True):
        for chunks in (1, 2, 4):
            for direction in ((1,) if bidirectional else (1, -1)):
                b = fit(p, direction, chunks, bidirectional)
                if not tile_aligned(p, b):
                    continue
                if b not in seen:
                    seen.add(b)
                    out.append(b)
    return out
