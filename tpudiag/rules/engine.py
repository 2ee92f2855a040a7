"""Run the selected rules over an analysis: findings ranked by estimated saving, and the skips.

A rule runs only when every input it declares is present; otherwise it is skipped with the
reason (`INPUTS`), never an error. Savings are per-rule upper bounds that overlap: the engine
ranks findings by them but never adds them up.

The engine, not the rules, builds the inputs derived from what the inputs stage read: the layout
parser's `parse_shape` for padding and (when the caller gave none) the compiled programs' device
memory, each built only when a selected rule uses them. Rule modules read what the context
gives them and import no parser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tpudiag.analysis.join import JoinResult
from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model.findings import Basis, Finding, rank_key
from tpudiag.model.compiled import Shape
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.memory import ProgramMemory
from tpudiag.model.profile import Platform
from tpudiag.model.report import RuleSkip
from tpudiag.rules.base import INPUTS, TABLES, RuleContext, RuleInput, whole_capture
from tpudiag.rules.config import RulesConfig
from tpudiag.rules.finishing import group_repeats, locate

STATIC_BASIS = Basis.COMPILER_ESTIMATE


def _has_device_trace(analysis: Analysis | None) -> bool:
    """Whether some host timed device ops: a TPU's, a GPU's kernels, or XLA's CPU ops."""
    return analysis is not None and any(analysis.digests[h.host].n_events for h in analysis.profile.hosts)


def default_layout_provider() -> Callable[[str], Shape]:
    """The layout parser's `parse_shape` (logical and padded bytes of a TPU shape text)."""
    from tpudiag.parsers.layout import parse_shape

    return parse_shape


def available_inputs(ctx: RuleContext) -> set[RuleInput]:
    """The rule inputs present in `ctx`."""
    analysis = ctx.analysis
    out: set[RuleInput] = set()
    if _has_device_trace(analysis):
        out.add(RuleInput.TRACE)
        if analysis.profile.hosts[0].device.peak_flops_per_s and (analysis.ops["flops"] > 0).any():
            out.add(RuleInput.FLOPS)
        if ctx.layouts is not None and analysis.ops["shape_with_layout"].str.contains(
                ":T(", regex=False).fillna(False).any():
            out.add(RuleInput.LAYOUTS)
    if ctx.compiled.llo:
        out.add(RuleInput.LLO)
    if ctx.compiled.programs:
        out.add(RuleInput.HLO)
    return out


# Static mode (dumps alone) has no `--dumps` and models its timeline: its reasons say what it lacks.
STATIC_REASONS = {
    RuleInput.TRACE: "needs a timeline, modelled from the dumps only when the TPU generation is known "
             "(keep `*.target_arguments.txt` with the dump, or pass --chip)",
    RuleInput.HLO: "needs a timeline, modelled from the compiled HLO: pass the XLA dump (`--xla_dump_to`) "
           "of the same compile too",
    RuleInput.LLO: "needs LLO dumps (`--xla_jf_dump_to`) of the same compile, in the same directory",
}


def _skip_reason(missing: RuleInput, ctx: RuleContext) -> str:
    if ctx.static and missing is RuleInput.LLO:
        return STATIC_REASONS[RuleInput.LLO]
    if ctx.static and missing is RuleInput.HLO:  # a rule that reads the HLO itself (its buffers), not a timeline
        return "needs the compiled HLO: pass the XLA dump (`--xla_dump_to`) of the same compile too"
    if ctx.static and ctx.analysis is None and missing in (RuleInput.TRACE, RuleInput.FLOPS, RuleInput.LAYOUTS):
        return STATIC_REASONS[RuleInput.TRACE if ctx.compiled.programs else RuleInput.HLO]
    if missing is RuleInput.FLOPS and _has_device_trace(ctx.analysis):
        return _flops_reason(ctx.analysis)
    return INPUTS[missing]


def _flops_reason(analysis: Analysis) -> str:
    """Which half of the FLOPS input a trace lacks: a V100 capture has its peak (from the hardware
    table) but no op with FLOPs, so "a peak FLOP/s in the trace" would name the wrong one."""
    has_peak = bool(analysis.profile.hosts[0].device.peak_flops_per_s)
    has_flops = bool((analysis.ops["flops"] > 0).any())
    if has_peak and not has_flops:
        return "needs per-op FLOPs: no op in the trace records any"
    if has_flops and not has_peak:
        return "needs the device's peak FLOP/s: neither the trace nor the hardware table gives one"
    return INPUTS[RuleInput.FLOPS]


def run_rules(analysis: Analysis | None, config: RulesConfig | None, compiled: CompiledInputs, *,
              join: JoinResult | None = None, layouts: Callable[[str], Shape] | None = None, static: bool = False,
              memory: tuple[ProgramMemory, ...] | None = None) -> tuple[list[Finding], list[RuleSkip]]:
    """(findings sorted by saving, largest first; rules skipped with their reasons).

    `compiled` is what the inputs stage read (`tpudiag.inputs`): the dumps, the HLO the capture
    embeds, and the chip (`compiled.chip`, decided there once); the engine parses nothing and
    decides no chip. `static` marks times as the compiler's estimate (dumps alone): every
    saving but one in bytes (modelled from the buffers) is then labelled `compiler estimate`.
    `memory` is `RuleContext.memory` when the caller has built it (`tpudiag.diagnose` does, for the
    report too); None builds it here.
    """
    config = config or RulesConfig()
    selected = config.resolve()
    wanted = {i for rule, _ in selected for i in (*rule.inputs, *rule.uses)}
    if layouts is None and RuleInput.LAYOUTS in wanted:
        layouts = default_layout_provider()
    if memory is None:
        memory = ()
        if RuleInput.HLO in wanted:
            from tpudiag.analysis.device_memory import program_memories

            memory = program_memories(compiled, compiled.oom_errors)
    ctx = RuleContext(analysis=analysis, compiled=compiled, join=join if join is not None else
                      (analysis.join if analysis is not None else None), layouts=layouts,
                      chip=compiled.chip, static=static,
                      memory=memory)
    inputs = available_inputs(ctx)
    findings: list[Finding] = []
    skipped: list[RuleSkip] = []
    platform = analysis.platform if analysis is not None and not static else None
    off_tpu = platform is not None and platform is not Platform.TPU
    for rule, options in selected:
        if off_tpu and rule.tpu_only:
            skipped.append(RuleSkip(rule.name, f"about TPU hardware (tiled layouts, LLO dumps, VMEM): not on a "
                                               f"{platform} capture"))
            continue
        missing = [i for i in rule.inputs if i not in inputs]
        if missing:
            skipped.append(RuleSkip(rule.name, _skip_reason(missing[0], ctx)))
            continue
        if analysis is not None:
            for table in rule.tables:
                TABLES[table](analysis)
        findings.extend(rule.check(ctx, options))
    if static:
        # Dumps alone: every time is the compiler's own estimate (cycles at the clock, else the
        # FLOPs/bytes roofline) laid out on a modelled timeline; nothing is measured. A saving in
        # bytes (memory findings) is modelled from the buffer assignment, not from that timeline:
        # its basis and explanation are kept. Only a time saving's explanation names the timeline.
        findings = [dataclasses.replace(f, saving=dataclasses.replace(
            f.saving, basis=STATIC_BASIS, explanation=f"on the timeline modelled from it, {f.saving.explanation}"
            if f.saving.ps > 0 else f.saving.explanation))
            if not f.saving.bytes and f.saving.basis != STATIC_BASIS else f for f in findings]
    elif analysis is not None and analysis.profile.modelled:
        # Times in a modelled capture (`tpudiag simulate`) are estimates: nothing in it is measured.
        findings = [dataclasses.replace(f, saving=dataclasses.replace(
            f.saving, basis=Basis.MODELLED, explanation=f"from a modelled capture, {f.saving.explanation}"))
            if f.saving.basis is Basis.MEASURED else f for f in findings]
    grouped = group_repeats(findings, analysis, compiled.programs, {rule.name: (rule, o) for rule, o in selected})
    findings = locate(grouped, analysis, compiled.programs)
    if analysis is not None and whole_capture(analysis):
        # No steps: every rule's "per step" is the whole capture (`step_basis`), and says so, in the
        # saving's explanation too ("self time per step x ..." beside "over the capture" was false).
        findings = [dataclasses.replace(f, saving=dataclasses.replace(
            f.saving, per="capture", explanation=f.saving.explanation.replace("per step", "over the capture")))
            if f.saving.ps > 0 else f for f in findings]
    findings.sort(key=rank_key)  # the one ranking: the report and every renderer keep this order
    return findings, skipped
