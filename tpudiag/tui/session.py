"""Load a capture for the TUI as `tpudiag report` does: parse, analyse, run the rules (when this build
has them) with the configuration found next to the input, join compiled facts (`--dumps` and the
capture's own HLO) to the ops, build the report. No Textual here: the app calls `load_session` in
a worker thread and shows `progress`.
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


def start_process_helpers() -> None:
    """Start multiprocessing's resource tracker now, while stderr is still the terminal.

    Parsing several hosts uses a process pool, whose first use starts the tracker with stderr's
    file descriptor. Inside a running Textual app stderr is a capture object whose `fileno()` is
    -1, and starting the tracker there fails (`ValueError: bad value(s) in fds_to_keep`).
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def trace_dir_of(path: Path) -> Path:
    path = Path(path).resolve()
    return path.parent if path.is_file() else path


def load_session(path: Path, progress: Callable[[int, str], None] | None = None,
                 dumps: tuple[Path, ...] = ()) -> Session:
    """Parse and analyse the capture at `path`; `progress(stage_index, text)` reports each stage."""
    def report_stage(i: int, detail: str = "") -> None:
        if progress:
            progress(i, detail or STAGES[i])

    path = Path(path)
    find_capture(path)  # fail fast with the precise input error
    report_stage(0)
    extra, labels = _dump_inputs(dumps)
    profile = load_capture(path, progress=lambda text: report_stage(0, text))
    report_stage(1)
    analysis = analyze(profile)
    report_stage(2)
    findings, skipped, rules_run = _run_rules(analysis, path, extra)
    report_stage(3)
    report = build_report(analysis, findings=tuple(findings), rules_run=rules_run, rules_skipped=tuple(skipped),
                          dumps=labels, join=_join(analysis, extra))
    return Session(path=path, trace_dir=trace_dir_of(path), profile=profile, analysis=analysis, report=report)


# The pieces below are shared with `tpudiag report` and written in parallel with the TUI; a build
# without one of them still opens the capture, with fewer facts (and says so: rules not run, n/a).

def _dump_inputs(dumps: tuple[Path, ...]):
    if not dumps:
        return {}, ()
    from tpudiag.cli.rules_cmd import load_dump_inputs

    return load_dump_inputs(list(dumps))


def _run_rules(analysis: Analysis, path: Path, extra: dict):
    try:
        from tpudiag.rules import load_config, run_rules  # the rule engine is optional in this build
    except ImportError:
        return [], [], False
    findings, skipped = run_rules(analysis, load_config(path), extra)
    return findings, skipped, True


def _join(analysis: Analysis, extra: dict):
    try:
        from tpudiag.cli.report_dumps import join_for_report
    except ImportError:
        return None
    return join_for_report(analysis, extra)


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
