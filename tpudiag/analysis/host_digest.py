"""One host's events reduced to what the analysis and the rules read: its `HostDigest`.

A host file of hundreds of MB holds millions of events; everything downstream of parsing needs
only tables per (core, step, op), the host's steps, its collective windows folded per op and its
idle gaps. `parse_and_digest` parses a host and digests it in the same process (a pool process or
a Dask worker), so the driver receives the digest and, for a capture of several hosts, no
events: its memory grows with the largest host, not with the number of hosts. The events stay on
a single-host capture, where they cost nothing extra and the TUI timeline reads them directly.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tpudiag.analysis.collective_windows import host_windows, summarize_windows
from tpudiag.analysis.idle import host_idle_tables
from tpudiag.analysis.ops import aggregate_ops
from tpudiag.analysis.steps import build_steps
from tpudiag.model import schemas
from tpudiag.model.profile import HostDigest, HostFailure, HostTrace, WindowThresholds
from tpudiag.parsers.capture import HostUrl, parse_file_or_failure


def digest_host(host: HostTrace, thresholds: WindowThresholds | None = None) -> HostDigest:
    """The digest of one host with its events (it labels each event with its step, in place)."""
    if host.events is None:
        raise ValueError(f"host {host.host}: no events to digest")
    thresholds = thresholds or WindowThresholds()
    steps, source = build_steps(host)
    windows = host_windows(host, steps, thresholds)
    executions = source.kind == "XLA Modules"
    gaps, idle_steps = host_idle_tables(host, steps, executions)
    op_cores, op_step_sums, op_step_worst = op_tables(host)
    return HostDigest(steps=steps, step_source=source, ops=aggregate_ops(host),
                      core_span_ps=core_spans(host.events, steps), n_events=len(host.events), op_cores=op_cores,
                      op_step_sums=op_step_sums, op_step_worst=op_step_worst,
                      collectives=summarize_windows(windows, host.host), thresholds=thresholds,
                      idle_gaps=gaps, idle_steps=idle_steps, executions=executions)


def core_spans(events: pd.DataFrame, steps: pd.DataFrame) -> int:
    """Sum over cores of (last end - first start) over op events and step markers."""
    if events.empty:
        return 0
    ends = events["start_ps"] + events["dur_ps"]
    frame = pd.DataFrame({"core": events["core"], "s": events["start_ps"], "e": ends})
    if not steps.empty:
        frame = pd.concat([frame, pd.DataFrame({"core": steps["core"], "s": steps["start_ps"],
                                                "e": steps["start_ps"] + steps["dur_ps"]})])
    g = frame.groupby("core")
    return int((g["e"].max() - g["s"].min()).sum())


def op_tables(host: HostTrace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(`OP_CORES`, `OP_STEP_SUMS`, `OP_STEP_WORST`) of one host: self time per core, and per step
    summed over the cores or on the worst core. Per-step tables hold steps x ops rows (a training
    capture runs most ops once per step), so they are reduced over the cores here, on the worker."""
    ev = host.events
    if ev.empty:
        return schemas.OP_CORES.empty(), schemas.OP_STEP_SUMS.empty(), schemas.OP_STEP_WORST.empty()
    cores = (ev.groupby(["device", "program_id", "name"], observed=True, sort=False)
             .agg(n=("self_ps", "size"), self_ps=("self_ps", "sum"), core=("core", "first")).reset_index())
    sums = ev.groupby(["step", "program_id", "name"], observed=True, sort=False)["self_ps"].sum().reset_index()
    per_core = ev.groupby(["step", "name", "core"], observed=True, sort=False)["self_ps"].sum()
    worst = per_core.groupby(level=["step", "name"], observed=True, sort=False).max().reset_index()
    return (schemas.OP_CORES.of_host(cores, host.host), schemas.OP_STEP_SUMS.of_host(sums, host.host),
            schemas.OP_STEP_WORST.of_host(worst, host.host))


def drop_events(host: HostTrace) -> None:
    """Free what the digest replaces: the events, the async windows and the host-plane spans."""
    host.events = None
    host.async_windows = schemas.ASYNC_WINDOWS.empty()
    host.host_events = None


def parse_and_digest(location: Path | HostUrl, plane_jobs: int = 1, keep_events: bool = True,
                     thresholds: WindowThresholds | None = None) -> HostTrace | HostFailure:
    """Worker task: parse one host file and digest it where it was parsed; with `keep_events` False
    only the digest and the per-op metadata travel back. Failures stay this host's failure."""
    result = parse_file_or_failure(location, plane_jobs)
    if isinstance(result, HostFailure):
        return result
    result.digest = digest_host(result, thresholds)
    if not keep_events:
        drop_events(result)
    return result
