"""Steps per host and core, their breakdown, and the assignment of op events to steps.

Step boundaries come from the `Steps` line (training) where present, else from executions of the
program that repeats and holds the most device time (inference has no Steps line), aligned across
cores (`aligned_executions`). Per core, when several markers
share a step number, the longest is kept, as XProf does. Busy time is the union of op intervals
inside the step, so busy + idle = step duration exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.model.intervals import count_at_or_before, covered, merge
from tpudiag.model import schemas
from tpudiag.model.hlo_names import IO_CATEGORIES, event_families
from tpudiag.model.profile import HostTrace, Platform, StepKind, StepSource


def step_markers(host: HostTrace) -> tuple[pd.DataFrame, StepSource]:
    """(device, core, step, start_ps, dur_ps) markers, one per core and step."""
    markers = host.step_markers
    source = StepSource(StepKind.ANNOTATIONS if host.device.platform is Platform.CPU else StepKind.STEPS_LINE)
    if markers.empty:
        mods = host.modules[~host.modules["device"].astype(str).str.contains("SparseCore", regex=False)]
        if mods.empty:
            return markers, StepSource(StepKind.NONE)
        program, module = step_program(mods)
        chosen = mods[(mods["program_id"] == program) & (mods["module"].astype(str) == module)]
        markers, left_out = aligned_executions(chosen)
        source = StepSource(StepKind.XLA_MODULES, module, program, left_out)
    longest = markers.sort_values("dur_ps", ascending=False).drop_duplicates(["core", "step"])
    return longest.sort_values(["core", "start_ps"]).reset_index(drop=True), source


def step_program(mods: pd.DataFrame) -> tuple[int, str]:
    """The program whose executions are the steps when there is no `Steps` line: of the programs
    that repeat (two executions or more on a core), the one with the most device time; with none
    repeating, the one with the most device time. A program is its (id, module name): modules whose
names carry no id share id 0. Ties go to the lower id, then name.

    One-off programs (an initialising `jit_broadcast_in_dim`, a warm-up collective) are not steps
    however long they run; each is listed beside the steps (`analysis.programs`).
    """
    mods = mods.assign(module=mods["module"].astype(str))
    keys = ["program_id", "module"]
    per_core = mods.groupby([*keys, "core"], observed=True).size().groupby(level=[0, 1]).max()
    time = mods.groupby(keys, observed=True)["dur_ps"].sum()
    table = pd.DataFrame({"time": time, "repeats": per_core.reindex(time.index) >= 2})
    pool = table[table["repeats"]] if table["repeats"].any() else table
    pool = pool.reset_index().sort_values(["time", *keys], ascending=[False, True, True], kind="stable")
    return int(pool["program_id"].iloc[0]), str(pool["module"].iloc[0])


def aligned_executions(chosen: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(markers, executions left out): one program's executions numbered as steps across cores.

    The core with the most executions is the reference: its k-th execution is step k, and each
    other core's execution is the step whose reference start is nearest its own (one per step),
    if it is nearer than half the reference's median period (than its longest execution when the
    reference ran once): an execution with no peer there is no step's.
    As XProf intersects step events across cores (`IntersectCombineStepEvents`), a step counts only
    when every core that runs the program ran it; the other executions are left out and counted.
    """
    if chosen.empty:
        return chosen[["device", "core", "start_ps", "dur_ps"]].assign(step=np.zeros(0, np.int64)), 0
    counts = chosen.groupby("core", observed=True).size().sort_index()
    ref_core = int(counts.idxmax())
    ref = np.sort(chosen.loc[chosen["core"] == ref_core, "start_ps"].to_numpy())
    starts = chosen["start_ps"].to_numpy()
    right = np.clip(np.searchsorted(ref, starts), 0, len(ref) - 1)
    left = np.clip(right - 1, 0, None)
    nearer_left = np.abs(starts - ref[left]) < np.abs(ref[right] - starts)
    step = np.where(nearer_left, left, right).astype(np.int64)
    frame = pd.DataFrame({
        "device": chosen["device"].astype(str).to_numpy(), "core": chosen["core"].to_numpy(), "step": step,
        "start_ps": starts, "dur_ps": chosen["dur_ps"].to_numpy(), "off": np.abs(starts - ref[step])})
    durs = chosen["dur_ps"].to_numpy()
    reach = np.median(np.diff(ref)) / 2 if len(ref) > 1 else (durs.max() if len(durs) else 0)
    frame = frame[(frame["off"] < reach) | (frame["off"] == 0)]
    frame = frame.sort_values("off", kind="stable").drop_duplicates(["core", "step"])
    on_every_core = frame.groupby("step")["core"].transform("size") == len(counts)
    kept = frame[on_every_core].drop(columns="off")
    return kept, len(chosen) - len(kept)


def build_steps(host: HostTrace, host_copy: np.ndarray | None = None) -> tuple[pd.DataFrame, StepSource]:
    """The steps table of one host, and label each event with its step (in place). `host_copy`
    marks the events that are async copies to or from host memory (`analysis.host_transfers`)."""
    markers, source = step_markers(host)
    if markers.empty:
        return schemas.STEPS.empty(), source
    events = host.events
    is_host_copy = host_copy if host_copy is not None else np.zeros(len(events), dtype=bool)
    step_col = np.full(len(events), -1, dtype=np.int64)
    is_collective = _collective_events(events)
    io_cats = np.array([str(c).lower() in IO_CATEGORIES for c in events["category"].cat.categories], dtype=bool)
    is_io = io_cats[events["category"].cat.codes.to_numpy()] if len(events) else np.zeros(0, bool)
    rows = []
    core_arr = events["core"].to_numpy()
    start = events["start_ps"].to_numpy()
    end = start + events["dur_ps"].to_numpy()
    depth = events["depth"].to_numpy()
    sparse_devices = np.array(["SparseCore" in str(d) for d in events["device"].cat.categories], dtype=bool)
    sparse = sparse_devices[events["device"].cat.codes.to_numpy()] if len(events) else np.zeros(0, bool)
    gpu = host.device.platform is Platform.GPU
    for core, m in markers.groupby("core", sort=True):
        on_core = np.flatnonzero((core_arr == core) & ~sparse)
        on = _block(on_core)  # the core's events, read through views when they are one block
        s_start = m["start_ps"].to_numpy()
        s_end = s_start + m["dur_ps"].to_numpy()
        steps = m["step"].to_numpy()
        if len(on_core):
            on_start = start[on]
            k = count_at_or_before(s_start, on_start) - 1
            inside = (k >= 0) & (on_start < s_end[np.clip(k, 0, None)])
            step_col[on_core[inside]] = steps[k[inside]]
        top = on_core[depth[on] == 0]
        busy = covered(s_start, s_end, *merge(start[top], end[top]))
        coll_idx = on_core[is_collective[on]]
        coll = covered(s_start, s_end, *merge(start[coll_idx], end[coll_idx]))
        io_idx = on_core[is_io[on]]
        io = covered(s_start, s_end, *merge(start[io_idx], end[io_idx]))
        hc_idx = on_core[is_host_copy[on]]
        hc = covered(s_start, s_end, *merge(start[hc_idx], end[hc_idx]))
        if gpu:
            # A GPU's collective kernel runs on its library's stream beside compute kernels on the
            # others: the part they cover is hidden, not time the GPU spends in the collective. (On a
            # TPU top-level ops are one line's: a container such as `while` spans the collectives in
            # it and is no compute, `analysis.collective_windows`.)
            comp_idx = top[~is_collective[top] & ~is_io[top] & ~is_host_copy[top]]
            coll = np.minimum(coll, busy - covered(s_start, s_end, *merge(start[comp_idx], end[comp_idx])))
        coll = np.minimum(coll, busy)
        io = np.minimum(io, busy - coll)
        hc = np.minimum(hc, busy - coll - io)
        dur = s_end - s_start
        rows.append(pd.DataFrame({
            "device": m["device"].astype(str).to_numpy(),
            "core": np.full(len(m), core, dtype=np.int32),
            "step": steps,
            "start_ps": s_start,
            "dur_ps": dur,
            "busy_ps": busy,
            "compute_ps": busy - coll - io - hc,
            "collective_ps": coll,
            "io_ps": io,
            "host_transfer_ps": hc,
            "idle_ps": dur - busy,
        }))
    events["step"] = step_col
    table = pd.concat(rows, ignore_index=True)
    table.insert(0, "host", host.host)
    return schemas.STEPS.frame({c: table[c].to_numpy() for c in schemas.STEPS.names}), source


def _block(positions: np.ndarray) -> slice | np.ndarray:
    """Sorted, distinct `positions` as a slice when they are one contiguous block (a core's events
    are its plane's, parsed as one block), so that indexing reads views instead of copying
    millions of values; else the positions themselves. Either indexes the same values."""
    if len(positions) and int(positions[-1]) - int(positions[0]) + 1 == len(positions):
        return slice(int(positions[0]), int(positions[-1]) + 1)
    return positions


def _collective_events(events: pd.DataFrame) -> np.ndarray:
    """Per event: True when the op is a collective (sync, or the wait of an async one).

    Judged on name and category together, as the ops table's `family` is, so an op named
    `fusion` of category `all-reduce-scatter fusion` counts as collective time in both.
    """
    if not len(events):
        return np.zeros(0, dtype=bool)
    family, _ = event_families([str(n) for n in events["name"].cat.categories],
                               [str(c) for c in events["category"].cat.categories],
                               events["name"].cat.codes.to_numpy(), events["category"].cat.codes.to_numpy())
    return family != 0
