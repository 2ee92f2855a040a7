"""Per memory space: the peak in use within the capture, the timeline, and what was live at the peak.

Follows XProf's memory profile (`ConvertXPlaneToMemoryProfile`, openxla/xprof
`xprof/convert/xplane_to_memory_profile.cc`), which is the oracle in
`tests/analysis/test_memory_timeline.py`:

- in use = `bytes_allocated` + `bytes_reserved` after each event; the peak is the largest, and on
  a tie the latest; capacity = in use + `bytes_available` there.
- an event without `group_id` takes the step after the last one seen (0 before any);
- live at the peak: the allocations of the peak's step, up to the peak, whose address was not
  freed since; what they do not account for of the peak's heap bytes is one "unattributed" row
  (allocated before the capture, or preallocated); alike allocations are merged with a count.

One deliberate difference (docs/xprof-differences.md): events are ordered by their time on the
host's axis (line timestamp + offset, clocks reconciled as in docs/time-axis.md). XProf orders
them by the offset within their line, which mixes threads whose lines start at different times.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.errors import InputError
from tpudiag.model.allocator import (UNATTRIBUTED, ActiveAllocation, AllocatorTimeline, HostAllocatorEvents,
                                     HostMemoryTimeline)
from tpudiag.model.profile import HostFailure
from tpudiag.parsers.allocator_events import allocator_events_of_planes, read_allocator_events
from tpudiag.parsers.capture import process_pool
from tpudiag.parsers.capture_files import find_capture

XPROF_MAX_SNAPSHOTS = 1000  # XProf samples its timeline graph down to this many points


def capture_memory_timelines(path: Path | str, jobs: int | None = None
                             ) -> tuple[list[HostMemoryTimeline], list[HostFailure]]:
    """Every host file of the capture at `path` (as `tpudiag report` resolves it), each read for its
    allocator events alone, in up to `jobs` processes (default: one per CPU); a host file that
    cannot be read is a failure and the others go on. Hosts come in the capture's file order."""
    files = find_capture(path).files
    workers = min(len(files), jobs or os.cpu_count() or 1)
    if workers <= 1:
        results = [_host_or_failure(f) for f in files]
    else:
        with process_pool(workers) as pool:
            results = list(pool.map(_host_or_failure, files))
    return ([r for r in results if isinstance(r, HostMemoryTimeline)],
            [r for r in results if isinstance(r, HostFailure)])


def _host_or_failure(path) -> HostMemoryTimeline | HostFailure:
    try:
        return host_memory_timeline(read_allocator_events(path))
    except InputError as exc:
        return HostFailure(str(path), exc.one_line(), exc.hint)


def timeline_of_planes(planes: list, roles, path, host: str) -> HostMemoryTimeline | HostFailure:
    """The allocator's timeline of a host file its parse has split into planes: read in the same
    pass as the diagnosis (`parsers.capture.PlaneReader`; `tpudiag memory PATH`), summarised where
    the host is parsed, so only the timeline travels. A plane that cannot be read is this host's
    failure here, and the diagnosis goes on."""
    try:
        return host_memory_timeline(allocator_events_of_planes(planes, roles, path, host))
    except InputError as exc:
        if exc.path is None:
            exc = InputError(exc.message, path=path, hint=exc.hint)
        return HostFailure(str(path), exc.one_line(), exc.hint)


def profile_memory_timelines(profile) -> tuple[list[HostMemoryTimeline], list[HostFailure]] | None:
    """The allocator timelines the parse read beside the diagnosis (`timeline_of_planes`), in the
    hosts' order, and the host files without one: those whose allocator events could not be read and
    those the parse could not read at all (`Profile.failures`); None where it was not asked to."""
    read = [h.memory_timeline for h in profile.hosts]
    if not read or any(r is None for r in read):
        return None
    return ([r for r in read if isinstance(r, HostMemoryTimeline)],
            [r for r in read if isinstance(r, HostFailure)] + list(profile.failures))


def host_memory_timeline(host: HostAllocatorEvents) -> HostMemoryTimeline:
    events = host.events
    allocators = tuple(allocator_timeline(str(name), group)
                       for name, group in events.groupby("allocator", observed=True, sort=True))
    return HostMemoryTimeline(host=host.host, path=host.path, allocators=allocators, warnings=host.warnings)


def allocator_timeline(name: str, events: pd.DataFrame) -> AllocatorTimeline:
    """One allocator's events (`schemas.ALLOCATOR_EVENTS` rows, in file order) summarised."""
    ev = events.iloc[np.argsort(events["time_ps"].to_numpy(), kind="stable")].reset_index(drop=True)
    in_use = ev["heap_bytes"].to_numpy() + ev["stack_bytes"].to_numpy()
    peak = int(in_use.max())
    at = int(np.flatnonzero(in_use == peak)[-1])  # the latest event at the peak
    steps = _steps(ev["step_id"].to_numpy())
    timeline = pd.DataFrame({
        "time_ps": ev["time_ps"].to_numpy(),
        "in_use_bytes": in_use,
        "free_bytes": ev["free_bytes"].to_numpy(),
        "step_id": steps,
        "allocation": ev["allocation"].to_numpy(),
        "allocation_bytes": ev["allocation_bytes"].to_numpy(),
    })
    peak_heap = int(ev["heap_bytes"].iat[at])
    peak_stack = int(ev["stack_bytes"].iat[at])
    return AllocatorTimeline(
        allocator=name, events=len(ev), peak_bytes=peak, peak_time_ps=int(ev["time_ps"].iat[at]),
        peak_heap_bytes=peak_heap, peak_stack_bytes=peak_stack, peak_step=int(steps[at]),
        capacity_bytes=peak + int(ev["free_bytes"].iat[at]),
        fragmentation_at_peak=float(ev["fragmentation"].iat[at]),
        lifetime_peak_bytes=int(ev["lifetime_peak_bytes"].max()),
        timeline=timeline,
        at_peak=_live_at_peak(ev, steps, int(steps[at]), int(ev["time_ps"].iat[at]), peak_heap, peak_stack))


def _steps(raw: np.ndarray) -> np.ndarray:
    """Step ids with the missing ones (-1) filled in: the step after the last one seen."""
    out = raw.copy()
    last = -1
    for i, step in enumerate(raw.tolist()):
        if step == -1:
            out[i] = last + 1
        else:
            last = step
    return out


def _live_at_peak(ev: pd.DataFrame, steps: np.ndarray, peak_step: int, peak_time_ps: int,
                  peak_heap: int, peak_stack: int) -> tuple[ActiveAllocation, ...]:
    live: dict[int, int] = {}  # address -> row of its allocation
    unattributed = peak_heap
    freed_elsewhere = 0  # freed in the step, allocated before it (or before the capture)
    times = ev["time_ps"].to_numpy()
    alloc = ev["allocation"].to_numpy()
    addresses = ev["address"].to_numpy()
    sizes = ev["allocation_bytes"].to_numpy()
    for i in range(len(ev)):
        if times[i] > peak_time_ps:
            break
        if steps[i] != peak_step:
            continue
        if alloc[i]:
            live[int(addresses[i])] = i
            unattributed -= int(sizes[i])
        else:
            if live.pop(int(addresses[i]), None) is None:
                freed_elsewhere += int(sizes[i])
            unattributed += int(sizes[i])
    unattributed -= freed_elsewhere
    rows = [_allocation(ev, i) for i in live.values()]
    if unattributed > 0:
        rows.append(ActiveAllocation(unattributed, unattributed, 1, UNATTRIBUTED, "", 0, "", attributed=False))
    if peak_stack > 0:
        rows.append(ActiveAllocation(peak_stack, peak_stack, 1, "stack", "stack", 0, "", attributed=False))
    rows.sort(key=lambda a: (-a.allocation_bytes, -a.requested_bytes, a.op, a.region_type, a.data_type_name,
                            a.shape, a.annotation))
    merged: list[ActiveAllocation] = []
    for row in rows:
        if merged and _alike(merged[-1], row):
            last = merged.pop()
            row = ActiveAllocation(last.allocation_bytes, last.requested_bytes, last.occurrences + 1, last.op,
                                   last.region_type, last.data_type, last.shape, last.attributed, last.annotation)
        merged.append(row)
    return tuple(merged)


def _allocation(ev: pd.DataFrame, i: int) -> ActiveAllocation:
    return ActiveAllocation(int(ev["allocation_bytes"].iat[i]), int(ev["requested_bytes"].iat[i]), 1,
                            str(ev["op"].iat[i]), str(ev["region_type"].iat[i]), int(ev["data_type"].iat[i]),
                            str(ev["shape"].iat[i]), annotation=str(ev["annotation"].iat[i]))


def _alike(a: ActiveAllocation, b: ActiveAllocation) -> bool:
    return (a.allocation_bytes, a.requested_bytes, a.op, a.region_type, a.data_type, a.shape, a.attributed,
            a.annotation) == (b.allocation_bytes, b.requested_bytes, b.op, b.region_type, b.data_type, b.shape,
                              b.attributed, b.annotation)


def sampled(timeline: pd.DataFrame, max_points: int = XPROF_MAX_SNAPSHOTS) -> pd.DataFrame:
    """At most `max_points` rows of a timeline, each the highest of its run of neighbours (a max box
    filter, as XProf draws its graph), so the peak always survives the sampling."""
    n = len(timeline)
    if n <= max_points:
        return timeline
    width = n // max_points
    narrow = max_points * (width + 1) - n  # boxes of `width`, then boxes of `width + 1`
    bounds = np.concatenate([np.arange(narrow) * width, narrow * width + np.arange(max_points - narrow + 1) * (width + 1)])
    values = timeline["in_use_bytes"].to_numpy()
    picks = [int(start + np.argmax(values[start:end])) for start, end in zip(bounds[:-1], bounds[1:])]
    return timeline.iloc[picks].reset_index(drop=True)
