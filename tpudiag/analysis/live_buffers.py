"""Attribute the live bytes of JAX's device memory profile to the source lines that made them.

A buffer's stack runs from JAX's dispatch code (innermost) out to the user's program; the line
that matters is the innermost one outside JAX, as JAX's own traceback filtering shows it. A
sample whose whole stack is inside JAX keeps its innermost frame and is marked `internal`.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpudiag.model import schemas
from tpudiag.model.live_buffers import DeviceMemoryProfile, DeviceTotal, LiveBytes, SourceFrame
from tpudiag.parsers.pprof import read_device_memory_profile

# Files of JAX itself: the installed packages, and a source checkout's `jax/_src`.
_JAX_FILE = re.compile(r"(?:site|dist)-packages[/\\](?:jax|jaxlib)[/\\]|[/\\]jax[/\\]_src[/\\]|[/\\]jaxlib[/\\]")


def is_jax_frame(frame: SourceFrame) -> bool:
    return bool(_JAX_FILE.search(frame.file))


def attributed_frame(stack: tuple[SourceFrame, ...]) -> tuple[SourceFrame | None, bool]:
    """(the frame a sample is attributed to, whether it is inside JAX); None for an empty stack."""
    for frame in stack:
        if not is_jax_frame(frame):
            return frame, False
    return (stack[0], True) if stack else (None, True)


def live_bytes_of(path: Path | str) -> LiveBytes:
    """The device memory profile at `path` attributed to source lines."""
    return attribute(read_device_memory_profile(path))


def attribute(profile: DeviceMemoryProfile) -> LiveBytes:
    """Live buffer bytes per source line, largest first, with totals per device."""
    rows: dict[tuple[str, int, str, bool], list] = {}  # key -> [buffers, bytes, devices]
    devices: dict[str, list[int]] = {}
    executables = executable_bytes = 0
    for sample in profile.samples:
        if sample.kind != "buffer":
            executables += sample.buffers
            executable_bytes += sample.bytes
            continue
        frame, internal = attributed_frame(sample.stack)
        key = ("<no stack>", 0, "", True) if frame is None else (frame.file, frame.line, frame.function, internal)
        row = rows.setdefault(key, [0, 0, set()])
        row[0] += sample.buffers
        row[1] += sample.bytes
        row[2].add(sample.device)
        total = devices.setdefault(sample.device, [0, 0])
        total[0] += sample.buffers
        total[1] += sample.bytes
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
    return (platform, int(ordinal)) if ordinal.isdigit() else (name, -1)
