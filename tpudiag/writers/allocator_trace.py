"""Allocator events on `/host:CPU`, written as TSL's BFC allocator traces them.

TSL's allocator (openxla/xla `xla/tsl/framework/bfc_allocator.cc`, `AddTraceMe`) records each
allocation and free as a zero-length TraceMe, `MemoryAllocation` or `MemoryDeallocation`, whose
stats give the allocator's state after it and the chunk concerned; XProf's memory profile is
built from them. `TracedAllocator` plays an allocator and keeps those records, so a test capture
carries a consistent history (bytes in use, lifetime peak, rounded sizes, addresses);
`write_allocator_line` puts them on a host thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.writers.xspace_builder import PlaneBuilder, Ref, StatValue

ROUNDING_BYTES = 256  # the BFC allocator hands out multiples of 256 bytes


@dataclass(frozen=True)
class AllocatorRecord:
    allocator: str
    allocation: bool
    time_ps: int  # on the capture's clock; the line's timestamp is taken off when written
    heap_bytes: int
    stack_bytes: int
    free_bytes: int
    lifetime_peak_bytes: int
    fragmentation: float
    requested_bytes: int
    allocation_bytes: int
    address: int
    step_id: int | None = None  # written as `group_id` when given
    op: str = ""
    region_type: str = ""
    data_type: int = 0
    shape: str = ""


class TracedAllocator:
    """A device allocator of `capacity_bytes` that records what it does.

    `in_use_bytes` were allocated before the capture (so no event accounts for them), and
    `stack_bytes` are reserved outside the heap, as `bytes_reserved` reports them.
    """

    def __init__(self, name: str, capacity_bytes: int, in_use_bytes: int = 0, stack_bytes: int = 0,
                 lifetime_peak_bytes: int = 0, first_address: int = 0x7F00_0000_0000):
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.heap_bytes = in_use_bytes
        self.stack_bytes = stack_bytes
        self.lifetime_peak_bytes = max(lifetime_peak_bytes, in_use_bytes + stack_bytes)
        self.records: list[AllocatorRecord] = []
        self._next_address = first_address
        self._chunks: dict[int, tuple[int, int]] = {}  # address -> (requested, allocated)

    def allocate(self, time_ps: int, requested_bytes: int, *, step_id: int | None = None, op: str = "",
                 region_type: str = "", data_type: int = 0, shape: str = "") -> int:
        """The new chunk's address."""
        size = -(-requested_bytes // ROUNDING_BYTES) * ROUNDING_BYTES
        address = self._next_address
        self._next_address += size + ROUNDING_BYTES
        self._chunks[address] = (requested_bytes, size)
        self.heap_bytes += size
        self._record(True, time_ps, requested_bytes, size, address, step_id,
                     dict(op=op, region_type=region_type, data_type=data_type, shape=shape))
        return address

    def free(self, time_ps: int, address: int, *, step_id: int | None = None) -> None:
        requested, size = self._chunks.pop(address)
        self.heap_bytes -= size
        self._record(False, time_ps, requested, size, address, step_id, {})

    def _record(self, allocation: bool, time_ps: int, requested: int, size: int, address: int,
                step_id: int | None, meta: dict) -> None:
        in_use = self.heap_bytes + self.stack_bytes
        self.lifetime_peak_bytes = max(self.lifetime_peak_bytes, in_use)
        self.records.append(AllocatorRecord(
            self.name, allocation, time_ps, self.heap_bytes, self.stack_bytes,
            free_bytes=self.capacity_bytes - in_use, lifetime_peak_bytes=self.lifetime_peak_bytes,
            fragmentation=round(in_use / self.capacity_bytes, 6), requested_bytes=requested,
            allocation_bytes=size, address=address, step_id=step_id, **meta))


def write_allocator_line(plane: PlaneBuilder, thread: str, line_id: int, timestamp_ns: int,
                         records: list[AllocatorRecord]) -> None:
    """One host thread holding `records`, in time order, with their stats as TSL writes them."""
    line = plane.line(thread, line_id, timestamp_ns)
    for r in sorted(records, key=lambda r: r.time_ps):
        stats: dict[str, StatValue] = {
            "allocator_name": Ref(r.allocator), "bytes_reserved": r.stack_bytes, "bytes_allocated": r.heap_bytes,
            "bytes_available": r.free_bytes, "fragmentation": r.fragmentation,
            "peak_bytes_in_use": r.lifetime_peak_bytes, "requested_bytes": r.requested_bytes,
            "allocation_bytes": r.allocation_bytes, "addr": r.address,
        }
        if r.op:
            stats["tf_op"] = Ref(r.op)
        if r.step_id is not None:
            stats["group_id"] = r.step_id
        if r.region_type:
            stats["region_type"] = r.region_type
        stats["data_type"] = r.data_type
        if r.shape:
            stats["shape"] = r.shape
        name = "MemoryAllocation" if r.allocation else "MemoryDeallocation"
        line.event(plane.event_metadata(name), r.time_ps - timestamp_ns * 1000, 0, stats)
