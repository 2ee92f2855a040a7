"""Steps much slower than the median, whether they recur every Nth step, and what differs in them.

What it does
------------
Takes each step's time (the slowest host's, the slowest core's) and flags the steps longer than
`outlier_factor` x the median, or a spread whose coefficient of variation (standard deviation /
mean) exceeds `max_cv` (then the slowest tenth of the steps, those above the median, stand for
it). When three or more outliers fall at a fixed interval it names the period
(every Nth step: checkpointing, evaluation, logging). It then compares the outlier steps with the
others: ops that take longer or appear only there, and the idle and collective time per step.

Why it matters
--------------
A mean step time hides a periodic stall: a checkpoint every 100 steps that takes 5 s costs 50 ms
a step on average and shows up nowhere in the per-op tables. The fix depends on what the slow
steps do differently.

Evidence
--------
The median step, the outlier steps with their times, the period when there is one, and per
difference (op, idle, collectives) its time per outlier step against the other steps.

How to fix
----------
An op only in the slow steps (a copy or outfeed for a checkpoint, an evaluation program): make it
asynchronous (`orbax` async checkpointing, evaluation on separate hardware) or less frequent.
Compilation in the slow steps (the host compiling while the device waits: a jit's first call, a
new shape or static argument): leave warm-up out of the measured steps and keep shapes fixed.
More idle in the slow steps: the host does periodic work (logging, metrics `device_get`,
data-loader refills) while the device waits; move it off the step's critical path. Collectives
longer in the slow steps: look for network contention or a straggling host then.

Bad: every 5th step writes a checkpoint synchronously: 18 ms instead of 10 ms.
Good: asynchronous checkpointing: every step 10 ms.

Savings estimate
----------------
Measured: the outlier steps' excess over the median of the other steps, averaged over all steps (time
per step on average). Overlaps with device-idle when the outliers are idle time.

Known limits
------------
Needs at least `min_steps` steps. A capture too short to hold two periods cannot show a period.
Step times are the slowest host's per step, so a host that straggles in one step only shows here,
not as straggler-host.

Options
-------
- `outlier_factor` (1.5): a step is an outlier when it takes at least this many times the median.
- `max_cv` (0.1): flag the spread when the coefficient of variation is above this, outliers or not.
- `min_steps` (5): judge captures with at least this many steps.
- `max_differences` (3): ops listed as differences, largest first.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.idle import cause_column, idle_tables
from tpudiag.analysis.profile_analysis import per_step_times
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.units import fmt_time
from tpudiag.rules.base import Rule, RuleContext, RuleInput, SeverityScale, Table

CODE = "TPD108"
NAME = "step-time-variance"


@dataclass(frozen=True)
class Options:
    outlier_factor: float = 1.5
    max_cv: float = 0.1
    min_steps: int = 5
    max_differences: int = 3
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        if self.outlier_factor <= 1.0:
            raise ValueError(f"outlier_factor must be above 1, got {self.outlier_factor}")
        if self.max_cv <= 0:
            raise ValueError(f"max_cv must be above 0, got {self.max_cv}")
        if self.min_steps < 2:
            raise ValueError(f"min_steps must be at least 2, got {self.min_steps}")


def period(steps: list[int]) -> int | None:
    """The interval N when three or more steps fall exactly every N steps, else None."""
    if len(steps) < 3:
        return None
    gaps = np.diff(sorted(steps))
    return int(gaps[0]) if gaps[0] > 1 and (gaps == gaps[0]).all() else None


def _op_time_by_step(analysis) -> pd.DataFrame:
    """(step, name) -> self time in that step on the core and host where it is largest."""
    table = analysis.per_step.op_step_worst  # per step and op: the worst core of any host
    inside = table[table["step"] >= 0]
    if inside.empty:
        return pd.DataFrame(columns=["step", "name", "self_ps"])
    return inside[["step", "name", "self_ps"]].reset_index(drop=True)


def _compile_excess(analysis, out_steps: list[int]) -> float:
    """Mean device idle per outlier step that the host spent compiling, less the other steps' (the
    worst core per step; `analysis.idle`'s causes from the host plane; 0 without one)."""
    per_step = idle_tables(analysis.digests).steps
    if per_step.empty:
        return 0.0
    comp = per_step.groupby("step")[cause_column("compilation")].max()
    inside = comp.index.isin(out_steps)
    out = float(comp[inside].mean()) if inside.any() else 0.0
    norm = float(comp[~inside].mean()) if (~inside).any() else 0.0
    return max(out - norm, 0.0)


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    per_host = per_step_times(analysis.steps)
    if per_host.empty:
        return []
    times = per_host.groupby("step")["dur_ps"].max().sort_index()
    if len(times) < options.min_steps:
        return []
    median = float(times.median())
    cv = float(times.std(ddof=0) / times.mean()) if times.mean() else 0.0
    outliers = times[times >= options.outlier_factor * median]
    if outliers.empty and cv <= options.max_cv:
        return []
    if outliers.empty:  # a wide spread without one dominant step: the slowest tenth stands for it
        # Above the median only: where most steps take the same time, the 90th percentile is that time,
        # and every step would count as an outlier.
        outliers = times[(times >= times.quantile(0.9)) & (times > median)]
        if outliers.empty:  # no step slower than the median: the spread is in faster steps
            return []
    out_steps = [int(s) for s in outliers.index]
    normal = times.drop(outliers.index)
    base = float(normal.median()) if len(normal) else median
    excess_per_step = float((outliers - base).clip(lower=0).sum()) / len(times)
    every = period(out_steps)
    # What differs: ops, idle and collectives per outlier step against the other steps.
    ops = _op_time_by_step(analysis)
    in_out = ops["step"].isin(out_steps)
    n_out, n_norm = len(out_steps), max(1, len(times) - len(out_steps))
    out_mean = ops[in_out].groupby("name", observed=True)["self_ps"].sum() / n_out
    norm_mean = ops[~in_out].groupby("name", observed=True)["self_ps"].sum() / n_norm
    diff = (out_mean.subtract(norm_mean, fill_value=0.0)).sort_values(ascending=False)
    diff = diff[diff > 0.05 * (float(outliers.mean()) - base)]
    steps_tab = analysis.steps.groupby("step")[["idle_ps", "collective_ps"]].max()
    idle_out = float(steps_tab.loc[steps_tab.index.isin(out_steps), "idle_ps"].mean())
    idle_norm = float(steps_tab.loc[~steps_tab.index.isin(out_steps), "idle_ps"].mean()) if n_norm else 0.0
    coll_out = float(steps_tab.loc[steps_tab.index.isin(out_steps), "collective_ps"].mean())
    coll_norm = float(steps_tab.loc[~steps_tab.index.isin(out_steps), "collective_ps"].mean()) if n_norm else 0.0
    what = []
    for name, extra in diff.head(options.max_differences).items():
        only = name not in norm_mean.index or norm_mean.get(name, 0) == 0
        what.append(f"`{name}` {'only there' if only else 'longer'} (+{fmt_time(extra)})")
    gap = float(outliers.mean()) - base
    compiling = _compile_excess(analysis, out_steps)  # a part of the idle
    if idle_out - idle_norm > 0.05 * gap:
        what.append(f"+{fmt_time(idle_out - idle_norm)} idle"
                    + (f" ({fmt_time(compiling)} of it compiling)" if compiling > 0.05 * gap else ""))
    if coll_out - coll_norm > 0.05 * gap:
        what.append(f"+{fmt_time(coll_out - coll_norm)} in collectives")
    listed = ", ".join(map(str, out_steps[:6])) + (", …" if len(out_steps) > 6 else "")
    pattern = f"every {every} steps" if every else f"steps {listed}"
    message = (f"{len(out_steps)} of {len(times)} steps take {fmt_time(float(outliers.mean()))} against a median of "
               f"{fmt_time(median)} ({pattern}; CV {cv:.2f})")
    if what:
        message += ": " + "; ".join(what)
    evidence = [Evidence("steps", (("median", fmt_time(median)), ("CV", f"{cv:.2f}"),
                                   ("outliers", str(len(out_steps))), ("period", f"{every}" if every else "none")))]
    evidence.extend(Evidence(f"step {s}", (("time", fmt_time(float(times[s]))),
                                           ("x median", f"{float(times[s]) / median:.2f}")))
                    for s in out_steps[:3])
    for name, extra in diff.head(options.max_differences).items():
        evidence.append(Evidence(str(name), (("outlier steps", fmt_time(float(out_mean.get(name, 0.0)))),
                                             ("other steps", fmt_time(float(norm_mean.get(name, 0.0)))),
                                             ("extra", fmt_time(float(extra))))))
    if compiling > 0.5 * gap:  # the slow steps compile: no periodic work to move
        fix = ("the slow steps compile (a jit's first call, or a new shape or static argument): leave warm-up "
               "out of the measured steps (`tpudiag run --steps N..M` past it) and keep shapes fixed so no later "
               "step recompiles")
    elif any("only there" in w for w in what):
        fix = "the slow steps run extra work: make it asynchronous (async checkpointing, eval elsewhere) or rarer"
    elif idle_out - idle_norm > 0.05 * gap:
        fix = "the device waits in the slow steps: move periodic host work (logging, metrics, refills) off the step"
    else:
        fix = "compare a slow step with a normal one in the trace viewer; look for contention at those steps"
    share = excess_per_step / float(times.mean()) if times.mean() else 0.0
    scale = SeverityScale(options.high_share, options.medium_share)
    saving = Saving(int(round(excess_per_step)), Basis.MEASURED,
                    "the outlier steps' excess over the other steps' median, averaged over all steps")
    return [Finding(rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message, saving=saving,
                    fix=fix, evidence=tuple(evidence),
                    ops=tuple(str(n) for n in diff.head(options.max_differences).index))]


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options, check=check,
            doc=__doc__, tables=(Table.STEPS, Table.OP_STEP_WORST))
