"""TensorCore idle per step, host and core, and what the host was doing meanwhile.

Idle is the part of a step's period that no op covers. The period is the step marker
for captures with a `Steps` line; for captures whose steps are module executions (inference, no
`Steps` line) it runs from one execution's start to the next one's on the same core, so the gap
between executions (waiting for the next dispatch) counts too. The last execution has no known
period and is left out.

Causes come from the host plane (`/host:CPU` TraceMe spans) overlapping each gap, by name:
compilation in the loop, synchronisation (device-to-host transfers, `block_until_ready`), input
(infeed, host-to-device transfers, data loading) and otherwise host-bound (Python, dispatch). Each
gap's time is attributed once, in that order of precedence; time no host span covers is
`unexplained`. Device infeed/outfeed ops are input waits too, counted separately (`io_ps`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.model.intervals import covered, merge
from tpudiag.model.profile import HostDigest, HostTrace

# Causes in order of precedence: a gap covered by a compile span and a dispatch span is compilation.
CAUSES = ("compilation", "synchronisation", "input", "host-bound")

_CAUSE_PATTERNS = (
    ("compilation", re.compile(r"compil|backend_compile|xlacompile|lower_jaxpr", re.I)),
    ("synchronisation", re.compile(
        r"transferfromdevice|transferliteralfromdevice|toliteral|copytohost|copy_to_host|d2h|device_get|"
        r"block_until_ready|blockhostuntilready|blockuntilready|await|synchroniz|synchronis", re.I)),
    ("input", re.compile(
        r"infeed|transfertodevice|transferliteraltodevice|bufferfrompyval|device_put|h2d|getnext|iterator|"
        r"dataloader|data_loader|tf\.data|grain|next_batch|load_batch|prefetch", re.I)),
)


def host_cause(name: str) -> str:
    """The cause a host TraceMe name points at; anything unmatched is host-bound (Python or dispatch)."""
    for cause, pattern in _CAUSE_PATTERNS:
        if pattern.search(name):
            return cause
    return "host-bound"


@dataclass(frozen=True)
class IdleTables:
    """`gaps`: one row per idle interval (host, core, step, start_ps, end_ps, between, and the ps of it
    attributed to each cause in `CAUSES` plus `unexplained`). `steps`: per (host, core, step) the
    period, idle, idle between executions, device I/O time, and the per-cause sums."""

    gaps: pd.DataFrame
    steps: pd.DataFrame
    executions: bool  # True when any host's steps are module executions (periods run to the next one)
    whole_capture: bool = False  # no host has steps: one window per core over the capture (`capture_windows`)


_CAUSE_COLS = [f"{c.replace('-', '_')}_ps" for c in CAUSES] + ["unexplained_ps"]


def cause_column(cause: str) -> str:
    return f"{cause.replace('-', '_')}_ps"


def _windows(steps: pd.DataFrame, executions: bool) -> pd.DataFrame:
    """Per (core, step): the period [start, end) and the end of the execution itself."""
    out = steps.sort_values(["core", "start_ps"]).copy()
    out["exec_end_ps"] = out["start_ps"] + out["dur_ps"]
    if executions:
        nxt = out.groupby("core")["start_ps"].shift(-1)
        out = out[nxt.notna()].copy()
        out["end_ps"] = nxt[nxt.notna()].astype(np.int64)
    else:
        out["end_ps"] = out["exec_end_ps"]
    return out


def _gaps_on_core(ws: np.ndarray, we: np.ndarray, busy_s: np.ndarray, busy_e: np.ndarray):
    """(window index, gap start, gap end) of the uncovered parts of each window."""
    # Complement of the busy union, as sorted disjoint intervals over the whole timeline.
    lo = np.iinfo(np.int64).min // 4
    hi = np.iinfo(np.int64).max // 4
    cs = np.concatenate([[lo], busy_e])
    ce = np.concatenate([busy_s, [hi]])
    keep = ce > cs
    cs, ce = cs[keep], ce[keep]
    first = np.searchsorted(ce, ws, side="right")
    last = np.searchsorted(cs, we, side="left")
    counts = np.clip(last - first, 0, None)
    win = np.repeat(np.arange(len(ws)), counts)
    idx = np.concatenate([np.arange(a, b) for a, b in zip(first, last) if b > a]) if counts.sum() else \
        np.zeros(0, dtype=np.int64)
    gs = np.maximum(cs[idx], ws[win])
    ge = np.minimum(ce[idx], we[win])
    ok = ge > gs
    return win[ok], gs[ok], ge[ok]


def _attribute(gs: np.ndarray, ge: np.ndarray, host: HostTrace) -> dict[str, np.ndarray]:
    """Per gap, the ps attributed to each cause (exclusive, by precedence) and the unexplained rest."""
    out = {col: np.zeros(len(gs), dtype=np.int64) for col in _CAUSE_COLS}
    hev = host.host_events
    if hev is None or hev.empty or not len(gs):
        out["unexplained_ps"] = ge - gs
        return out
    names = hev["name"].cat.categories
    cause_of_name = np.array([host_cause(str(n)) for n in names], dtype=object)
    causes = cause_of_name[hev["name"].cat.codes.to_numpy()]
    start = hev["start_ps"].to_numpy()
    end = start + hev["dur_ps"].to_numpy()
    done = np.zeros(len(gs), dtype=np.int64)
    sel = np.zeros(len(hev), dtype=bool)
    for cause in CAUSES:
        sel |= causes == cause
        so_far = covered(gs, ge, *merge(start[sel], end[sel]))  # union of this and earlier causes
        out[cause_column(cause)] = so_far - done
        done = so_far
    out["unexplained_ps"] = (ge - gs) - done
    return out


# lead_ps: the part of the idle before the window's first op (a step's start, before anything runs:
# typically the host preparing the step's input)
_GAP_COLUMNS = ["host", "core", "step", "start_ps", "end_ps", "idle_ps", "between_ps", "lead_ps", *_CAUSE_COLS]
_STEP_COLUMNS = ["host", "core", "step", "period_ps", "io_ps", "idle_ps", "between_ps", "lead_ps", *_CAUSE_COLS]


def host_idle_tables(host: HostTrace, steps: pd.DataFrame, executions: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(gaps, steps) of `IdleTables` for one host, from its events and its steps table."""
    gap_parts, step_parts = [], []
    ev = host.events
    if not steps.empty and ev is not None:
        sparse_cat = np.array(["SparseCore" in str(d) for d in ev["device"].cat.categories], dtype=bool)
        # Every depth: a nested op adds nothing to the union, but one that only partially overlaps its
        # predecessor (read as nested for the overlap) runs on past it, and that part is busy too.
        counted = ~sparse_cat[ev["device"].cat.codes.to_numpy()]
        core_arr = ev["core"].to_numpy()
        start = ev["start_ps"].to_numpy()
        end = start + ev["dur_ps"].to_numpy()
        for core, w in _windows(steps, executions).groupby("core", sort=True):
            on = counted & (core_arr == core)
            bs, be = merge(start[on], end[on])
            ws, we = w["start_ps"].to_numpy(), w["end_ps"].to_numpy()
            win, gs, ge = _gaps_on_core(ws, we, bs, be)
            exec_end = w["exec_end_ps"].to_numpy()[win]
            between = np.clip(ge - np.maximum(gs, exec_end), 0, None)
            lead = np.where(gs == ws[win], ge - gs, 0)
            attributed = _attribute(gs, ge, host)
            gap = pd.DataFrame({"host": host.host, "core": int(core), "step": w["step"].to_numpy()[win],
                                "start_ps": gs, "end_ps": ge, "idle_ps": ge - gs, "between_ps": between,
                                "lead_ps": lead, **attributed})
            gap_parts.append(gap)
            per = gap.groupby("step")[["idle_ps", "between_ps", "lead_ps", *_CAUSE_COLS]].sum()
            frame = pd.DataFrame({"host": host.host, "core": int(core), "step": w["step"].to_numpy(),
                                  "period_ps": we - ws, "io_ps": w["io_ps"].to_numpy()})
            frame = frame.merge(per, left_on="step", right_index=True, how="left").fillna(0)
            step_parts.append(frame)
    return _concat(gap_parts, _GAP_COLUMNS), _concat(step_parts, _STEP_COLUMNS)


def capture_windows(events: pd.DataFrame) -> pd.DataFrame:
    """For a capture without steps: one window per core, from its first op's start to its last op's
    end (XProf's per-core span), as step 0, so that idle is measured over the capture as a whole."""
    if events is None or events.empty:
        return pd.DataFrame({"core": [], "step": [], "start_ps": [], "dur_ps": [], "io_ps": []})
    ends = events["start_ps"] + events["dur_ps"]
    frame = pd.DataFrame({"core": events["core"].to_numpy(), "s": events["start_ps"].to_numpy(), "e": ends.to_numpy()})
    g = frame.groupby("core", sort=True)
    first, last = g["s"].min(), g["e"].max()
    return pd.DataFrame({"core": first.index.to_numpy(), "step": np.zeros(len(first), dtype=np.int64),
                         "start_ps": first.to_numpy(dtype=np.int64), "dur_ps": (last - first).to_numpy(dtype=np.int64),
                         "io_ps": np.zeros(len(first), dtype=np.int64)})


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in columns})
    for c in columns:
        if c not in ("host", "core", "step"):
            out[c] = out[c].astype(np.int64)
    return out[columns]


def idle_tables(digests: Mapping[str, HostDigest]) -> IdleTables:
    """Every host's idle gaps and per-step idle, from the hosts' digests (`Analysis.digests`)."""
    gaps, steps = [], []
    executions = False
    whole = not any(not d.steps.empty for d in digests.values())  # no host has steps: use capture windows
    for host, digest in digests.items():
        if digest.steps.empty and not whole:
            continue
        executions |= digest.executions
        gaps.append(digest.idle_gaps.assign(host=host))
        steps.append(digest.idle_steps.assign(host=host))
    return IdleTables(gaps=_concat(gaps, _GAP_COLUMNS), steps=_concat(steps, _STEP_COLUMNS), executions=executions,
                      whole_capture=whole)


@dataclass(frozen=True)
class HostIdle:
    """One host's device idle, per step: the mean over steps of the least idle core (time when every
    core of the host is idle at once is at most that), with its causes in the same proportion."""

    host: str
    n_steps: int
    period_ps: float  # mean step period
    idle_ps: float  # mean per step, least idle core
    between_ps: float  # of which between executions
    lead_ps: float  # of which before the step's first op (mean per step, least idle core)
    io_ps: float  # device infeed/outfeed time per step (mean, most I/O core)
    causes_ps: dict[str, float]  # cause (CAUSES and "unexplained") -> mean ps per step
    worst_step: int
    worst_idle_ps: int

    @property
    def share(self) -> float:
        return self.idle_ps / self.period_ps if self.period_ps else 0.0


def host_idle(tables: IdleTables) -> list[HostIdle]:
    out = []
    steps = tables.steps
    for host, hs in steps.groupby("host", sort=False, observed=True):
        # Per step, the core with the least idle stands for the host (its cores run in lockstep). The
        # period is the step's (its longest core's), as the header's step time is; but the cores of a
        # step-less capture (GPUs above all) each have a window of their own, and one core's idle over
        # another's longer window would understate the share: there, the least idle core's own.
        if tables.whole_capture:
            share = hs["idle_ps"] / hs["period_ps"].where(hs["period_ps"] > 0)
            least = hs.loc[share.fillna(0.0).groupby(hs["step"]).idxmin()].set_index("step")
            period = least["period_ps"]
        else:
            least = hs.loc[hs.groupby("step")["idle_ps"].idxmin()].set_index("step")
            period = hs.groupby("step")["period_ps"].max()
        io = hs.groupby("step")["io_ps"].max()
        causes = {c: float(least[cause_column(c)].mean()) for c in CAUSES}
        causes["unexplained"] = float(least["unexplained_ps"].mean())
        worst = int(least["idle_ps"].idxmax())
        out.append(HostIdle(host=str(host), n_steps=len(least), period_ps=float(period.mean()),
                            idle_ps=float(least["idle_ps"].mean()), between_ps=float(least["between_ps"].mean()),
                            lead_ps=float(least["lead_ps"].mean()),
                            io_ps=float(io.mean()), causes_ps=causes, worst_step=worst,
                            worst_idle_ps=int(least.loc[worst, "idle_ps"])))
    return out
