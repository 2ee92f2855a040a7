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

import numpy as np
import pandas as pd

from tpudiag.analysis.collective_windows import host_windows, summarize_windows
from tpudiag.analysis.host_transfers import host_copies, host_copy_mask, transfer_table
from tpudiag.analysis.idle import capture_windows, host_idle_tables
from tpudiag.analysis.ops import aggregate_ops
from tpudiag.analysis.steps import build_steps
from tpudiag.model import schemas
from tpudiag.model.grouping import group_sums, heads
from tpudiag.model.profile import HostDigest, HostFailure, HostTrace, StepKind, StepTables
from tpudiag.parsers.capture import HostUrl, PlaneReader, parse_file_or_failure


def digest_host(host: HostTrace) -> HostDigest:
    """The digest of one host with its events (it labels each event with its step, in place)."""
    if host.events is None:
        raise ValueError(f"host {host.host}: no events to digest")
    copies = host_copies(host.op_metadata)
    steps, source = build_steps(host, host_copy_mask(host.events, copies))
    executions = source.kind is StepKind.XLA_MODULES
    # Without steps, idle is measured over each core's span of the capture (`idle.capture_windows`)
    windows = steps if not steps.empty else capture_windows(host.events)
    gaps, idle_steps = host_idle_tables(host, windows, executions)
    op_cores, op_step_sums, op_step_worst = op_tables(host)
    collectives, collective_op_steps = summarize_windows(host_windows(host, steps), host.host)
    return HostDigest(steps=steps, step_source=source, ops=aggregate_ops(host),
                      core_span_ps=core_spans(host.events, steps), n_events=len(host.events), op_cores=op_cores,
                      op_means=op_means(op_step_worst, host.host), collectives=collectives,
                      per_step=StepTables(op_step_worst, op_step_sums, collective_op_steps),
                      idle_gaps=gaps, idle_steps=idle_steps, executions=executions,
                      host_transfers=transfer_table(host.events, copies, host.host))


def op_means(op_step_worst: pd.DataFrame, host: str) -> pd.DataFrame:
    """`schemas.OP_MEANS`: per op, its worst core's self time averaged over the host's steps (ops
    outside every step left out), the per-host figure straggler-host compares between hosts."""
    inside = op_step_worst[op_step_worst["step"] >= 0]
    n_steps = inside["step"].nunique()
    if not n_steps:
        return schemas.OP_MEANS.empty()
    mean = (inside.groupby("name", observed=True)["self_ps"].sum() / n_steps).reset_index()
    return schemas.OP_MEANS.of_host(mean, host)


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
    self_ps = ev["self_ps"].to_numpy()
    step = ev["step"].to_numpy().astype(np.int64) + 1  # -1 (outside every step) becomes code 0
    program, programs = pd.factorize(ev["program_id"].to_numpy())
    cores = _op_cores(ev, program, programs, np.where(step > 0, self_ps, 0))
    # Per-step tables from integer codes (one sort each): millions of events on a training host.
    names = ev["name"].cat.categories
    name = ev["name"].cat.codes.to_numpy()
    (s, p, nm), sums = group_sums([step, program, name], self_ps)
    (s2, nm2, _), per_core = group_sums([step, name, ev["core"].to_numpy()], self_ps)
    first = heads([s2, nm2])  # the worst core of each (step, op): max over its run of cores
    return (schemas.OP_CORES.of_host(cores, host.host),
            schemas.OP_STEP_SUMS.of_host(pd.DataFrame({
                "step": s - 1, "program_id": programs[p], "name": pd.Categorical.from_codes(nm, categories=names),
                "self_ps": sums})),
            schemas.OP_STEP_WORST.of_host(pd.DataFrame({
                "step": s2[first] - 1, "name": pd.Categorical.from_codes(nm2[first], categories=names),
                "self_ps": np.maximum.reduceat(per_core, first)})))


def _op_cores(ev: pd.DataFrame, program: np.ndarray, programs: np.ndarray, in_steps_ps: np.ndarray) -> pd.DataFrame:
    """Count, self time and self time inside steps per (device, program, op), with the op's first
    core, groups in order of first appearance (pandas' `groupby(sort=False)`), from integer codes."""
    device = ev["device"].cat.codes.to_numpy().astype(np.int64)
    name = ev["name"].cat.codes.to_numpy().astype(np.int64)
    self_ps, core = ev["self_ps"].to_numpy(), ev["core"].to_numpy()
    named = (device >= 0) & (name >= 0)  # a missing key leaves its event out, as groupby drops it
    if not named.all():
        device, name, program = device[named], name[named], program[named]
        self_ps, core, in_steps_ps = self_ps[named], core[named], in_steps_ps[named]
    n_names = len(ev["name"].cat.categories) + 1
    group, _ = pd.factorize((device * (len(programs) + 1) + program) * n_names + name)
    n_groups = int(group.max()) + 1 if len(group) else 0
    seen = np.maximum.accumulate(group)  # groups are numbered as they first appear
    first = np.flatnonzero(np.append(True, seen[1:] > seen[:-1])) if len(group) else group
    self_sum, in_steps_sum = np.zeros(n_groups, dtype=np.int64), np.zeros(n_groups, dtype=np.int64)
    np.add.at(self_sum, group, self_ps)
    np.add.at(in_steps_sum, group, in_steps_ps)
    return pd.DataFrame({
        "device": pd.Categorical.from_codes(device[first], dtype=ev["device"].dtype),
        "program_id": programs[program[first]],
        "name": pd.Categorical.from_codes(name[first], dtype=ev["name"].dtype),
        "n": np.bincount(group, minlength=n_groups).astype(np.int64), "self_ps": self_sum,
        "in_steps_ps": in_steps_sum, "core": core[first]})


# (field, schema, keys, value, how): each per-step table folds over hosts by max or sum per key,
# which is what its readers take over hosts anyway (the worst core of any host; a sum over cores).
_FOLDS = (("op_step_worst", schemas.OP_STEP_WORST, ["step", "name"], "self_ps", "max"),
          ("op_step_sums", schemas.OP_STEP_SUMS, ["step", "program_id", "name"], "self_ps", "sum"),
          ("collective_op_steps", schemas.COLLECTIVE_OP_STEPS, ["step", "kind", "name"], "exposed_ps", "max"))


def fold_step_tables(parts: list[StepTables]) -> StepTables:
    """Several hosts' (or partial folds') per-step tables in one, rows sorted by their keys."""
    if len(parts) == 1:
        return parts[0]  # one host: its own tables are the fold
    out = []
    for field, schema, keys, value, how in _FOLDS:
        both = schema.stack([getattr(p, field) for p in parts])
        if both.empty:
            out.append(both)
            continue
        folded = both.groupby(keys, observed=True, sort=False)[value].agg(how).reset_index()
        for key in keys:  # categories in name order, so the result does not depend on arrival order
            if isinstance(folded[key].dtype, pd.CategoricalDtype):
                folded[key] = folded[key].cat.set_categories(sorted(folded[key].cat.categories))
        out.append(schema.of_host(folded.sort_values(keys, kind="stable", ignore_index=True)))
    return StepTables(*out)


class StepFold:
    """Folds hosts' per-step tables as the hosts arrive (`load_capture`'s `on_host`), a few at a
    time, and frees each host's own: the driver holds one set of them, not one per host."""

    BATCH = 8  # hosts folded together: fewer regroupings of the running fold, little memory

    def __init__(self) -> None:
        self._folded: StepTables | None = None
        self._pending: list[StepTables] = []

    def add(self, host: HostTrace) -> None:
        if host.digest is None or host.digest.per_step is None:
            return
        self._pending.append(host.digest.per_step)
        host.digest.per_step = None
        if len(self._pending) >= self.BATCH:
            self._fold()

    def _fold(self) -> None:
        parts = ([self._folded] if self._folded is not None else []) + self._pending
        self._folded = fold_step_tables(parts)
        self._pending = []

    def result(self) -> StepTables:
        if self._pending or self._folded is None:
            self._fold()
        return self._folded


def drop_events(host: HostTrace) -> None:
    """Free what the digest replaces: the events, the async windows and the host-plane spans."""
    host.events = None
    host.async_windows = schemas.ASYNC_WINDOWS.empty()
    host.host_events = None


def parse_and_digest(location: Path | HostUrl, plane_jobs: int = 1, keep_events: bool = True,
                     also: PlaneReader | None = None) -> HostTrace | HostFailure:
    """Worker task: parse one host file and digest it where it was parsed; with `keep_events` False
    only the digest and the per-op metadata travel back (and what `also` read in the same pass).
    Failures stay this host's failure."""
    result = parse_file_or_failure(location, plane_jobs, also)
    if isinstance(result, HostFailure):
        return result
    result.digest = digest_host(result)
    if not keep_events:
        drop_events(result)
    return result
