"""Device memory over time, as the allocator recorded it in a capture (XProf's memory profile).

Where the runtime's allocator is traced (TSL's `MemoryAllocation` / `MemoryDeallocation` TraceMe
events on `/host:CPU`: GPU captures, TPU captures that record it), every event carries the
allocator's state after it: bytes in use, free, the lifetime peak, and what was (de)allocated.
These are measured, per memory space (allocator); `analysis.memory_timeline` turns them into
the peak within the capture, the timeline and what was live at the peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

if TYPE_CHECKING:  # pandas is imported where tables are built: a host's parse begins without it
    import pandas as pd


# What XProf calls the bytes in use at the peak that no allocation inside the capture (in the
# peak's step) accounts for: memory allocated before the capture began, or preallocated.
UNATTRIBUTED = "allocated before the capture (or outside the peak's step)"

# TensorFlow's DataType numbers (the `data_type` stat) -> the names XProf shows (`DataTypeString`).
TF_DATA_TYPES = {
    0: "INVALID", 1: "float", 2: "double", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32", 14: "bfloat16",
    15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128", 19: "half", 20: "resource",
    21: "variant", 22: "uint32", 23: "uint64",
}


def data_type_name(code: int) -> str:
    return TF_DATA_TYPES.get(code, f"type {code}")


@dataclass(frozen=True)
class HostAllocatorEvents:
    """One host file's allocator events (`schemas.ALLOCATOR_EVENTS`), in the file's order."""

    host: str
    path: str
    events: pd.DataFrame
    warnings: tuple[str, ...] = ()  # lines or events that could not be placed on the host's time axis


@dataclass(frozen=True)
class ActiveAllocation:
    """Allocations live at the peak that look alike (same sizes, op, region, type and shape)."""

    allocation_bytes: int  # each
    requested_bytes: int  # each
    occurrences: int
    op: str
    region_type: str
    data_type: int
    shape: str
    attributed: bool = True  # False: the UNATTRIBUTED remainder, or the stack reservation
    annotation: str = ""  # the host events enclosing the allocation (`PjitFunction(f) › Build buffer allocations`)

    @property
    def data_type_name(self) -> str:
        return data_type_name(self.data_type)

    @property
    def total_bytes(self) -> int:
        return self.allocation_bytes * self.occurrences


@dataclass(frozen=True)
class AllocatorTimeline:
    """One allocator (memory space) over the capture.

    `peak_bytes` is the most in use (heap + stack) at any event inside the capture, at
    `peak_time_ps` on the capture's time axis (as `tpudiag report` places host events); `lifetime_peak_bytes` is the allocator's own peak since it was created, which
    may predate the capture. `capacity_bytes` is in use + free at the peak. `timeline` is a
    `schemas`-free table of every event in time order: `time_ps`, `in_use_bytes`, `free_bytes`.
    """

    allocator: str
    events: int
    peak_bytes: int
    peak_time_ps: int
    peak_heap_bytes: int
    peak_stack_bytes: int
    peak_step: int
    capacity_bytes: int
    fragmentation_at_peak: float
    lifetime_peak_bytes: int
    timeline: pd.DataFrame
    at_peak: tuple[ActiveAllocation, ...]


@dataclass(frozen=True)
class HostMemoryTimeline:
    host: str
    path: str
    allocators: tuple[AllocatorTimeline, ...]  # sorted by allocator name
    warnings: tuple[str, ...] = ()
