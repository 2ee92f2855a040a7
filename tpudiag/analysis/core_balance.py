"""Per-core balance: each core's own work per step against its peers', and the slowest core.

A core's *work* in a step is its busy time less its time in collectives. Step markers give every
core of a synchronous program the same step length, and the cores that finish their own ops first
wait for the slowest one inside the next collective: that wait is theirs on the trace but not
their own work. The slowest core is the one with the most work per step (the step length breaks
a tie); comparing step lengths alone names the first core whenever the markers are equal.

`slow_cores` finds the cores slower than their peers beyond noise, the fact the straggler-core
rule reports and straggler-host defers to (a host slow because of one of its cores is that core's
finding, not the host's).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.model.hlo_names import collective_family


@dataclass(frozen=True)
class CoreWork:
    host: str
    device: str  # plane name, `/device:TPU:3`
    core: int
    n_steps: int
    work_ps: float  # mean per step of busy - collective time
    std_ps: float  # standard deviation of its per-step work
    step_ps: float  # mean step length on this core


def core_work(steps: pd.DataFrame) -> list[CoreWork]:
    """Per (host, core) of the `schemas.STEPS` table, its mean work per step; ordered by host then core."""
    if steps.empty:
        return []
    frame = pd.DataFrame({"host": steps["host"].astype(str), "device": steps["device"].astype(str),
                          "core": steps["core"].to_numpy(), "dur": steps["dur_ps"].to_numpy(np.float64),
                          "work": (steps["busy_ps"] - steps["collective_ps"]).to_numpy(np.float64)})
    out = []
    for (host, core), g in frame.groupby(["host", "core"], sort=True):
        work = g["work"].to_numpy()
        out.append(CoreWork(host=str(host), device=str(g["device"].iloc[0]), core=int(core), n_steps=len(g),
                            work_ps=float(work.mean()), std_ps=float(work.std()) if len(work) > 1 else 0.0,
                            step_ps=float(g["dur"].mean())))
    return out


def capture_core_work(op_cores: pd.DataFrame, step_ps: float) -> list[CoreWork]:
    """Without steps: per (host, core) its work over the whole capture, counted as one step: the
    self time of its ops that are not collectives (`schemas.OP_CORES`, every host's). `step_ps`:
    the capture's mean span per core, what a lag is a share of."""
    if op_cores.empty:
        return []
    names = op_cores["name"].astype(str)
    work = np.where([collective_family(n) == "" for n in names], op_cores["self_ps"].to_numpy(np.float64), 0.0)
    frame = pd.DataFrame({"host": op_cores["host"].astype(str), "device": op_cores["device"].astype(str),
                          "core": op_cores["core"].to_numpy(), "work": work})
    return [CoreWork(host=str(host), device=str(g["device"].iloc[0]), core=int(core), n_steps=1,
                     work_ps=float(g["work"].sum()), std_ps=0.0, step_ps=step_ps)
            for (host, core), g in frame.groupby(["host", "core"], sort=True)]


def slowest_core(cores: Sequence[CoreWork]) -> CoreWork | None:
    """The core with the most work per step, then the longest steps; the first in order on a tie."""
    best = None
    for c in cores:
        if best is None or (c.work_ps, c.step_ps) > (best.work_ps, best.step_ps):
            best = c
    return best


@dataclass(frozen=True)
class SlowCore:
    core: CoreWork
    reference_ps: float  # the median work per step of every other core (all hosts)
    band_ps: float  # the noise band its lag exceeds
    host_reference_ps: float  # the median work of the other cores on its own host

    @property
    def lag_ps(self) -> float:
        return self.core.work_ps - self.reference_ps


def noise_band(reference_ps: float, cores: Sequence[CoreWork], min_lag_fraction: float,
               noise_sigmas: float) -> float:
    """The larger of `min_lag_fraction` of the reference and `noise_sigmas` x the cores' median
    step-to-step deviation of their work."""
    noise = statistics.median(c.std_ps for c in cores) if cores else 0.0
    return max(min_lag_fraction * reference_ps, noise_sigmas * noise)


def slow_cores(cores: Sequence[CoreWork], min_lag_fraction: float, noise_sigmas: float) -> list[SlowCore]:
    """Cores whose work per step exceeds both the median of every other core and the median of the
    other cores on their own host by more than the noise band, slowest first. A core alone on its
    host, or a host whose cores are all slow, is a host's lag (straggler-host's), not a core's."""
    out = []
    for c in cores:
        others = [o for o in cores if o is not c]
        mates = [o for o in others if o.host == c.host]
        if not mates:
            continue
        ref = statistics.median(o.work_ps for o in others)
        host_ref = statistics.median(o.work_ps for o in mates)
        band = noise_band(ref, cores, min_lag_fraction, noise_sigmas)
        if c.work_ps - ref > band and c.work_ps - host_ref > noise_band(host_ref, cores, min_lag_fraction,
                                                                         noise_sigmas):
            out.append(SlowCore(c, ref, band, host_ref))
    return sorted(out, key=lambda s: (-s.lag_ps, s.core.host, s.core.core))


@dataclass(frozen=True)
class OpExtra:
    name: str
    category: str
    core_ps: float  # the op's self time per step on the slow core
    peers_ps: float  # the median over the other cores (0 where a core does not run it)
    extra_ps: float  # core_ps - peers_ps, > 0


def op_extras(op_cores: pd.DataFrame, cores: Sequence[CoreWork], slow: CoreWork,
              categories: dict[str, str] | None = None, whole_capture: bool = False) -> list[OpExtra]:
    """The ops that take longer per step on `slow` than the median over the other `cores`, largest
    extra first, from `schemas.OP_CORES` (every host's, stacked): self time inside steps per core
    (`whole_capture`: in the whole capture, one step), summed over programs, divided by that core's
    steps."""
    if op_cores.empty:
        return []
    steps = {(c.host, c.core): c.n_steps for c in cores}
    frame = pd.DataFrame({"host": op_cores["host"].astype(str), "core": op_cores["core"].to_numpy(),
                          "name": op_cores["name"].astype(str),
                          "ps": op_cores["self_ps" if whole_capture else "in_steps_ps"].to_numpy(np.float64)})
    per = frame.groupby(["host", "core", "name"], sort=False)["ps"].sum().unstack("name", fill_value=0.0)
    n = np.array([steps.get((h, int(c)), 0) for h, c in per.index], dtype=np.float64)
    keep = n > 0
    per = per[keep].div(n[keep], axis=0)
    key = (slow.host, slow.core)
    if key not in per.index:
        return []
    mine = per.loc[key]
    others = per.drop(index=key)
    if others.empty:
        return []
    median = others.median(axis=0)
    extra = mine - median
    categories = categories or {}
    out = [OpExtra(str(name), categories.get(str(name), ""), float(mine[name]), float(median[name]), float(e))
           for name, e in extra.items() if e > 0]
    return sorted(out, key=lambda o: (-o.extra_ps, o.name))
