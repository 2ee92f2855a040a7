"""One step's per-core timeline: op spans, async collectives in flight and idle gaps, per lane.

A lane is one core of one host. Offsets are relative to that core's own step start, so lanes of
different hosts (whose clocks are not aligned) compare by shape, not by absolute time. Only
top-level ops (depth 0) are spans; nested ops are inside their parent's span already. An op is a
`collective` span when it is a synchronous collective or the wait on an async one (the time the
core is blocked: exposed), `io` for infeed/outfeed and host transfers, else `compute`, exactly
as the step breakdown classifies them (`tpudiag.analysis.steps`). Async windows (start to done)
are listed apart as `in_flight`: the collective runs there, hidden where compute overlaps it.

`rasterize` turns a lane into one kind per terminal cell for a given width; it is the only
resolution-dependent step, and it is pure, so the TUI draws cells and computes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.model.intervals import covered, merge
from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.errors import InputError
from tpudiag.model.hlo_names import collective_family, is_io
from tpudiag.model.profile import HostFailure, HostTrace
from tpudiag.parsers.capture import parse_file_or_failure
from tpudiag.parsers.capture_files import as_location

COMPUTE, COLLECTIVE, IO, IDLE, OUTSIDE = "compute", "collective", "io", "idle", ""
KINDS = (COMPUTE, COLLECTIVE, IO, IDLE)


@dataclass(frozen=True)
class Span:
    """One top-level op occurrence on a lane."""

    offset_ps: int  # from the lane's step start
    dur_ps: int
    name: str
    kind: str  # COMPUTE, COLLECTIVE or IO


@dataclass(frozen=True)
class InFlight:
    """An async collective or copy window (start op begins to done op ends), clipped to the step."""

    offset_ps: int
    dur_ps: int
    name: str
    family: str


@dataclass(frozen=True)
class Gap:
    """A stretch of the step with no top-level op running on the core."""

    offset_ps: int
    dur_ps: int


@dataclass(frozen=True)
class Lane:
    host: str
    device: str
    core: int
    step_start_ps: int  # absolute, on this host's clock
    dur_ps: int
    busy_ps: int
    compute_ps: int
    collective_ps: int  # exposed: the core waits in a collective
    io_ps: int
    idle_ps: int
    in_flight_ps: int  # union of async windows inside the step
    spans: tuple[Span, ...]
    in_flight: tuple[InFlight, ...]
    gaps: tuple[Gap, ...]  # longest first

    @property
    def label(self) -> str:
        return f"{self.host} {self.device.removeprefix('/device:')}"


@dataclass(frozen=True)
class StepTimeline:
    step: int
    steps: tuple[int, ...]  # every step number present, sorted, for step-to-step navigation
    lanes: tuple[Lane, ...]  # by host order, then core
    span_ps: int  # the longest lane: the common time scale

    def neighbour(self, delta: int) -> int | None:
        """The step number `delta` positions away in `steps`, or None at either end."""
        i = self.steps.index(self.step) + delta
        return self.steps[i] if 0 <= i < len(self.steps) else None


def step_numbers(analysis: Analysis) -> tuple[int, ...]:
    """Every step number with a step on some core of some host, sorted."""
    return tuple(sorted(int(s) for s in analysis.steps["step"].unique()))


def step_timeline(analysis: Analysis, step: int | None = None) -> StepTimeline | None:
    """The timeline of `step` (default: the first step); None when the capture has no steps."""
    steps = step_numbers(analysis)
    if not steps:
        return None
    if step is None:
        step = steps[0]
    if step not in steps:
        raise ValueError(f"step {step} is not in the capture; steps are {steps[0]}..{steps[-1]}")
    rows = analysis.steps[analysis.steps["step"] == step]
    host_order = {h.host: i for i, h in enumerate(analysis.profile.hosts)}
    lanes = []
    for host in analysis.profile.hosts:
        host_rows = rows[rows["host"] == host.host].sort_values("core", kind="stable")
        if host_rows.empty:
            continue
        events, windows = host_events(host)
        for r in host_rows.itertuples(index=False):
            lanes.append(_lane(events, windows, r))
    lanes.sort(key=lambda lane: (host_order[lane.host], lane.core))
    return StepTimeline(step=step, steps=steps, lanes=tuple(lanes),
                        span_ps=max((lane.dur_ps for lane in lanes), default=0))


# Hosts of a multi-host capture come without events (their digests hold what the analysis
# needs); the timeline re-reads a host's file when it draws that host, keeping the last few.
_REREAD_CACHE_HOSTS = 4
_reread: OrderedDict[str, tuple[pd.DataFrame, pd.DataFrame]] = OrderedDict()


def host_events(host: HostTrace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(events, async windows) of `host`, read again from its file when they were dropped (the
    timeline and the trace-event export, `render.trace_events`, draw events)."""
    if host.events is not None:
        return host.events, host.async_windows
    where = host.source or host.path
    if where not in _reread:
        parsed = parse_file_or_failure(as_location(where))
        if isinstance(parsed, HostFailure):
            raise InputError(f"cannot read the host again for its timeline: {parsed.message}")
        _reread[where] = (parsed.events, parsed.async_windows)
        while len(_reread) > _REREAD_CACHE_HOSTS:
            _reread.popitem(last=False)
    _reread.move_to_end(where)
    return _reread[where]


def _kind(name: str, category: str) -> str:
    if collective_family(name):
        return COLLECTIVE
    if is_io(category):
        return IO
    return COMPUTE


def _lane(events: pd.DataFrame, windows: pd.DataFrame, r) -> Lane:
    start, end = int(r.start_ps), int(r.start_ps) + int(r.dur_ps)
    on = events[(events["core"] == r.core) & (events["device"] == r.device) & (events["depth"] == 0)
                & (events["start_ps"] < end) & (events["start_ps"] + events["dur_ps"] > start)]
    on = on.sort_values("start_ps", kind="stable")
    spans = []
    for e in on.itertuples(index=False):
        s = max(int(e.start_ps), start)
        t = min(int(e.start_ps) + int(e.dur_ps), end)
        spans.append(Span(s - start, t - s, str(e.name), _kind(str(e.name), str(e.category))))
    flights = []
    if not windows.empty:
        w = windows[(windows["core"] == r.core) & (windows["device"] == r.device)
                    & (windows["start_ps"] < end) & (windows["end_ps"] > start)].sort_values("start_ps")
        for x in w.itertuples(index=False):
            s, t = max(int(x.start_ps), start), min(int(x.end_ps), end)
            flights.append(InFlight(s - start, t - s, str(x.name), str(x.family)))
    busy_s, busy_e = merge(np.array([s.offset_ps for s in spans], dtype=np.int64),
                           np.array([s.offset_ps + s.dur_ps for s in spans], dtype=np.int64))
    gaps = _gaps(busy_s, busy_e, int(r.dur_ps))
    fl_s, fl_e = merge(np.array([f.offset_ps for f in flights], dtype=np.int64),
                       np.array([f.offset_ps + f.dur_ps for f in flights], dtype=np.int64))
    return Lane(host=str(r.host), device=str(r.device), core=int(r.core), step_start_ps=start, dur_ps=int(r.dur_ps),
                busy_ps=int(r.busy_ps), compute_ps=int(r.compute_ps), collective_ps=int(r.collective_ps),
                io_ps=int(r.io_ps), idle_ps=int(r.idle_ps), in_flight_ps=int((fl_e - fl_s).sum()),
                spans=tuple(spans), in_flight=tuple(flights),
                gaps=tuple(sorted(gaps, key=lambda g: (-g.dur_ps, g.offset_ps))))


def _gaps(busy_s: np.ndarray, busy_e: np.ndarray, dur: int) -> list[Gap]:
    edges_s = np.concatenate([[0], busy_e])
    edges_e = np.concatenate([busy_s, [dur]])
    return [Gap(int(s), int(e - s)) for s, e in zip(edges_s, edges_e) if e > s]


# A collective shows in a cell when it covers at least this share of the cell, even when compute
# covers more: a short exposed wait must not vanish at terminal resolution.
COLLECTIVE_MIN_CELL_SHARE = 0.25


def rasterize(lane: Lane, width: int, span_ps: int) -> tuple[str, ...]:
    """One kind per cell: `width` cells covering [0, span_ps) of the lane.

    A cell takes the kind covering most of it (idle included), except that a collective covering
    at least `COLLECTIVE_MIN_CELL_SHARE` of the cell wins. Cells past the lane's own step end are
    `OUTSIDE` (""), so a shorter step shows shorter than the longest lane.
    """
    if width <= 0:
        return ()
    if span_ps <= 0:
        return (OUTSIDE,) * width
    edges = np.linspace(0, span_ps, width + 1).round().astype(np.int64)
    lo, hi = edges[:-1], edges[1:]
    cell = np.maximum(hi - lo, 1)
    cover = {}
    for kind in (COMPUTE, COLLECTIVE, IO):
        spans = [s for s in lane.spans if s.kind == kind]
        s, e = merge(np.array([x.offset_ps for x in spans], dtype=np.int64),
                     np.array([x.offset_ps + x.dur_ps for x in spans], dtype=np.int64))
        cover[kind] = covered(lo, hi, s, e) if len(s) else np.zeros(width, dtype=np.int64)
    inside = np.clip(np.minimum(hi, lane.dur_ps) - lo, 0, None)
    cover[IDLE] = np.clip(inside - cover[COMPUTE] - cover[COLLECTIVE] - cover[IO], 0, None)
    stacked = np.stack([cover[k] for k in KINDS])
    best = np.argmax(stacked, axis=0)
    out = []
    for i in range(width):
        if inside[i] <= 0:
            out.append(OUTSIDE)
        elif cover[COLLECTIVE][i] >= COLLECTIVE_MIN_CELL_SHARE * cell[i]:
            out.append(COLLECTIVE)
        else:
            out.append(KINDS[int(best[i])])
    return tuple(out)


def rasterize_in_flight(lane: Lane, width: int, span_ps: int) -> tuple[bool, ...]:
    """Per cell, whether an async collective is in flight during any part of it."""
    if width <= 0:
        return ()
    if span_ps <= 0 or not lane.in_flight:
        return (False,) * width
    edges = np.linspace(0, span_ps, width + 1).round().astype(np.int64)
    s, e = merge(np.array([f.offset_ps for f in lane.in_flight], dtype=np.int64),
                 np.array([f.offset_ps + f.dur_ps for f in lane.in_flight], dtype=np.int64))
    return tuple(bool(c > 0) for c in covered(edges[:-1], edges[1:], s, e))


@dataclass(frozen=True)
class NameLabel:
    """An op's name where it fits on a lane drawn `width` cells wide: from `cell`, `text`."""

    cell: int
    text: str
    span: int  # index of the span in `Lane.spans`


def span_cells(span: Span, width: int, span_ps: int) -> tuple[int, int]:
    """The cells [first, last) a span covers when [0, span_ps) is drawn `width` cells wide; at
    least one cell."""
    if span_ps <= 0 or width <= 0:
        return 0, 0
    lo = int(span.offset_ps * width // span_ps)
    hi = int(-((-(span.offset_ps + span.dur_ps) * width) // span_ps))  # ceil
    lo = min(max(lo, 0), width - 1)
    return lo, max(lo + 1, min(hi, width))


def name_labels(lane: Lane, width: int, span_ps: int, shown=lambda name: name) -> tuple[NameLabel, ...]:
    """The ops whose name (as `shown` writes it) fits inside the cells their span covers, with one
    cell to spare, left to right, never overlapping (a name starts a cell after the previous one
    ends). Pure: the TUI places them under the lane."""
    out: list[NameLabel] = []
    free_from = 0
    for i, s in enumerate(lane.spans):
        lo, hi = span_cells(s, width, span_ps)
        text = shown(s.name)
        start = max(lo, free_from)  # after the previous name and its space
        if hi - start >= len(text) + 1:
            out.append(NameLabel(start, text, i))
            free_from = start + len(text) + 1
    return tuple(out)


@dataclass(frozen=True)
class OpPlace:
    """Where an op runs on the timeline: the step, the lane's index in its `StepTimeline`, the span's in the lane."""

    step: int
    lane: int
    span: int


def find_on_timeline(analysis: Analysis, ops: tuple[str, ...], host: str = "", max_steps: int = 8) -> OpPlace | None:
    """The first occurrence of any of `ops` (on `host` when given) in the first `max_steps` steps:
    the lanes of one step are drawn from the events, so the search stops early."""
    wanted = set(ops)
    for step in step_numbers(analysis)[:max_steps]:
        timeline = step_timeline(analysis, step)
        for li, lane in enumerate(timeline.lanes):
            if host and lane.host != host:
                continue
            for si, span in enumerate(lane.spans):
                if span.name in wanted:
                    return OpPlace(step, li, si)
    return None
