"""One host's events reduced to what the analysis and the rules read: its `HostDigest`.

A host file of hundreds of MB holds millions of events; everything downstream of parsing needs
only tables per (core, step, op), the host's steps, its collective windows folded per op and its
idle gaps. `parse_and_digest` parses a host and digests it in the same process (a pool process or
a Dask worker), so the driver receives the digest and, for a capture of several hosts, no
events: its memory grows with the largest host, not with the number of hosts. The events stay on
a single-host capture, where they cost nothing extra and the TUI timeline reads them directly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.analysis.collective_windows import host_windows, summarize_windows
from tpudiag.analysis.host_transfers import host_copies, host_copy_mask, transfer_table
from tpudiag.analysis.idle import capture_windows, host_idle_tables
from tpudiag.analysis.ops import aggregate_ops
from tpudiag.analysis.steps import build_steps
from tpudiag.model import schemas
from tpudiag.model.grouping import dense_unique, factorize_runs, first_appearance_groups, group_sums, sums_by_group, worst_of_sums
from tpudiag.model.profile import HostDigest, HostFailure, HostTrace, StepKind, StepTables
from tpudiag.parsers import read_ahead
from tpudiag.parsers.capture import PlaneReader, parse_file_or_failure
from tpudiag.parsers.capture_files import HostUrl


# A host of at least this many events, digested with a second core free (`threads` 2), digests
# its collective windows in a second thread while this one makes the other tables: they only
# read the events, and numpy's large sorts, casts, index and arithmetic passes, like pandas'
# factorize, run without the GIL.
THREADED_DIGEST_MIN_EVENTS = 200_000


def digest_host(host: HostTrace, threads: int = 1) -> HostDigest:
    """The digest of one host with its events (it labels each event with its step, in place), its
    collective windows in a thread of their own when `threads` allows 2 and the host is big."""
    if host.events is None:
        raise ValueError(f"host {host.host}: no events to digest")
    copies = host_copies(host.op_metadata)
    steps, source = build_steps(host, host_copy_mask(host.events, copies))  # writes the step column first

    def collective_tables():
        return summarize_windows(host_windows(host, steps), host.host)

    pool = ThreadPoolExecutor(1) if threads > 1 and len(host.events) >= THREADED_DIGEST_MIN_EVENTS else None
    with pool or nullcontext():
        collective_job = pool.submit(collective_tables) if pool is not None else None
        executions = source.kind is StepKind.XLA_MODULES
        # Without steps, idle is measured over each core's span of the capture (`idle.capture_windows`)
        windows = steps if not steps.empty else capture_windows(host.events)
        gaps, idle_steps = host_idle_tables(host, windows, executions)
        op_cores, op_step_sums, op_step_worst = op_tables(host)
        ops = aggregate_ops(host)
        span_ps = core_spans(host.events, steps)
        transfers = transfer_table(host.events, copies, host.host)
        collectives, collective_op_steps = collective_job.result() if collective_job else collective_tables()
    return HostDigest(steps=steps, step_source=source, ops=ops,
                      core_span_ps=span_ps, n_events=len(host.events), op_cores=op_cores,
                      op_means=op_means(op_step_worst, host.host), collectives=collectives,
                      per_step=StepTables(op_step_worst, op_step_sums, collective_op_steps),
                      idle_gaps=gaps, idle_steps=idle_steps, executions=executions,
                      host_transfers=transfers)


def op_means(op_step_worst: pd.DataFrame, host: str) -> pd.DataFrame:
    """`schemas.OP_MEANS`: per op, its worst core's self time averaged over the host's steps (ops
    outside every step left out), the per-host figure straggler-host compares between hosts."""
    step = op_step_worst["step"].to_numpy()
    inside = step >= 0
    n_steps = len(dense_unique(step[inside]))
    if not n_steps:
        return schemas.OP_MEANS.empty()
    # Sums per name code, in the categories' order (a groupby of the names, observed only)
    name = op_step_worst["name"]
    codes = name.cat.codes.to_numpy()[inside].astype(np.int64)
    self_ps = op_step_worst["self_ps"].to_numpy()[inside]
    named = codes >= 0  # a missing name is left out, as groupby drops it
    present, sums = group_sums([codes[named]], self_ps[named])
    return schemas.OP_MEANS.of_host(pd.DataFrame({
        "name": pd.Categorical.from_codes(present[0], dtype=name.dtype), "self_ps": sums / n_steps}), host)


def core_spans(events: pd.DataFrame, steps: pd.DataFrame) -> int:
    """Sum over cores of (last end - first start) over op events and step markers."""
    if events.empty:
        return 0
    core = events["core"].to_numpy()
    start = events["start_ps"].to_numpy()
    end = start + events["dur_ps"].to_numpy()
    if not steps.empty:
        step_start = steps["start_ps"].to_numpy()
        core = np.concatenate([core, steps["core"].to_numpy()])
        start = np.concatenate([start, step_start])
        end = np.concatenate([end, step_start + steps["dur_ps"].to_numpy()])
    group, first = first_appearance_groups([core - core.min()])
    last_end = np.full(len(first), np.iinfo(np.int64).min, dtype=np.int64)
    first_start = np.full(len(first), np.iinfo(np.int64).max, dtype=np.int64)
    np.maximum.at(last_end, group, end)
    np.minimum.at(first_start, group, start)
    return int((last_end - first_start).sum())


def op_tables(host: HostTrace) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(`OP_CORES`, `OP_STEP_SUMS`, `OP_STEP_WORST`) of one host: self time per core, and per step
    summed over the cores or on the worst core. Per-step tables hold steps x ops rows (a training
    capture runs most ops once per step), so they are reduced over the cores here, on the worker."""
    ev = host.events
    if ev.empty:
        return schemas.OP_CORES.empty(), schemas.OP_STEP_SUMS.empty(), schemas.OP_STEP_WORST.empty()
    self_ps = ev["self_ps"].to_numpy()
    step = ev["step"].to_numpy().astype(np.int64) + 1  # -1 (outside every step) becomes code 0
    program, programs = factorize_runs(ev["program_id"].to_numpy())
    cores = _op_cores(ev, program, programs, np.where(step > 0, self_ps, 0))
    # Per-step tables from integer codes (one sort each): millions of events on a training host.
    names = ev["name"].cat.categories
    name = ev["name"].cat.codes.to_numpy()
    (s, p, nm), sums = group_sums([step, program, name], self_ps)
    (s2, nm2), worst = worst_of_sums([step, name], ev["core"].to_numpy(), self_ps)  # the worst core of each
    return (schemas.OP_CORES.of_host(cores, host.host),
            schemas.OP_STEP_SUMS.frame({
                "step": s - 1, "program_id": programs[p], "name": pd.Categorical.from_codes(nm, categories=names),
                "self_ps": sums}, owned=True),
            schemas.OP_STEP_WORST.frame({
                "step": s2 - 1, "name": pd.Categorical.from_codes(nm2, categories=names),
                "self_ps": worst}, owned=True))


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
    group, first = first_appearance_groups([device, program, name])
    n_groups = len(first)
    return pd.DataFrame({
        "device": pd.Categorical.from_codes(device[first], dtype=ev["device"].dtype),
        "program_id": programs[program[first]],
        "name": pd.Categorical.from_codes(name[first], dtype=ev["name"].dtype),
        "n": np.bincount(group, minlength=n_groups).astype(np.int64),
        "self_ps": sums_by_group(group, n_groups, self_ps),
        "in_steps_ps": sums_by_group(group, n_groups, in_steps_ps), "core": core[first]})


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
        out.append(_in_key_order(both.groupby(keys, observed=True, sort=False)[value].agg(how).reset_index(),
                                 schema, keys))
    return StepTables(*out)


def _in_key_order(folded: pd.DataFrame, schema, keys: list[str]) -> pd.DataFrame:
    """A folded table as the fold gives it, whatever order its parts came in: categories in name
    order, rows sorted by their keys."""
    for key in keys:
        if isinstance(folded[key].dtype, pd.CategoricalDtype):
            folded[key] = folded[key].cat.set_categories(sorted(folded[key].cat.categories))
    return schema.of_host(folded.sort_values(keys, kind="stable", ignore_index=True))


def _same_keys(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> bool:
    """Whether two per-step tables hold the same keys in the same rows (hosts of one program mostly do)."""
    if len(a) != len(b):
        return False
    for key in keys:
        x, y = a[key], b[key]
        if isinstance(x.dtype, pd.CategoricalDtype):
            if not (isinstance(y.dtype, pd.CategoricalDtype) and x.cat.categories.equals(y.cat.categories)
                    and np.array_equal(x.cat.codes.to_numpy(), y.cat.codes.to_numpy())):
                return False
        elif x.dtype != y.dtype or not np.array_equal(x.to_numpy(), y.to_numpy()):
            return False
    return True


_COMBINE = {"max": np.maximum, "sum": np.add}


class StepFold:
    """Folds hosts' per-step tables as the hosts arrive (`load_capture`'s `on_host`) and frees each
    host's own: the driver holds one set of them, not one per host.

    Each table's keys (one row per step and op, unique) are mostly the same on every host of a
    pod, row for row: a host with the keys of a fold already held has its values folded into it
    row by row (one `maximum` or `add` over the value column, about 10 ms for a 2 M-event host's
    870 k rows, where regrouping took about 0.25 s per host). Hosts with other keys start a fold of
    their own; a few such folds are regrouped into one (`fold_step_tables`). Either way the result
    is the same: the fold of every host, rows sorted by their keys.
    """

    BATCH = 8  # folds of different keys held before they are regrouped into one

    def __init__(self) -> None:
        self._folds: list[StepTables] = []  # each: hosts with the same keys, folded row by row
        self._several: list[bool] = []  # per fold: it holds several hosts (rows not yet in key order)

    def add(self, host: HostTrace) -> None:
        if host.digest is None or host.digest.per_step is None:
            return
        tables, host.digest.per_step = host.digest.per_step, None
        for i, fold in enumerate(self._folds):
            if all(_same_keys(getattr(fold, f), getattr(tables, f), keys) for f, _, keys, _, _ in _FOLDS):
                self._folds[i] = StepTables(*(_combined(getattr(fold, f), getattr(tables, f), value, how)
                                              for f, _, _, value, how in _FOLDS))
                self._several[i] = True
                return
        self._folds.append(tables)
        self._several.append(False)
        if len(self._folds) > self.BATCH:
            self._regroup()

    def _regroup(self) -> None:
        self._folds, self._several = [fold_step_tables(self._folds)], [False]

    def result(self) -> StepTables:
        if not self._folds:  # no host brought per-step tables
            return StepTables(*(schema.empty() for _, schema, _, _, _ in _FOLDS))
        if len(self._folds) > 1:
            self._regroup()
        elif self._several[0]:  # one host's tables are its own fold; several hosts' are in key order
            fold = self._folds[0]
            self._folds[0] = StepTables(*(_in_key_order(getattr(fold, f), schema, keys) if len(getattr(fold, f))
                                          else getattr(fold, f) for f, schema, keys, _, _ in _FOLDS))
            self._several[0] = False
        return self._folds[0]


def _combined(folded: pd.DataFrame, table: pd.DataFrame, value: str, how: str) -> pd.DataFrame:
    """`folded` with `table`'s values folded in row by row (same keys in the same rows)."""
    return folded.assign(**{value: _COMBINE[how](folded[value].to_numpy(), table[value].to_numpy())})


def drop_events(host: HostTrace) -> None:
    """Free what the digest replaces: the events, the async windows and the host-plane spans."""
    host.events = None
    host.async_windows = schemas.ASYNC_WINDOWS.empty()
    host.host_events = None


def parse_and_digest(location: Path | HostUrl, plane_jobs: int = 1, keep_events: bool = True,
                     also: PlaneReader | None = None) -> HostTrace | HostFailure:
    """Worker task: parse one host file and digest it where it was parsed; with `keep_events` False
    only the digest and the per-op metadata travel back (and what `also` read in the same pass).
    Failures stay this host's failure. A file a command began parsing ahead (`parsers.read_ahead`)
    is taken from there."""
    result = read_ahead.take(location) if also is None else None
    if result is None:
        result = parse_file_or_failure(location, plane_jobs, also)
    if isinstance(result, HostFailure):
        return result
    # More than one plane job: a single host, given the machine's cores (a pool's or a cluster's
    # hosts come with one each).
    result.digest = digest_host(result, threads=2 if plane_jobs > 1 else 1)
    if not keep_events:
        drop_events(result)
    return result
