"""Per-host step times side by side, and which host holds each step back (the straggler).

A pure function of the report's host summaries. On each step recorded by at least two hosts,
the slowest host is that step's straggler when it is slower than the median host by at least
`StragglerOptions.min_lag_fraction` of the median; with one host there are no stragglers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tpudiag.model.report import HostSummary


@dataclass(frozen=True)
class StragglerOptions:
    min_lag_fraction: float = 0.01  # slower than the median host by at least 1 % of it

    def __post_init__(self) -> None:
        if not 0 <= self.min_lag_fraction < 10:
            raise ValueError(f"min_lag_fraction must be in [0, 10); got {self.min_lag_fraction}")


@dataclass(frozen=True)
class StepStraggler:
    step: int
    host: str
    lag_ps: int  # the straggler's step time minus the median host's


@dataclass(frozen=True)
class HostRow:
    host: str
    times_ps: tuple[int | None, ...]  # per step of `HostStepMatrix.steps`; None: not recorded here
    mean_ps: float | None
    behind_fastest_ps: float | None  # mean minus the fastest host's mean
    straggler_steps: tuple[int, ...]  # steps on which this host is the straggler
    slowest_step: int | None  # the step this host took longest on (the first such); None without steps


@dataclass(frozen=True)
class HostStepMatrix:
    steps: tuple[int, ...]  # every step number any host recorded, sorted
    rows: tuple[HostRow, ...]  # in the report's host order
    stragglers: tuple[StepStraggler, ...]  # by step

    def straggler_on(self, step: int) -> str:
        return next((s.host for s in self.stragglers if s.step == step), "")


def host_step_matrix(hosts: tuple[HostSummary, ...], options: StragglerOptions = StragglerOptions()) -> HostStepMatrix:
    steps = tuple(sorted({n for h in hosts for n in h.step_numbers}))
    by_host = {h.host: dict(zip(h.step_numbers, h.step_times_ps)) for h in hosts}
    stragglers = []
    for step in steps:
        times = {h.host: by_host[h.host][step] for h in hosts if step in by_host[h.host]}
        if len(times) < 2:
            continue
        median = statistics.median(times.values())
        host, slowest = max(times.items(), key=lambda kv: kv[1])
        if slowest - median >= options.min_lag_fraction * median and slowest > median:
            stragglers.append(StepStraggler(step, host, int(slowest - median)))
    means = [h.step_time.mean_ps for h in hosts if h.step_time is not None]
    fastest = min(means) if means else None
    rows = tuple(HostRow(
        host=h.host,
        times_ps=tuple(by_host[h.host].get(s) for s in steps),
        mean_ps=h.step_time.mean_ps if h.step_time else None,
        behind_fastest_ps=(h.step_time.mean_ps - fastest) if h.step_time and fastest is not None else None,
        straggler_steps=tuple(s.step for s in stragglers if s.host == h.host),
        slowest_step=_slowest(by_host[h.host]),
    ) for h in hosts)
    return HostStepMatrix(steps=steps, rows=rows, stragglers=tuple(stragglers))


def _slowest(times: dict[int, int]) -> int | None:
    if not times:
        return None
    return max(sorted(times), key=lambda step: times[step])
