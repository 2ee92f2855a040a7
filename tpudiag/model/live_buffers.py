"""Live device buffers with the Python stacks that made them, from JAX's own memory profile.

`jax.profiler.save_device_memory_profile(path)` writes a pprof profile of every buffer alive on
the devices at that moment: one sample per distinct (stack, kind, device), valued by the number of
buffers and their bytes. These are measured sizes of what the runtime holds, not a model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceFrame:
    """One Python frame: the function, its file and the line executing in it."""

    function: str
    file: str
    line: int

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class StackLocation:
    """One pprof location: its frames, inlined callees first and the caller last. Samples that
    name a location share this one object, so a profile holds each location's frames once."""

    frames: tuple[SourceFrame, ...]


@dataclass(frozen=True)
class BufferSample:
    """Buffers that share a stack, a kind and a device.

    `kind` is what JAX labels the sample: `buffer` (a device array) or `executable` (a loaded
    program, 0 bytes on backends that do not report its size). `device` is e.g. `cpu:0`, `tpu:3`;
    "" where the sample has no device label (executables).
    """

    kind: str
    device: str
    buffers: int  # buffers, or loaded executables
    bytes: int  # an executable's: its generated code (0 where `size_known` is False)
    stack: tuple[StackLocation, ...]  # the innermost location first, as pprof orders them
    size_known: bool = True  # False: a backend that does not report an executable's code size

    def frames(self) -> Iterator[SourceFrame]:
        """The sample's frames, innermost first: every location's frames in turn (a generator, as
        a stack naming a long location many times holds locations x lines frames)."""
        for location in self.stack:
            yield from location.frames


@dataclass(frozen=True)
class DeviceMemoryProfile:
    """A whole `save_device_memory_profile` file."""

    path: str
    samples: tuple[BufferSample, ...]


@dataclass(frozen=True)
class DeviceTotal:
    device: str
    buffers: int
    bytes: int


@dataclass(frozen=True)
class LiveBytes:
    """Live buffer bytes attributed to source lines (`analysis.live_buffers.attribute`).

    `by_line` is a `schemas.LIVE_BYTES_BY_LINE` table, largest first. Each sample is attributed to
    its innermost frame outside JAX's own code (`jax`, `jaxlib`); `internal` rows are samples
    whose whole stack lies inside JAX, attributed to their innermost frame.
    """

    path: str
    by_line: object  # pandas.DataFrame (schemas.LIVE_BYTES_BY_LINE)
    by_device: tuple[DeviceTotal, ...]
    total_bytes: int
    total_buffers: int
    executables: int
    executable_bytes: int  # their generated code, where the backend reports it (not in total_bytes)
