"""Hosts side by side from the analysis tables: step times, op time per step, idle and collectives.

The report's `stragglers.host_step_matrix` works on host summaries for display; rules need the
per-op and per-category times behind a slow host, so these read the analysis tables directly.
Per host, a quantity "per step" is its mean over the host's steps of the value on the core where
it is largest (the step time is the slowest core's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis, per_step_times


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
    parts = []
    for host in analysis.profile.hosts:
        ev = host.events
        inside = ev[ev["step"] >= 0]
        n_steps = inside["step"].nunique()
        if inside.empty or not n_steps:
            continue
        per = inside.groupby(["name", "step", "core"], observed=True)["self_ps"].sum()
        worst = per.groupby(level=["name", "step"], observed=True).max()
        mean = worst.groupby(level="name", observed=True).sum() / n_steps
        cats = inside.groupby("name", observed=True)["category"].first()
        parts.append(pd.DataFrame({"host": host.host, "name": mean.index.astype(str),
                                   "category": cats.reindex(mean.index).astype(str).to_numpy(),
                                   "self_ps": mean.to_numpy(dtype=np.float64)}))
    if not parts:
        return pd.DataFrame({"host": [], "name": [], "category": [], "self_ps": []})
    return pd.concat(parts, ignore_index=True)
