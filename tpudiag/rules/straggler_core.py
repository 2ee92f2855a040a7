"""A core whose own work per step exceeds its peers' beyond the noise band.

What it does
------------
Compares each core's work per step (its busy time less its time in collectives, where the other
cores wait for it) with the median of every other core, on every host, and with the median of the
other cores on its own host. A core is a straggler when it exceeds both by more than the noise
band: the larger of `min_lag_fraction` of the median and `noise_sigmas` standard deviations of
the cores' per-step work. Names the ops that account for the extra time: each op's self time per
step on that core against the median over the other cores.

Why it matters
--------------
A synchronous program runs at the pace of its slowest core: the others finish their own ops and
wait for it in the next collective. One chip 5 % slower (throttled, degraded, a different clock)
makes every step about 5 % longer, and nothing in the step's breakdown says so, because the wait
shows up on the fast cores as collective time.

Evidence
--------
Per core: its work per step and its lag behind the median of the others. Per op on the slow core:
its time per step there and the other cores' median, the ratio and the extra time.

How to fix
----------
Check the slow chip: its health, clocks and thermal throttling (`tpu-info`; on a GPU `nvidia-smi` or
`amd-smi`), and move the job off a degraded chip. The same op slower on one chip of the same program
is rarely the program's fault. When the extra time is in ops only that core runs (a runtime's copy
kernels on the first GPU, say), it is more work, not a slower chip: spread it or move it out of the step.

Bad: `TPU:3` takes 1.08 ms longer per step than `TPU:0`-`TPU:2`, in every `fusion.*` op.
Good: every core's work per step is within noise of the others'.

Savings estimate
----------------
Measured: the core's work per step minus the median of the other cores'; bringing it to their pace
shortens each step by up to that much (the others stop waiting for it).

Known limits
------------
Without steps the whole capture is one step: each core's work is the self time of its ops that
are not collectives. A capture with no collective at all has nothing that makes one core wait for
another: the finding then saves nothing, and says so. A core alone on its host, or a host whose cores are all slow, is a host's lag: that is
straggler-host's finding, and this rule stays quiet about it (straggler-host in turn leaves a host
slow because of one of its cores to this rule). Ops are matched by name, which assumes every core
runs the same program.

Options
-------
- `min_lag_fraction` (0.03): a straggler works more than the others' median by at least this share.
- `noise_sigmas` (3.0): and by more than this many standard deviations of the cores' per-step work.
- `max_ops_shown` (5): cause ops listed, largest extra time first.
- `high_share` (0.15): lag, as a fraction of the step, from which a finding is high severity.
- `medium_share` (0.03): lag fraction from which a finding is medium severity.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tpudiag.analysis.core_balance import CoreWork, OpExtra, capture_core_work, core_work, op_extras, slow_cores
from tpudiag.model import schemas
from tpudiag.model.findings import Basis, Evidence, Finding, Quantity, Saving, Severity
from tpudiag.model.profile import DeviceInfo
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import LagBand, Rule, RuleContext, RuleInput, SeverityScale, Table, health_tool, step_basis

CODE = "TPD111"
NAME = "straggler-core"


@dataclass(frozen=True)
class Options(LagBand):
    max_ops_shown: int = 5
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        super().__post_init__()
        if self.max_ops_shown < 1:
            raise ValueError(f"max_ops_shown must be at least 1, got {self.max_ops_shown}")


def core_label(device: str) -> str:
    return device.removeprefix("/device:")


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    op_cores = schemas.OP_CORES.stack([d.op_cores for d in analysis.digests.values()], list(analysis.digests))
    cores = core_work(analysis.steps)
    whole = not cores  # no steps: the whole capture is one step, each core's work its ops' self time
    if whole:
        cores = capture_core_work(op_cores, step_basis(analysis).step_ps)
    found = slow_cores(cores, options.min_lag_fraction, options.noise_sigmas)
    if not found:
        return []
    # Where no collective synchronises the cores, none waits for the slow one: nothing to save.
    synchronised = bool((analysis.ops["family"].astype(str) != "").any())
    per = " over the capture" if whole else " per step"
    of_step = "of the capture's mean span per core" if whole else "of the step"
    per_label = "" if whole else "/step"
    ops = analysis.ops
    categories = dict(zip(ops["name"].astype(str), ops["category"].astype(str)))
    multi_host = len(analysis.profile.hosts) > 1
    scale = SeverityScale(options.high_share, options.medium_share)
    out = []
    for slow in found:
        c = slow.core
        name = core_label(c.device)
        where = f"`{name}` on `{c.host}`" if multi_host else f"`{name}`"
        lag = slow.lag_ps
        share = lag / c.step_ps if c.step_ps else 0.0
        extras = op_extras(op_cores, cores, c, categories, whole_capture=whole)
        shown = extras[:options.max_ops_shown]
        n_peers = len(cores) - 1
        unit = analysis.platform.core_word + "s"
        peers = f"the other {n_peers} {unit if n_peers != 1 else unit.removesuffix('s')}" + (
            " on every host" if multi_host else "")
        listed = ", ".join(f"`{o.name}` +{fmt_time(o.extra_ps)}" for o in shown)
        if shown and all(o.peers_ps == 0 for o in shown):
            why = f"it runs ops the others do not: {listed}"
        elif shown:
            more = f" and {len(extras) - len(shown)} more" if len(extras) > len(shown) else ""
            why = f"its ops take longer there: {listed}{more}"
        else:
            why = "no op takes longer there: the extra time is spread thin"
        message = (f"{where} works {fmt_time(c.work_ps)}{per}, {fmt_time(lag)} ({fmt_pct(share)} {of_step}) "
                   f"more than {peers} (median {fmt_time(slow.reference_ps)}): {why}"
                   + (f"; no collective in the capture, so no other {unit.removesuffix('s')} waits for it" if not synchronised else ""))
        evidence = [Evidence(core_label(o.device) + (f" ({o.host})" if multi_host else ""), (
            ("work" + per_label, fmt_time(o.work_ps)), ("vs the others' median", _signed(o.work_ps - _others(cores, o))),
            *(() if whole else (("std", fmt_time(o.std_ps)),))))  # one "step": no spread
            for o in sorted(cores, key=lambda o: (-o.work_ps, o.host, o.core))]
        for o in shown:
            ratio = f"{o.core_ps / o.peers_ps:.2f}x" if o.peers_ps > 0 else "only there"
            evidence.append(Evidence(o.name, (("category", o.category), (f"on {name}", fmt_time(o.core_ps)),
                                              ("others (median)", fmt_time(o.peers_ps)), ("ratio", ratio),
                                              ("extra" + per_label, fmt_time(o.extra_ps)))))
        quantities = (Quantity(c.device, "extra work per step (ps)", round(lag)),
                      Quantity(c.device, "work per step (ps)", round(c.work_ps)),
                      Quantity(c.device, "others' median work per step (ps)", round(slow.reference_ps)),
                      *(Quantity(o.name, "extra per step (ps)", round(o.extra_ps)) for o in shown))
        fix = _fix(f"`{name}`{f' on `{c.host}`' if multi_host else ''}", shown, analysis.profile.hosts[0].device, unit,
                   "the timed loop" if whole else "the step")
        beyond = f"`{name}`'s work{per} beyond the other {unit}' median (noise band {fmt_time(slow.band_ps)})"
        saving = (Saving(int(round(lag)), Basis.MEASURED, f"{beyond}; the others wait for it at the next collective")
                  if synchronised else
                  Saving(0, Basis.MEASURED, f"{beyond}; nothing saved: no collective makes the others wait for it"))
        out.append(Finding(rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message,
                           saving=saving, fix=fix, evidence=tuple(evidence), host=c.host,
                           ops=tuple(o.name for o in shown), quantities=quantities))
    return out


def _fix(where: str, shown: list[OpExtra], device: DeviceInfo, unit: str, step: str) -> str:
    if shown and all(o.peers_ps == 0 for o in shown):  # ops only it runs: not a slower device, more work
        return (f"{where} runs work the other {unit} do not ({', '.join(f'`{o.name}`' for o in shown)}): spread "
                f"it over them or move it out of {step}")
    return (f"check {where}: its health, clocks and thermal throttling ({health_tool(device)}); the same ops run "
            f"faster on the other {unit}")


def _others(cores: list[CoreWork], core: CoreWork) -> float:
    others = [o.work_ps for o in cores if o is not core]
    return statistics.median(others) if others else core.work_ps


def _signed(ps: float) -> str:
    return ("+" if ps >= 0 else "-") + fmt_time(abs(ps))


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options, check=check,
            doc=__doc__, tables=(Table.STEPS,))
