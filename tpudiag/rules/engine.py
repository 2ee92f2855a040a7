"""Run the selected rules over an analysis: findings ranked by estimated saving, and the skips.

A rule runs only when every input it declares is present; otherwise it is skipped with the
reason (`INPUTS`), never an error. Savings are per-rule upper bounds that overlap: the engine
ranks findings by them but never adds them up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model.findings import Finding
from tpudiag.model.report import RuleSkip
from tpudiag.rules.base import INPUTS, Rule, RuleContext
from tpudiag.rules.config import RulesConfig


def _has_tpu_trace(analysis: Analysis) -> bool:
    return any(h.device.platform == "TPU" and not h.events.empty for h in analysis.profile.hosts)


def default_layout_provider():
    """The layout parser's shape function when `tpudiag.parsers.layout` provides one, else None."""
    try:
        from tpudiag.parsers import layout  # written in parallel; absent in some builds
    except ImportError:
        return None
    for attr in ("parse_shape", "parse_shape_text", "shape_from_text"):
        fn = getattr(layout, attr, None)
        if callable(fn):
            return fn
    return None


def available_inputs(analysis: Analysis, extra_inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inputs present for this run, keyed by `INPUTS` names (absent ones are left out)."""
    extra = dict(extra_inputs or {})
    out: dict[str, Any] = {}
    if _has_tpu_trace(analysis):
        out["trace"] = analysis
    layouts = extra.get("layouts")
    if layouts is None and "trace" in out:
        layouts = default_layout_provider()
    if layouts is not None and "trace" in out and analysis.ops["shape_with_layout"].str.contains(
            ":T(", regex=False).fillna(False).any():
        out["layouts"] = layouts
    if extra.get("llo") is not None:
        out["llo"] = extra["llo"]
    for key, value in extra.items():
        if key not in ("layouts", "llo") and value is not None:
            out[key] = value
    return out


def run_rules(analysis: Analysis, config: RulesConfig | None = None,
              extra_inputs: Mapping[str, Any] | None = None) -> tuple[list[Finding], list[RuleSkip]]:
    """(findings sorted by saving, largest first; rules skipped with their reasons)."""
    config = config or RulesConfig()
    inputs = available_inputs(analysis, extra_inputs)
    ctx = RuleContext(analysis=analysis, extra=inputs)
    findings: list[Finding] = []
    skipped: list[RuleSkip] = []
    for rule, options in config.resolve():
        missing = [i for i in rule.inputs if i not in inputs]
        if missing:
            skipped.append(RuleSkip(rule.name, INPUTS.get(missing[0], f"needs {missing[0]}")))
            continue
        findings.extend(rule.check(ctx, options))
    findings.sort(key=lambda f: (-f.saving.ps, -int(f.severity), f.code, f.message))
    return findings, skipped


def selected_rules(config: RulesConfig | None = None) -> list[Rule]:
    return [rule for rule, _ in (config or RulesConfig()).resolve()]
