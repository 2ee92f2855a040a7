"""Run the selected rules over an analysis: findings ranked by estimated saving, and the skips.

A rule runs only when every input it declares is present; otherwise it is skipped with the
reason (`INPUTS`), never an error. Savings are per-rule upper bounds that overlap: the engine
ranks findings by them but never adds them up.

The engine, not the rules, builds the inputs that come from parsers: the layout parser's
`parse_shape` for padding, and the HLO programs a capture embeds (parsed only when a selected rule
uses them). Rule modules read what the context gives them and import no parser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model.findings import Finding
from tpudiag.model.report import RuleSkip
from tpudiag.rules.base import INPUTS, TABLES, Rule, RuleContext
from tpudiag.rules.config import RulesConfig


def _has_tpu_trace(analysis: Analysis) -> bool:
    return any(h.device.platform == "TPU" and not h.events.empty for h in analysis.profile.hosts)


def default_layout_provider():
    """The layout parser's `parse_shape` (logical and padded bytes of a TPU shape text)."""
    from tpudiag.parsers.layout import parse_shape

    return parse_shape


def compiled_programs(value: Any) -> tuple[Any, ...]:
    """CompiledPrograms from a CompiledDump, a CompiledProgram, or a sequence of either."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(p for v in value for p in compiled_programs(v))
    programs = getattr(value, "programs", None)
    if programs is not None:
        return tuple(programs)
    return (value,)


def _capture_programs(analysis: Analysis) -> tuple[Any, ...]:
    """Programs from the HloProtos a capture embeds; damaged ones are left out (the trace still counts)."""
    from tpudiag.parsers.hlo_proto import host_programs

    return tuple(p for host in analysis.profile.hosts for p in host_programs(host).values())


def available_inputs(analysis: Analysis, extra_inputs: Mapping[str, Any] | None,
                     wanted: set[str] | None = None) -> dict[str, Any]:
    """The inputs present for this run, keyed by `INPUTS` names (absent ones are left out).

    `wanted` limits the work done for inputs that cost time to build (the capture's HLO protos).
    """
    extra = dict(extra_inputs or {})
    wanted = set(INPUTS) if wanted is None else wanted
    out: dict[str, Any] = {}
    if _has_tpu_trace(analysis):
        out["trace"] = analysis
        if analysis.profile.hosts[0].device.peak_flops_per_s and (analysis.ops["flops"] > 0).any():
            out["flops"] = analysis
    layouts = extra.get("layouts")
    if layouts is None and "trace" in out and "layouts" in wanted:
        layouts = default_layout_provider()
    if layouts is not None and "trace" in out and analysis.ops["shape_with_layout"].str.contains(
            ":T(", regex=False).fillna(False).any():
        out["layouts"] = layouts
    if extra.get("llo") is not None:
        out["llo"] = extra["llo"]
    programs = compiled_programs(extra.get("hlo"))
    if not programs and "hlo" in wanted and "trace" in out:
        programs = _capture_programs(analysis)
    if programs:
        out["hlo"] = programs
    for key, value in extra.items():
        if key not in out and key not in ("layouts", "llo", "hlo") and value is not None:
            out[key] = value
    return out


def run_rules(analysis: Analysis, config: RulesConfig | None = None,
              extra_inputs: Mapping[str, Any] | None = None) -> tuple[list[Finding], list[RuleSkip]]:
    """(findings sorted by saving, largest first; rules skipped with their reasons)."""
    config = config or RulesConfig()
    selected = config.resolve()
    wanted = {i for rule, _ in selected for i in (*rule.inputs, *rule.uses)}
    inputs = available_inputs(analysis, extra_inputs, wanted)
    ctx = RuleContext(analysis=analysis, extra=inputs)
    findings: list[Finding] = []
    skipped: list[RuleSkip] = []
    for rule, options in selected:
        missing = [i for i in rule.inputs if i not in inputs]
        if missing:
            skipped.append(RuleSkip(rule.name, INPUTS.get(missing[0], f"needs {missing[0]}")))
            continue
        for table in rule.tables:
            TABLES[table](analysis)
        findings.extend(rule.check(ctx, options))
    if analysis.profile.modelled:
        # Times in a modelled capture (`tpudiag simulate`) are estimates: nothing in it is measured.
        findings = [dataclasses.replace(f, saving=dataclasses.replace(
            f.saving, basis="modelled", explanation=f"from a modelled capture, {f.saving.explanation}"))
            if f.saving.basis == "measured" else f for f in findings]
    findings.sort(key=lambda f: (-f.saving.ps, -int(f.severity), f.code, f.message))
    return findings, skipped


def selected_rules(config: RulesConfig | None = None) -> list[Rule]:
    return [rule for rule, _ in (config or RulesConfig()).resolve()]
