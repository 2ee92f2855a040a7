"""Collective time that no compute on the same core hides.

What it does
------------
Measures, for every async collective window (start to done, from the `Async XLA Ops` line or
from start/done pairs) and every synchronous collective, the time not covered by compute ops on
the same core, and reports it per collective family, per op and per step. Each window is
classified with XProf's thresholds: hidden when at least `hidden_threshold` of it is covered,
exposed when at most `exposed_threshold` is, partial otherwise. On a GPU a collective is its
library's kernel (NCCL, RCCL; an XLA `*-start` op's, or one named by its kernel): the kernel's span
is the window, and compute kernels on the GPU's other streams cover it.

Why it matters
--------------
A TensorCore that waits for a collective does no work: every exposed microsecond is added to the
step. On v4, v5p and v6e XLA leaves collectives synchronous by default, so their whole duration
is exposed; async collectives are exposed when the scheduler finds nothing to run between the
start and the done.

Evidence
--------
Per family and per op: hidden/partial/exposed counts, covered fraction and exposed time per
step; per op also the bytes each device sends over ICI (modelled from payload, group and ring
algorithm), its group, the achieved ICI bandwidth and its share of the chip's ICI peak, and
whether it is latency-bound (its bytes would cross at peak in under the fixed latency; on a GPU
only the bytes and the group, no link figures); the two
worst steps. Windows whose names carry a double numeric suffix
(`all-gather-start.1.0`) are counted: XProf's `analyze_async_overlap` does not recognise them as
async ops and reports them as hidden. With the compiled HLO (`--dumps DIR` of an XLA dump, or
the program a capture embeds), each op also says what the schedule does: "adjacent in the
schedule" (nothing between start and done), "N ops scheduled inside", or "synchronous in the
compiled program".

How to fix
----------
Synchronous all-gathers on v6e: compile with `--xla_tpu_enable_async_collective_fusion=true
--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true
--xla_tpu_enable_async_collective_fusion_multiple_steps=true
--xla_tpu_overlap_compute_collective_tc=true` (in `LIBTPU_INIT_ARGS`) so XLA turns them into
async collective fusions that overlap compute; on v4 and v5p the same flags are worth trying
(verified on v6e only). `tpudiag whatif MODULE:FUNCTION --topology v6e:2x2 --xla-flag ...` models
a flag's effect on the step before any TPU time is spent (the finding's fix spells it out). Entry-level all-reduces and reduce-scatters (`all-reduce-scatter`
fusions) stay synchronous even on v5e, where all-gathers are async by default: make them smaller
(bf16 gradients, fewer larger buckets) or reduce less often (accumulate over microbatches). Exposed
async windows with no compute inside: give the scheduler independent work to place between
start and done (start the collective earlier, prefetch the next layer's weights, split it).

On a GPU: XLA runs async collectives on their own stream, and its latency-hiding scheduler
places compute beside them (`XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true`;
`JAX_ENABLE_PGLE=yes` gives it measured costs); one it finds nothing to place beside runs on the
compute stream, exposed. `--xla_gpu_disable_async_collectives` makes them synchronous.

Bad: `all-gather-start.3` immediately followed by `all-gather-done.3`, 1.2 ms per step.
Good: the same all-gather overlapping the previous layer's matmul, 0.05 ms exposed.

Savings estimate
----------------
Measured: per step, the largest exposed time on any core (the step time is the slowest core's),
averaged over steps. An upper bound: hiding a collective can stretch the compute it overlaps
(shared HBM bandwidth), and it overlaps with savings other rules report.

Known limits
------------
Coverage counts compute ops on the same core (a GPU: any of its streams) only (not SparseCore
or DMA engines, nor a GPU's memory copies) and excludes
other collectives, unlike XProf, which counts every non-async op. Deliberately unlike XProf's
`analyze_async_overlap`, a container op (`while`, `call`, `conditional`: any op with ops nested
in it) is not compute: its body is. XProf counts the enclosing `while` as covering every window
inside a loop, so a layer loop (`lax.scan`) hides all its collectives there; synchronous
collectives inside a loop are counted here too. The trace alone does not say
why a collective stayed synchronous: without the compiled HLO the advice follows from the op's
name, category and the device generation. Ops are matched to the HLO by instruction name.
Captures without steps count as one step. On a multi-host capture with a straggling host (as
straggler-host finds it, with its default options), the other hosts' extra collective time is
their wait for that host: it is taken out of this rule's saving and left to straggler-host.

Options
-------
- `hidden_threshold` (0.9): covered fraction at or above which a window is hidden.
- `exposed_threshold` (0.1): covered fraction at or below which a window is exposed.
- `min_exposed_fraction` (0.01): report synchronous collectives, or async windows, only when their
  exposed time per step is at least this fraction of the step time.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
- `max_evidence_rows` (5): ops listed as evidence per finding (families and the two worst steps
  are always listed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from tpudiag.analysis.host_compare import find_straggler, host_stats
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.hardware import chip_for, smallest_topology
from tpudiag.model.hlo_names import library_collective
from tpudiag.model.profile import CollectiveClasses, Platform, WindowThresholds
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_pct, fmt_time
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, StepBasis, Table, per_step_worst_core,
                                per_step_worst_core_by, step_basis)
from tpudiag.rules.straggler_host import Options as StragglerOptions

CODE = "TPD101"
NAME = "exposed-collective"

ASYNC_FLAGS = ("--xla_tpu_enable_async_collective_fusion=true "
               "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
               "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
               "--xla_tpu_overlap_compute_collective_tc=true")
SYNC_BY_DEFAULT = ("v4", "v5p", "v6e")  # generations whose collectives XLA leaves synchronous by default


@dataclass(frozen=True)
class Options:
    hidden_threshold: float = 0.9
    exposed_threshold: float = 0.1
    min_exposed_fraction: float = 0.01
    high_share: float = 0.15
    medium_share: float = 0.03
    max_evidence_rows: int = 5

    def __post_init__(self):
        if not 0.0 <= self.exposed_threshold < self.hidden_threshold <= 1.0:
            raise ValueError("thresholds must satisfy 0 <= exposed_threshold < hidden_threshold <= 1, got "
                             f"exposed_threshold={self.exposed_threshold}, hidden_threshold={self.hidden_threshold}")
        if self.max_evidence_rows < 1:
            raise ValueError(f"max_evidence_rows must be at least 1, got {self.max_evidence_rows}")

    @property
    def thresholds(self) -> WindowThresholds:
        return WindowThresholds(self.hidden_threshold, self.exposed_threshold)


@dataclass(frozen=True)
class ScheduleFacts:
    """What the compiled program says about collectives, by instruction name."""

    between: dict[str, int]  # async start name -> instructions scheduled between start and done
    synchronous: set[str]  # collectives issued synchronously at entry level

    def reason(self, name: str, kind: str) -> str:
        if kind == "async" and name in self.between:
            n = self.between[name]
            return "adjacent in the schedule" if n == 0 else f"{n} op{'s' * (n != 1)} scheduled inside"
        if kind == "sync" and name in self.synchronous:
            return "synchronous in the compiled program"
        return ""


def compiled_programs(ctx: RuleContext) -> tuple:
    """The compiled HLO programs this rule reads (the one place it reaches compiled inputs)."""
    return ctx.compiled.programs


def schedule_facts(programs) -> ScheduleFacts | None:
    """Facts from compiled programs (`CompiledProgram`s); None without any."""
    if not programs:
        return None
    between: dict[str, int] = {}
    sync: set[str] = set()
    for program in programs:
        for pair in program.async_pairs:
            if pair.kind == "collective":
                between[pair.start] = len(pair.scheduled_between)
        for (computation, name), inst in program.instructions.items():
            if (computation == program.entry and inst.collective_family and not inst.async_role
                    and not inst.is_continuation):
                sync.add(name)
    return ScheduleFacts(between, sync)


def _generation(analysis) -> str:
    chip = analysis.profile.hosts[0].device.chip
    return chip.generation if chip else ""


def _library(analysis) -> str:
    """The collective library a GPU's kernels come from: RCCL on AMD, NCCL on NVIDIA."""
    gpu = analysis.profile.hosts[0].device.gpu
    vendor = gpu.vendor if gpu is not None else ""
    return {"AMD": "RCCL", "NVIDIA": "NCCL"}.get(vendor, "NCCL/RCCL")


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def whatif_hint(generation: str) -> str:
    """How to model the async flags without a TPU: the `tpudiag whatif` command (MODULE:FUNCTION: the step)."""
    chip = chip_for(generation)
    topology = smallest_topology(chip) if chip is not None else f"{generation}:2x2x1"
    settings = " ".join(f"--xla-flag {flag.removeprefix('--')}" for flag in ASYNC_FLAGS.split())
    return f"model it without a TPU: `tpudiag whatif MODULE:FUNCTION --topology {topology} {settings}`"


REDUCING = ("all-reduce", "reduce-scatter")  # synchronous at entry level even on v5e (async all-gathers)

# XLA's GPU scheduler moves async collectives so they overlap compute kernels (NVIDIA JAX-Toolbox's
# and JAX's GPU performance tips); an async collective it finds nothing to place beside runs on the
# compute stream (openxla/xla#14397). Profile-guided latency estimation feeds it measured costs.
GPU_SCHEDULER_FLAG = "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"
GPU_PGLE = "JAX_ENABLE_PGLE=yes"
SHRINK = ("shrink them (bf16 gradients, fewer and larger buckets) or reduce less often (accumulate over "
          "microbatches)")


def _gpu_fix(kind: str, families: str, frame: pd.DataFrame) -> str:
    """The fix on a GPU: XLA's GPU scheduler and flags, no TPU flag or generation."""
    if kind == "sync":
        reducing = [f for f in REDUCING if f in set(frame["family"])]
        fix = (f"let XLA run the {families} collectives asynchronously, on a stream of their own beside compute: "
               "compile with "
               f"`{GPU_SCHEDULER_FLAG}` and without `--xla_gpu_disable_async_collectives`")
        return fix + (f"; {' and '.join(f + 's' for f in reducing)}: {SHRINK}" if reducing else "")
    adjacent = int(frame["n_adjacent"].sum())
    if all(library_collective(str(n)) for n in frame["name"].unique()):  # launched outside XLA: no XLA flag helps
        return (f"start the {families} earlier, while compute kernels still run on the other streams (e.g. "
                "reduce gradients in buckets as the backward pass produces them)")
    if adjacent:
        return (f"no compute kernel starts on another stream during {adjacent} of the collective kernels left "
                "exposed: give XLA's scheduler measured costs and room to overlap them "
                f"(`{GPU_SCHEDULER_FLAG}`, `{GPU_PGLE}`), or start the {families} earlier")
    return f"start the {families} earlier or split it so more compute kernels overlap it (`{GPU_SCHEDULER_FLAG}`)"


def _fix(kind: str, families: str, frame: pd.DataFrame, generation: str, platform: Platform = Platform.TPU) -> str:
    if platform is Platform.GPU:
        return _gpu_fix(kind, families, frame)
    if kind == "sync" and platform is not Platform.TPU:
        return f"overlap the {families} with independent compute or make them smaller: {SHRINK}"
    if kind == "sync":
        present = set(frame["family"])
        parts = []
        if "all-gather" in present:
            if generation == "v6e":
                parts.append(f"make the all-gathers asynchronous: compile with `{ASYNC_FLAGS}` (in LIBTPU_INIT_ARGS; "
                             f"verified to turn v6e all-gathers into async collective fusions; {whatif_hint(generation)})")
            elif generation in SYNC_BY_DEFAULT:
                parts.append(f"XLA leaves all-gathers synchronous on {generation} by default: try `{ASYNC_FLAGS}` "
                             f"(verified on v6e only; {whatif_hint(generation)})")
            else:
                parts.append("overlap the all-gathers with independent compute (async collectives or a collective "
                             "matmul)")
        others = sorted(present - {"all-gather", *REDUCING})
        if others:
            parts.append(f"overlap the {' and '.join(f + 's' for f in others)} with independent compute or make them "
                         "smaller")
        reducing = [f for f in REDUCING if f in present]
        if reducing:
            parts.append(f"{' and '.join(f + 's' for f in reducing)} stay synchronous at entry level even on v5e, "
                         f"where all-gathers are async: {SHRINK}")
        return "; ".join(parts)
    adjacent = int(frame["n_adjacent"].sum())
    if adjacent:
        return ("no compute is scheduled between start and done in "
                f"{adjacent} window{'s' * (adjacent != 1)}: start the {families} earlier or give the scheduler "
                "independent work to place inside (e.g. prefetch the next layer's weights)")
    return f"start the {families} earlier or split it so more compute overlaps it"


def _class_counts(frame: pd.DataFrame) -> str:
    return f"{int(frame['n_hidden'].sum())}/{int(frame['n_partial'].sum())}/{int(frame['n_exposed'].sum())}"


def _ici_facts(ops: pd.DataFrame, tpu: bool = True) -> dict[str, tuple[tuple[str, str], ...]]:
    """Per collective op: what it sends over ICI (`analysis.ops`), as evidence values. Off a TPU there
    is no ICI: the modelled bytes per device and the group stay, when the bytes are known."""
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    if ops.empty or "ici_bytes" not in ops.columns:
        return out
    for r in ops[ops["family"].astype(str) != ""].itertuples(index=False):
        name = str(r.name)
        if name in out or not r.occurrences:
            continue
        group = f"{r.group_size}" + (" (assumed)" if r.group_source == "assumed" else "")
        if not tpu:
            if r.ici_bytes > 0:
                out[name] = (("bytes/device", fmt_bytes(r.ici_bytes / r.occurrences)), ("group", group))
            continue
        bw = None if pd.isna(r.ici_bw) else float(r.ici_bw)
        share = None if pd.isna(r.ici_utilization) else float(r.ici_utilization)
        values = [("bytes/device", fmt_bytes(r.ici_bytes / r.occurrences)), ("group", group),
                  ("ICI", f"{fmt_bandwidth(bw)} ({fmt_pct(share)} of ICI peak)")]
        if r.ici_latency_bound:
            values.append(("latency-bound", "yes: its bytes cross in under the fixed latency at peak; fewer, larger "
                                            "collectives help, not bandwidth"))
        out[name] = tuple(values)
    return out


def _evidence(coll: CollectiveClasses, op_steps: pd.DataFrame, basis: StepBasis, options: Options,
              facts: ScheduleFacts | None, ici: dict[str, tuple[tuple[str, str], ...]] | None = None
              ) -> tuple[Evidence, ...]:
    rows = []
    frame = coll.ops
    fam_labels, fam_exposed = per_step_worst_core_by(coll.steps, "exposed_ps", basis, "family")
    fam_exposed = dict(zip(fam_labels.tolist(), fam_exposed.tolist()))
    # By name: stacked hosts' family categories come in the order the hosts first name them.
    for family, g in frame.groupby(frame["family"].astype(str), sort=True):
        rows.append(Evidence(f"family {family}", (
            ("ops", str(g["name"].nunique())),
            ("hidden/partial/exposed", _class_counts(g)),
            ("exposed/step", fmt_time(fam_exposed[family])))))
    # Every op's exposed time per step in one pass; only the ops shown as evidence are sliced out.
    # `op_steps` holds the worst core of any host already: host "" and core 0 stand for it.
    labels, exposed_by_op = per_step_worst_core_by(op_steps.assign(host="", core=0), "exposed_ps", basis, "name")
    per_op = sorted(zip(exposed_by_op.tolist(), (str(n) for n in labels)), key=lambda t: (-t[0], t[1]))
    names = frame["name"].to_numpy()
    for exposed, name in per_op[:options.max_evidence_rows]:
        g = frame[names.astype(str) == name]
        values = [("family", str(g["family"].iloc[0])),
                  ("hidden/partial/exposed", _class_counts(g)),
                  ("covered", fmt_pct(float(g["covered_ps"].sum() / g["span_ps"].sum()))),
                  ("exposed/step", fmt_time(exposed))]
        values.extend((ici or {}).get(name, ()))
        if g["double_suffix"].any():
            values.append(("double suffix", "yes (XProf: hidden)"))
        reason = facts.reason(name, str(g["kind"].iloc[0])) if facts is not None else ""
        if reason:
            values.append(("schedule", reason))
        rows.append(Evidence(name, tuple(values)))
    if not basis.whole_capture:
        inside = coll.steps[coll.steps["step"] >= 0]
        per_step = (inside.groupby(["step", "host", "core"], observed=True)["exposed_ps"].sum()
                    .groupby(level="step").max().sort_values(ascending=False, kind="stable"))
        for step, ps in per_step.head(2).items():
            rows.append(Evidence(f"step {step}", (("exposed (worst core)", fmt_time(float(ps))),)))
    return tuple(rows)


def _of_kind(coll: CollectiveClasses, kind: str) -> CollectiveClasses:
    return replace(coll, steps=coll.steps[coll.steps["kind"] == kind], ops=coll.ops[coll.ops["kind"] == kind])


def straggler_of(analysis):
    """The straggling host, if any, with the collective time the others spend waiting for it."""
    defaults = StragglerOptions()  # the straggler-host rule's default noise band
    return find_straggler(host_stats(analysis), defaults.min_lag_fraction, defaults.noise_sigmas)


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    collectives = analysis.collectives(options.thresholds)
    if collectives.empty:
        return []
    op_steps = analysis.per_step.collective_op_steps
    basis = step_basis(analysis)
    scale = SeverityScale(options.high_share, options.medium_share)
    generation = _generation(analysis)
    platform = analysis.platform
    facts = schedule_facts(compiled_programs(ctx))
    hosts = analysis.profile.hosts
    findings = []
    # Other hosts waiting in collectives for a straggler is the straggler's problem (straggler-host).
    straggler = straggler_of(analysis)
    waiting = straggler.others_wait_ps if straggler is not None else 0.0
    ici = None
    for kind in ("sync", "async"):
        coll = _of_kind(collectives, kind)
        g = coll.ops
        if g.empty:
            continue
        exposed = per_step_worst_core(coll.steps, "exposed_ps", basis)
        wait_here = min(waiting, exposed)
        waiting -= wait_here
        exposed -= wait_here
        share = exposed / basis.step_ps if basis.step_ps else 0.0
        if exposed <= 0 or share < options.min_exposed_fraction:
            continue
        fam_labels, fam_exposed = per_step_worst_core_by(coll.steps, "exposed_ps", basis, "family")
        fams = sorted(zip(fam_exposed.tolist(), (str(f) for f in fam_labels)), key=lambda t: (-t[0], t[1]))
        fams = [(ps, name) for ps, name in fams if ps > 0]
        per = "" if basis.whole_capture else " per step"
        step_text = "the capture" if basis.whole_capture else f"the {fmt_time(basis.step_ps)} step"
        by_family = ", ".join(f"{name} {fmt_time(ps)}" for ps, name in fams)
        families = ", ".join(name for _, name in fams)
        if kind == "sync":
            message = (f"synchronous collectives leave {fmt_time(exposed)}{per} exposed ({fmt_pct(share)} of "
                       f"{step_text}): {by_family}")
            confirmed = sorted(str(n) for n in g["name"].unique() if facts is not None and facts.reason(n, "sync"))
            if confirmed:
                message += (f"; the compiled program issues {_names(confirmed)} synchronously"
                            + (f" (the default on {generation})" if generation in SYNC_BY_DEFAULT else ""))
            elif generation in SYNC_BY_DEFAULT:
                message += f"; XLA leaves collectives synchronous on {generation} by default"
        elif platform is Platform.GPU:  # each window is a library kernel, covered by other streams' kernels
            message = (f"async {_library(analysis)} collective kernels leave {fmt_time(exposed)}{per} exposed "
                       f"({fmt_pct(share)} of {step_text}): {by_family}; {int(g['n'].sum())} kernels: "
                       f"{int(g['n_exposed'].sum())} exposed, {int(g['n_partial'].sum())} partial, "
                       f"{int(g['n_hidden'].sum())} hidden by compute on other streams")
        else:
            message = (f"async collective windows leave {fmt_time(exposed)}{per} exposed ({fmt_pct(share)} of "
                       f"{step_text}): {by_family}; {int(g['n'].sum())} windows: {int(g['n_exposed'].sum())} "
                       f"exposed, {int(g['n_partial'].sum())} partial, {int(g['n_hidden'].sum())} hidden")
            exposed_names = g.loc[g["n_partial"] + g["n_exposed"] > 0, "name"].unique()
            adjacent = sorted(str(n) for n in exposed_names
                              if facts is not None and facts.reason(n, "async") == "adjacent in the schedule")
            if adjacent:
                message += f"; {_names(adjacent)} start and finish with nothing scheduled between"
            doubles = int(g.loc[g["double_suffix"], "n"].sum())
            if doubles:
                message += (f"; {doubles} have double-suffix names that XProf's analyze_async_overlap reports as "
                            "hidden")
        if wait_here > 0:
            message += (f"; {fmt_time(wait_here)} more per step is the other hosts waiting for straggler "
                        f"`{straggler.host}`, left to straggler-host")
        if ici is None:  # the same for both kinds: made once, for the first finding
            ici = _ici_facts(analysis.ops, tpu=platform is Platform.TPU)
        explanation = ("largest exposed collective time on any core per step, averaged over "
                       f"{basis.n_steps} step{'s' * (basis.n_steps != 1)}"
                       + (" (no steps: whole capture)" if basis.whole_capture else ""))
        top_ops = tuple(g.groupby("name", observed=True)["exposed_ps"].sum()
                        .sort_values(ascending=False, kind="stable").head(options.max_evidence_rows).index.astype(str))
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message,
            saving=Saving(int(round(exposed)), Basis.MEASURED, explanation),
            fix=_fix(kind, families, g, generation, platform),
            evidence=_evidence(coll, op_steps[op_steps["kind"] == kind], basis, options, facts, ici),
            host=hosts[0].host if len(hosts) == 1 else "", ops=top_ops))
    return findings


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options,
            check=check, doc=__doc__, uses=(RuleInput.HLO,), tables=(Table.STEPS,))
