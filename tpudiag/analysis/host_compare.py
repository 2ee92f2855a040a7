"""Hosts side by side from the analysis tables: step times, op time per step, idle and collectives.

The report's `stragglers.host_step_matrix` works on host summaries for display; rules need the
per-op and per-category times behind a slow host, so these read the analysis tables directly.
Per host, a quantity "per step" is its mean over the host's steps of the value on the core where
it is largest (the step time is the slowest core's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis, per_step_times
from tpudiag.model import schemas


@dataclass(frozen=True)
class HostStats:
    host: str
    n_steps: int
    step_ps: float  # mean step time (slowest core)
    std_ps: float  # standard deviation of its step times
    idle_ps: float  # mean idle per step, least idle core
    io_ps: float  # mean infeed/outfeed per step, most I/O core
    collective_ps: float  # mean collective time per step, most collective core


def host_stats(analysis: Analysis) -> list[HostStats]:
    steps = analysis.steps
    times = per_step_times(steps)
    out = []
    for host in analysis.profile.hosts:
        hs = steps[steps["host"] == host.host]
        if hs.empty:
            continue
        t = times.loc[times["host"] == host.host, "dur_ps"].to_numpy(dtype=np.float64)
        g = hs.groupby("step")
        out.append(HostStats(host=host.host, n_steps=len(t), step_ps=float(t.mean()),
                             std_ps=float(t.std()) if len(t) > 1 else 0.0,
                             idle_ps=float(g["idle_ps"].min().mean()), io_ps=float(g["io_ps"].max().mean()),
                             collective_ps=float(g["collective_ps"].max().mean())))
    return out


def op_time_per_step(analysis: Analysis) -> pd.DataFrame:
    """(host, name, category, self_ps): per host and op, the mean per step of its self time on the core where
    it is largest; ops outside every step are left out."""
    # Computed per host where it was parsed.
    means = schemas.OP_MEANS.stack([d.op_means for d in analysis.digests.values()], list(analysis.digests))
    if means.empty:
        return pd.DataFrame({"host": [], "name": [], "category": [], "self_ps": []})
    ops = analysis.ops
    cats = (pd.DataFrame({"host": ops["host"].astype(str), "name": ops["name"].astype(str),
                          "category": ops["category"].astype(str)})
            .groupby(["host", "name"], sort=False)["category"].first())
    keys = pd.MultiIndex.from_arrays([means["host"].astype(str), means["name"].astype(str)])
    return pd.DataFrame({"host": keys.get_level_values(0), "name": keys.get_level_values(1),
                         "category": cats.reindex(keys).fillna("").astype(str).to_numpy(),
                         "self_ps": means["self_ps"].to_numpy(dtype=np.float64)})


@dataclass(frozen=True)
class Straggler:
    host: str
    lag_ps: float  # its mean step time minus the other hosts' median
    reference_ps: float  # the other hosts' median step time
    band_ps: float  # the noise band the lag exceeds
    others_wait_ps: float  # the other hosts' median collective time per step minus the straggler's (>= 0)


def find_straggler(stats: list[HostStats], min_lag_fraction: float, noise_sigmas: float) -> Straggler | None:
    """The host slower than the median of the others by more than the noise band (the larger of
    `min_lag_fraction` of that median and `noise_sigmas` x the hosts' median step-time deviation)."""
    if len(stats) < 2:
        return None
    noise = statistics.median(s.std_ps for s in stats)
    found = []
    for s in stats:
        others = [o.step_ps for o in stats if o.host != s.host]
        ref = statistics.median(others) if len(others) > 1 else min(others)
        band = max(min_lag_fraction * ref, noise_sigmas * noise)
        if s.step_ps - ref > band:
            found.append((s.step_ps - ref, s.host, ref, band))
    if not found:
        return None
    lag, host, ref, band = max(found)
    slow = next(s for s in stats if s.host == host)
    wait = statistics.median(o.collective_ps for o in stats if o.host != host) - slow.collective_ps
    return Straggler(host, lag, ref, band, max(0.0, wait))
