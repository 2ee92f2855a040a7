"""Attribute the live bytes of JAX's device memory profile to the source lines that made them.

A buffer's stack runs from JAX's dispatch code (innermost) out to the user's program; the line
that matters is the innermost one outside JAX, as JAX's own traceback filtering shows it. A
sample whose whole stack is inside JAX keeps its innermost frame and is marked `internal`.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpudiag.model import schemas
from tpudiag.errors import InputError
from tpudiag.model.live_buffers import DeviceMemoryProfile, DeviceTotal, LiveBytes, SourceFrame, StackLocation
from tpudiag.parsers.pprof import read_device_memory_profile

INT64_MAX = (1 << 63) - 1
# Files of JAX itself: the installed packages, and a source checkout's `jax/_src`.
_JAX_FILE = re.compile(r"(?:site|dist)-packages[/\\](?:jax|jaxlib)[/\\]|[/\\]jax[/\\]_src[/\\]|[/\\]jaxlib[/\\]")


def is_jax_frame(frame: SourceFrame) -> bool:
    return bool(_JAX_FILE.search(frame.file))


def attributed_frame(stack: tuple[StackLocation, ...],
                     first_outside: dict[int, SourceFrame | None] | None = None) -> tuple[SourceFrame | None, bool]:
    """(the frame a sample is attributed to, whether it is inside JAX); None for an empty stack.

    `first_outside` memoises each location's first frame outside JAX (by the location object,
    which samples share), so a profile costs its locations' lines once plus its samples' location
    references, however often a long location is named."""
    memo = {} if first_outside is None else first_outside
    for location in stack:
        key = id(location)
        if key not in memo:
            memo[key] = next((f for f in location.frames if not is_jax_frame(f)), None)
        if memo[key] is not None:
            return memo[key], False
    innermost = next((loc.frames[0] for loc in stack if loc.frames), None)
    return innermost, True


def live_bytes_of(path: Path | str) -> LiveBytes:
    """The device memory profile at `path` attributed to source lines."""
    return attribute(read_device_memory_profile(path))


def attribute(profile: DeviceMemoryProfile) -> LiveBytes:
    """Live buffer bytes per source line, largest first, with totals per device."""
    rows: dict[tuple[str, int, str, bool], list] = {}  # key -> [buffers, bytes, devices]
    devices: dict[str, list[int]] = {}
    executables = executable_bytes = 0
    first_outside: dict[int, SourceFrame | None] = {}
    for sample in profile.samples:
        if sample.kind != "buffer":
            executables += sample.buffers
            executable_bytes += sample.bytes
            continue
        frame, internal = attributed_frame(sample.stack, first_outside)
        key = ("<no stack>", 0, "", True) if frame is None else (frame.file, frame.line, frame.function, internal)
        row = rows.setdefault(key, [0, 0, set()])
        row[0] += sample.buffers
        row[1] += sample.bytes
        row[2].add(sample.device)
        total = devices.setdefault(sample.device, [0, 0])
        total[0] += sample.buffers
        total[1] += sample.bytes
    # Python integers sum without wrapping; the table and JSON readers hold int64, so a total past
    # it (no device holds 8 EiB) is a damaged profile, refused rather than shown wrapped.
    totals = (executables, executable_bytes, *(x for v in rows.values() for x in v[:2]),
              sum(b for _, b in devices.values()), sum(n for n, _ in devices.values()))
    if max(totals, default=0) > INT64_MAX:
        raise InputError("damaged pprof profile (its buffer or byte totals pass int64: more than any "
                         "device holds)", path=profile.path)
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1][1], kv[0][0], kv[0][1]))
    table = schemas.LIVE_BYTES_BY_LINE.frame({
        "file": [k[0] for k, _ in ordered],
        "line": [k[1] for k, _ in ordered],
        "function": [k[2] for k, _ in ordered],
        "buffers": [v[0] for _, v in ordered],
        "bytes": [v[1] for _, v in ordered],
        "devices": [len(v[2]) for _, v in ordered],
        "internal": [k[3] for k, _ in ordered],
    })
    by_device = tuple(DeviceTotal(d, n, b) for d, (n, b) in sorted(devices.items(), key=_device_order))
    return LiveBytes(path=profile.path, by_line=table, by_device=by_device,
                     total_bytes=sum(b for _, b in devices.values()),
                     total_buffers=sum(n for n, _ in devices.values()), executables=executables,
                     executable_bytes=executable_bytes)


def _device_order(item) -> tuple:
    """`tpu:10` after `tpu:9`: the platform, then the ordinal as a number."""
    name = item[0]
    platform, _, ordinal = name.rpartition(":")
    # isdecimal, not isdigit: `²` is a digit that int() refuses
    return (platform, int(ordinal)) if ordinal.isascii() and ordinal.isdecimal() else (name, -1)
