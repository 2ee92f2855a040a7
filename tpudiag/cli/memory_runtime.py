"""The measured half of `tpudiag memory`: the allocator's timeline when PATH is a capture that
traced its allocator, and JAX's live buffers by source line from `--pprof FILE`.

Both are read only on request: the allocator's events from each host file's `/host:CPU` plane, in
the diagnosis's own pass over the file (`diagnose(..., memory_timeline=True)`), the pprof file
whole, here. A host file whose allocator events cannot be read is a warning; the others go on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tpudiag.model.text import one_line

if TYPE_CHECKING:  # typing only: `tpudiag --help` loads this module, and these load pandas
    from tpudiag.model.allocator import HostMemoryTimeline
    from tpudiag.model.live_buffers import LiveBytes
    from tpudiag.model.profile import HostFailure

PPROF_HELP = ("JAX's device memory profile (`jax.profiler.save_device_memory_profile(FILE)`, a pprof file): "
              "live buffer bytes by the source line that made them")


@dataclass(frozen=True)
class MeasuredMemory:
    timelines: tuple[HostMemoryTimeline, ...]  # one per host file of a capture PATH; () otherwise
    failures: tuple[HostFailure, ...]
    live: LiveBytes | None  # from --pprof


def measured_memory(timelines: tuple[list[HostMemoryTimeline], list[HostFailure]] | None,
                    pprof: Path | None) -> MeasuredMemory:
    """`timelines`: the allocator's timelines the diagnosis read with the capture, and the host
    files whose allocator events could not be read (each a warning on stderr); None without a capture."""
    from tpudiag.analysis.live_buffers import live_bytes_of

    found, failures = timelines if timelines is not None else ([], [])
    for failure in failures:
        sys.stderr.write(f"warning: {one_line(failure.text())}\n")
    return MeasuredMemory(tuple(found), tuple(failures), None if pprof is None else live_bytes_of(pprof))


def render_measured_terminal(m: MeasuredMemory, console: Console, top: int) -> None:
    from tpudiag.render.memory_runtime import render_live_bytes_terminal, render_timelines_terminal

    if m.timelines:
        console.print()
        render_timelines_terminal(list(m.timelines), console, top=top)
    if m.live is not None:
        console.print()
        render_live_bytes_terminal(m.live, console, top=top)


def measured_json(m: MeasuredMemory) -> dict:
    """The JSON keys of the measured views: `memory_over_time` (one entry per host file of a capture,
    [] otherwise), `live_buffers` (null without --pprof) and `measured_failures`."""
    from tpudiag.analysis.memory_timeline import XPROF_MAX_SNAPSHOTS
    from tpudiag.render.memory_runtime import live_bytes_to_dict, timelines_to_dict

    return {"memory_over_time": timelines_to_dict(list(m.timelines), XPROF_MAX_SNAPSHOTS),
            "live_buffers": None if m.live is None else live_bytes_to_dict(m.live),
            "measured_failures": [{"path": f.path, "message": f.text()} for f in m.failures]}
