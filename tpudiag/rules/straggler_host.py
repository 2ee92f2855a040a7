"""A host whose steps take longer than the other hosts' beyond the noise band.

What it does
------------
Compares each host's mean step time with the median of the other hosts'. A host is a straggler
when it is slower by more than the noise band: the larger of `min_lag_fraction` of the median and
`noise_sigmas` standard deviations of the hosts' own step times. Names the cause on that host:
the ops that take longer there than on the other hosts (ratio and extra time per step), or more
idle or input waits. The other hosts' extra collective time is attributed to the straggler (they
wait for it at the next collective), not reported as their own problem.

Why it matters
--------------
Synchronous training runs at the pace of its slowest host: one host 20 % slower makes every
host 20 % slower. The hosts table shows a spread, but the fix is on one host and usually one op
(a throttled chip, a different compiled program, a noisy neighbour, an input pipeline stall).

Evidence
--------
Per host: mean step time and the lag behind the others. Per op on the straggler: its time per
step there and on the other hosts (median), the ratio and the extra time. Idle and input time
per step against the others, and the collective time the fast hosts spend waiting.

How to fix
----------
An op slower on one host only: compare that host's chips (health, clocks, thermal throttling,
`tpu-info`), check it runs the same compiled program (same XLA flags and libtpu), move the job off
a degraded host. More idle or input waits on one host: its input pipeline or host CPU is slower
(data sharding imbalance, a slower disk, other processes).

Bad: host2's `fusion.3` takes 2.7 ms against 0.71 ms on host0, host1 and host3.
Good: the same op takes the same time on every host.

Savings estimate
----------------
Measured: the straggler's lag behind the median of the other hosts per step; bringing it to their
pace shortens every host's step by up to that much.

Known limits
------------
Needs steps on at least two hosts (a Steps line, or module executions); step numbers need not
match. Ops are matched by name across hosts, which assumes the hosts run the same program. With
two hosts, the "others" are one host and the faster of a pair is taken as the reference. A host
slow because some of its cores are slower than its other cores is left to straggler-core, which
names those cores: one fact, one finding.

Options
-------
- `min_lag_fraction` (0.03): a straggler is slower than the others' median by at least this share.
- `noise_sigmas` (3.0): and by more than this many standard deviations of the hosts' step times.
- `min_op_ratio` (1.2): an op is a cause when it takes at least this many times longer there.
- `max_ops_shown` (3): cause ops listed, largest extra time first.
- `high_share` (0.15): lag, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): lag fraction from which a finding is medium severity.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tpudiag.analysis.core_balance import core_work, slow_cores
from tpudiag.analysis.host_compare import find_straggler, host_stats, op_time_per_step
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.profile import Platform
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import LagBand, Rule, RuleContext, RuleInput, SeverityScale, Table, health_tool

CODE = "TPD107"
NAME = "straggler-host"


@dataclass(frozen=True)
class Options(LagBand):
    min_op_ratio: float = 1.2
    max_ops_shown: int = 3
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        super().__post_init__()
        if self.min_op_ratio < 1.0:
            raise ValueError(f"min_op_ratio must be at least 1, got {self.min_op_ratio}")


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    stats = host_stats(analysis)
    found = find_straggler(stats, options.min_lag_fraction, options.noise_sigmas)
    if found is None:
        return []
    if any(s.core.host == found.host
           for s in slow_cores(core_work(analysis.steps), options.min_lag_fraction, options.noise_sigmas)):
        return []  # some of its cores, not the host: straggler-core names them
    slow = next(s for s in stats if s.host == found.host)
    lag, ref, band = found.lag_ps, found.reference_ps, found.band_ps
    others = [o for o in stats if o.host != slow.host]
    ops = op_time_per_step(analysis)
    mine = ops[ops["host"] == slow.host].set_index("name")
    theirs = ops[ops["host"] != slow.host].groupby("name")["self_ps"].median()
    causes = []
    for name, row in mine.iterrows():
        base = float(theirs.get(name, 0.0))
        extra = row["self_ps"] - base
        if base > 0 and row["self_ps"] >= options.min_op_ratio * base and extra > 0:
            causes.append((extra, str(name), row["self_ps"], base, row["category"]))
    causes.sort(key=lambda c: (-c[0], c[1]))
    idle_extra = slow.idle_ps - statistics.median(o.idle_ps for o in others)
    io_extra = slow.io_ps - statistics.median(o.io_ps for o in others)
    waiting = found.others_wait_ps
    parts = []
    if causes:
        extra, name, t, base, _ = causes[0]
        parts.append(f"`{name}` takes {t / base:.1f}x longer there ({fmt_time(t)} vs {fmt_time(base)}, "
                     f"+{fmt_time(extra)} per step)")
    if idle_extra > max(0.1 * lag, 0):
        parts.append(f"+{fmt_time(idle_extra)} idle per step")
    if io_extra > max(0.1 * lag, 0):
        parts.append(f"+{fmt_time(io_extra)} infeed/outfeed per step")
    why = "; ".join(parts) or "no op, idle or input difference explains it"
    share = lag / ref if ref else 0.0
    message = (f"`{slow.host}` steps take {fmt_time(slow.step_ps)}, {fmt_pct(share)} longer than the other "
               f"{len(others)} hosts ({fmt_time(ref)}): {why}")
    evidence = [Evidence(s.host, (("step time", fmt_time(s.step_ps)), ("std", fmt_time(s.std_ps)),
                                  ("idle/step", fmt_time(s.idle_ps)), ("collectives/step", fmt_time(s.collective_ps))))
                for s in sorted(stats, key=lambda s: (-s.step_ps, s.host))]
    for extra, name, t, base, category in causes[:options.max_ops_shown]:
        evidence.append(Evidence(name, (("category", category), (f"on {slow.host}", fmt_time(t)),
                                        ("others (median)", fmt_time(base)), ("ratio", f"{t / base:.2f}x"),
                                        ("extra/step", fmt_time(extra)))))
    if waiting > 0:
        evidence.append(Evidence("fast hosts", (
            ("waiting in collectives/step", fmt_time(waiting)),
            ("attributed to", f"{slow.host} (not their own problem)"))))
    if causes:
        device = analysis.profile.hosts[0].device
        units = "GPUs" if device.platform is Platform.GPU else "chips"
        fix = (f"find why `{causes[0][1]}` is slower on `{slow.host}`: check that host's {units} (health, clocks, "
               f"throttling: {health_tool(device)}) and that it runs the same compiled program")
    elif idle_extra > 0 or io_extra > 0:
        fix = f"look at `{slow.host}`'s input pipeline and host load: it feeds its devices late"
    else:
        fix = f"compare `{slow.host}` with the others in the trace viewer: the lag is spread over many ops"
    scale = SeverityScale(options.high_share, options.medium_share)
    saving = Saving(int(round(lag)), Basis.MEASURED,
                    f"`{slow.host}`'s lag behind the other hosts' median step time (noise band {fmt_time(band)})")
    return [Finding(rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message, saving=saving,
                    fix=fix, evidence=tuple(evidence), host=slow.host,
                    ops=tuple(c[1] for c in causes[:options.max_ops_shown]))]


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options, check=check,
            doc=__doc__, tables=(Table.STEPS, Table.OP_STEP_WORST))
