"""Load a capture for the TUI: parse, analyse, run the rules when this build has them, build the
report. No Textual here: the app calls `load_session` in a worker thread and shows `progress`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpudiag.analysis.profile_analysis import Analysis, analyze, build_report
from tpudiag.model.profile import Profile
from tpudiag.model.report import Report
from tpudiag.parsers.capture import find_capture, load_capture

STAGES = ("reading host files", "analysing steps and ops", "running the rules", "building the report")


@dataclass(frozen=True)
class Session:
    """Everything the views render. `trace_dir` is where the capture lives (never written to)."""

    path: Path
    trace_dir: Path
    profile: Profile
    analysis: Analysis
    report: Report


def trace_dir_of(path: Path) -> Path:
    path = Path(path).resolve()
    return path.parent if path.is_file() else path


def load_session(path: Path, progress: Callable[[int, str], None] | None = None) -> Session:
    """Parse and analyse the capture at `path`; `progress(stage_index, text)` reports each stage."""
    def report_stage(i: int, detail: str = "") -> None:
        if progress:
            progress(i, detail or STAGES[i])

    find_capture(Path(path))  # fail fast with the precise input error
    report_stage(0)
    profile = load_capture(Path(path), progress=lambda text: report_stage(0, text))
    report_stage(1)
    analysis = analyze(profile)
    report_stage(2)
    findings, skipped, rules_run = _run_rules(analysis)
    report_stage(3)
    report = build_report(analysis, findings=tuple(findings), rules_run=rules_run, rules_skipped=tuple(skipped))
    return Session(path=Path(path), trace_dir=trace_dir_of(Path(path)), profile=profile, analysis=analysis,
                   report=report)


def _run_rules(analysis: Analysis):
    try:
        from tpudiag.rules.engine import run_rules  # the rule engine is optional in this build
    except ImportError:
        return [], [], False
    findings, skipped = run_rules(analysis)
    return findings, skipped, True


def rule_explanation(rule: str) -> str:
    """The rule's own "Why it matters" and "How to fix" text, or "" when the registry is absent."""
    try:
        from tpudiag.rules.base import doc_sections
        from tpudiag.rules.registry import get_rule
    except ImportError:
        return ""
    found = get_rule(rule)
    if found is None:
        return ""
    sections = doc_sections(found.doc)
    parts = [" ".join(sections[t].split()) for t in ("What it does", "Why it matters") if sections.get(t)]
    return "\n\n".join(parts)
