"""The XLA programs a capture ran, each with its executions and device time (`ProgramTime`).

Read from every host's `XLA Modules` lines (TensorCores; SparseCore planes left out, as the steps
do). Without a `Steps` line one of them is the step (`analysis.steps.step_program`); the others
(warm-up collectives, initialisers, a second model) are listed beside it, so a report never hides
where the rest of the device time went.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from tpudiag.model.profile import HostTrace, StepKind, StepSource
from tpudiag.model.report import ProgramTime


def program_times(hosts: Iterable[HostTrace], sources: Iterable[StepSource]) -> tuple[ProgramTime, ...]:
    """Every program's executions over every host, by device time (descending, then id)."""
    frames = [h.modules.assign(host=h.host) for h in hosts if not h.modules.empty]
    if not frames:
        return ()
    mods = pd.concat(frames, ignore_index=True)
    mods = mods[~mods["device"].astype(str).str.contains("SparseCore", regex=False)]
    if mods.empty:
        return ()
    mods = mods.assign(module=mods["module"].astype(str), host=mods["host"].astype(str))
    steps = {(s.program_id, s.module) for s in sources if s.kind is StepKind.XLA_MODULES}
    per_core = mods.groupby(["program_id", "module", "host", "core"], observed=True).size()
    total = int(mods["dur_ps"].sum())
    rows = []
    for (pid, module), g in mods.groupby(["program_id", "module"], observed=True, sort=False):
        counts = per_core.loc[(pid, module)]
        time = int(g["dur_ps"].sum())
        rows.append(ProgramTime(module=module, program_id=int(pid), executions=int(counts.max()),
                                cores=int(len(g[["host", "core"]].drop_duplicates())), time_ps=time,
                                mean_ps=float(g["dur_ps"].mean()), share=time / total if total else 0.0,
                                step=(int(pid), module) in steps))
    return tuple(sorted(rows, key=lambda r: (-r.time_ps, r.program_id, r.module)))
