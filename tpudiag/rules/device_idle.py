"""Devices idle inside steps (or between module executions, or over a step-less capture), with the host-side cause.

What it does
------------
Measures, per host and step, the time no top-level op runs on a TensorCore (a GPU, or XLA's CPU
threads): inside the step marker for captures with a `Steps` line or step annotations, and from
one execution's start to the next for captures whose steps are module executions (inference), so
the wait for the next dispatch counts. A capture without steps counts as one step per core, from
its first op to its last. A host's
idle per step is its least idle core's (the time every core is idle at once is at most that).
Where the host plane (`/host:CPU`) shows what the host was doing during the gaps, names the cause:
host-bound (Python or dispatch), input-bound (infeed, host-to-device transfers, data loading;
device infeed ops count here too), synchronisation (device-to-host copies, `block_until_ready`,
`device_get`) or compilation inside the loop. Where its step (the period) or its idle (the least
idle core's) is not the header's step time or the breakdown's idle (the mean over cores), the
message says so inline, with the other figure.

Why it matters
--------------
An idle TensorCore does no work at full cost. A decode loop whose device waits 30 % of every
step for the next dispatch is 30 % slower than its kernels, however well they are tuned; no
device-side fix helps.

Evidence
--------
Per host: idle per step and its share of the step, the part between executions, the time
attributed to each cause, device I/O time, and the step with the most idle.

How to fix
----------
Host-bound: keep the Python loop free of per-step host work, fold several steps into one jitted
call (`lax.scan`, `fori_loop`), let JAX's asynchronous dispatch run ahead. Input-bound: prefetch
batches onto the device ahead of use (a prefetching iterator, more loader workers). Synchronisation:
drop per-step `block_until_ready`, `device_get` and `.item()`; fetch metrics every N steps.
Compilation: keep shapes and static arguments fixed (pad to buckets) so the loop stops
recompiling. Unexplained: capture the host too (Python tracer on) to see what it does.

Bad: `for t in range(n): tok = decode(params, tok); print(int(tok[0]))` (a device-to-host sync per step).
Good: `toks = decode_n(params, tok, n)` with the loop inside `lax.fori_loop`.

Savings estimate
----------------
Measured: the idle time per step (the host with the most), an upper bound on what removing the
gaps saves; the causes split it by the host spans that cover each gap. Overlaps with
`step-time-variance` when a few steps hold most of the idle.

Known limits
------------
Host spans and device ops share a clock when the capture says so: both on one clock, or epoch
host lines with `profile_start_time` (docs/time-axis.md); otherwise the host plane is not used and
the cause is reported as not known, with a fix that says why. Causes are read from TraceMe names; a host thread busy in an unrelated span can be
blamed. Idle waiting on another core (collective synchronisation) is not idle here: it shows as
collective time.

Options
-------
- `min_idle_share` (0.02): report when a host's idle is at least this share of its step.
- `max_steps_shown` (3): evidence rows for the steps with the most idle.
- `high_share` (0.15): idle, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): idle fraction from which a finding is medium severity (XProf's overview
  flags TensorCore idle from 3 %).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analysis.idle import CAUSES, HostIdle, host_idle, idle_tables
from tpudiag.analysis.profile_analysis import Analysis, combined_step_times, mean_breakdown
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import Rule, RuleContext, RuleInput, SeverityScale, Table

CODE = "TPD105"
NAME = "device-idle"

FIXES = {
    "host-bound": "keep per-step host work out of the loop: fold steps into one jitted call (`lax.scan`/"
                  "`fori_loop`) and let asynchronous dispatch run ahead",
    "input": "prefetch batches onto the device ahead of use (a prefetching iterator, more loader workers)",
    "synchronisation": "drop per-step `block_until_ready`/`device_get`/`.item()`; fetch metrics every N steps",
    "compilation": "stop recompiling in the loop: fixed shapes and static arguments (pad to buckets)",
    "unexplained": "capture the host plane too (Python tracer on) to see what the host does in the gaps",
    "clock apart": "capture with `jax.profiler`, which records `profile_start_time` (the `Task Environment` "
                   "plane), so that host spans can be matched to the idle gaps",
}
_LABEL = {"host-bound": "host-bound (Python or dispatch)", "input": "input-bound", "synchronisation":
          "synchronisation (device-to-host waits)", "compilation": "compilation in the loop",
          "unexplained": "cause not visible on the host plane",
          "clock apart": "cause not known: the host plane is on another clock than the device planes"}


@dataclass(frozen=True)
class Options:
    min_idle_share: float = 0.02
    max_steps_shown: int = 3
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        if not 0.0 <= self.min_idle_share < 1.0:
            raise ValueError(f"min_idle_share must be in [0, 1), got {self.min_idle_share}")
        if self.max_steps_shown < 0:
            raise ValueError(f"max_steps_shown must be at least 0, got {self.max_steps_shown}")


def main_cause(h: HostIdle) -> str:
    """The cause holding the most idle; device infeed time makes a capture input-bound as well."""
    causes = dict(h.causes_ps)
    causes["input"] = causes.get("input", 0.0) + h.io_ps
    return max(causes, key=lambda c: (causes[c], c != "unexplained"))


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    tables = idle_tables(ctx.analysis.digests)
    hosts = [h for h in host_idle(tables) if h.period_ps > 0]
    flagged = [h for h in hosts if (h.idle_ps + h.io_ps) / h.period_ps >= options.min_idle_share]
    if not flagged:
        return []
    scale = SeverityScale(options.high_share, options.medium_share)
    worst = max(flagged, key=lambda h: (h.idle_ps + h.io_ps, h.host))
    cause = main_cause(worst)
    apart = {h.host for h in ctx.analysis.profile.hosts if h.host_clock_apart}
    shown = "clock apart" if cause == "unexplained" and worst.host in apart else cause
    waited = worst.idle_ps + worst.io_ps
    share = waited / worst.period_ps
    if tables.whole_capture:
        where = f"over the capture: no steps, so each {ctx.analysis.platform.core_word}'s first to last op"
    else:
        where = "between and inside module executions" if tables.executions else "inside steps"
    cause_ps = worst.causes_ps.get(cause, 0.0) + (worst.io_ps if cause == "input" else 0.0)
    of_idle = f" ({fmt_pct(cause_ps / waited)} of it)" if cause != "unexplained" and waited else ""
    if cause == "unexplained" and waited:
        # Most of it has no host span over it, but what does is named: "not visible" alone would
        # contradict the evidence's causes.
        seen = [(c, worst.causes_ps.get(c, 0.0)) for c in CAUSES if worst.causes_ps.get(c, 0.0) >= 0.01 * waited]
        if worst.io_ps >= 0.01 * waited:  # device infeed is part of `waited` and of the evidence
            seen.append(("device infeed/outfeed", worst.io_ps))
        if seen:
            of_idle = (f" for {fmt_pct(cause_ps / waited)} of it; the rest: "
                       + ", ".join(f"{c} {fmt_time(ps)}" for c, ps in seen))
    on = f"`{worst.host}`" if len(hosts) > 1 else f"the {ctx.analysis.platform.cores_word}"
    period = (fmt_time(worst.period_ps) if tables.whole_capture  # the least idle core's own window
              else period_text(ctx.analysis, worst))
    message = (f"{on} idle {fmt_time(waited)} of {period} ({fmt_pct(share)}, "
               f"{where}{basis_note(ctx.analysis, worst)}): {_LABEL[shown]}{of_idle}")
    if not tables.whole_capture and not tables.executions and worst.lead_ps >= 0.5 * worst.idle_ps > 0:
        # Most of it before each step's first op: the host still preparing the step (its input)
        message += (f"; {fmt_time(worst.lead_ps)} of it at the start of each step, before its first op "
                    "(the host preparing the step: data loading?)")
    if len(flagged) > 1:
        message += f"; {len(flagged)} of {len(hosts)} hosts idle at least {fmt_pct(options.min_idle_share)}"
    evidence = []
    for h in sorted(flagged, key=lambda h: (-(h.idle_ps + h.io_ps), h.host)):
        values = [("idle in the capture" if tables.whole_capture else "idle per step", fmt_time(h.idle_ps)),
                  ("share", fmt_pct(h.idle_ps / h.period_ps))]
        if not tables.whole_capture:  # a capture without steps is one window, not "1 step"
            values.append(("steps", str(h.n_steps)))
        if tables.executions:
            values.append(("between executions", fmt_time(h.between_ps)))
        elif not tables.whole_capture and h.lead_ps >= 0.01 * h.idle_ps > 0:  # leftovers are not worth a row
            values.append(("before the step's first op", fmt_time(h.lead_ps)))
        if h.io_ps:
            values.append(("device infeed/outfeed", fmt_time(h.io_ps)))
        for c in (*CAUSES, "unexplained"):
            if h.causes_ps.get(c, 0.0) >= 0.01 * h.idle_ps:  # rounding leftovers are not a cause
                values.append((c, fmt_time(h.causes_ps[c])))
        if not tables.whole_capture:
            values.append(("most idle step", f"{h.worst_step} ({fmt_time(h.worst_idle_ps)})"))
        evidence.append(Evidence(h.host, tuple(values)))
    steps = tables.steps[tables.steps["host"] == worst.host] if not tables.whole_capture else tables.steps.iloc[:0]
    per_step = steps.groupby("step")["idle_ps"].min().sort_values(ascending=False, kind="stable")
    for step, idle in per_step.head(options.max_steps_shown).items():
        period = int(steps.loc[steps["step"] == step, "period_ps"].max())
        if period <= 0:  # a zero-length step marker (damaged trace) has no share to show
            continue
        evidence.append(Evidence(f"step {step}", (("idle", fmt_time(idle)), ("share", fmt_pct(idle / period)))))
    saving = Saving(int(round(waited)), Basis.MEASURED,
                    f"idle {'in the capture' if tables.whole_capture else 'per step'} on `{worst.host}`, the host "
                    "with the most; an upper bound")
    return [Finding(rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message, saving=saving,
                    fix=FIXES[shown], evidence=tuple(evidence), host=worst.host if len(hosts) == 1 else "")]


def period_text(analysis: Analysis, worst: HostIdle) -> str:
    """`each 970.3 µs step`, or for module executions `each 970.3 µs from one `m` start to the next`."""
    source = analysis.step_sources.get(worst.host)
    if source is not None and source.module:
        return f"each {fmt_time(worst.period_ps)} from one `{source.module}` start to the next"
    return f"each {fmt_time(worst.period_ps)} step"


def basis_note(analysis: Analysis, worst: HostIdle) -> str:
    """Where this rule's step or idle is not the header's step time or the breakdown's idle, both, inline.

    The rule's step is the period from one step's start to the next (module executions) or the step
    marker, on `worst`'s host; its idle is that host's least idle core's. The header's step time is
    the slowest core's per step over every host; the breakdown's idle is the mean over cores.
    """
    notes = []
    unit = analysis.platform.core_word
    times, _ = combined_step_times(analysis.steps, len(analysis.profile.hosts))
    step = float(times.mean()) if len(times) else 0.0
    source = analysis.step_sources.get(worst.host)
    executions = source is not None and bool(source.module)
    if executions:
        notes.append(f"the step time, {fmt_time(step)}, is one execution")
    elif step and abs(step - worst.period_ps) > 0.005 * step:
        notes.append(f"the step time, {fmt_time(step)}, is the slowest {unit}'s over every host")
    breakdown = mean_breakdown(analysis.steps)
    idle = worst.idle_ps
    if breakdown is not None and abs(breakdown.idle_ps - idle) > 0.01 * max(idle, breakdown.idle_ps):
        where = f"inside executions, mean over {unit}s" if executions else f"the mean over {unit}s"
        notes.append(f"idle of the least idle {unit}; the breakdown's idle, {fmt_time(breakdown.idle_ps)}, is {where}")
    return "".join(f"; {n}" for n in notes)


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options, check=check,
            doc=__doc__, tables=(Table.STEPS,))
