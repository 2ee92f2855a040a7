"""Load a capture for the TUI through `tpudiag.diagnose`, as `tpudiag report` does: same rules,
configuration, compiled join and warnings. No Textual here: the app calls `load_session` in a
worker thread and shows `progress`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.pipeline import STAGES, Diagnosis, diagnose
from tpudiag.model.profile import Profile
from tpudiag.model.report import Report
from tpudiag.parsers.capture_files import find_capture


@dataclass(frozen=True)
class Session:
    """Everything the views render. `trace_dir` is where the capture lives (never written to)."""

    path: Path
    trace_dir: Path
    profile: Profile
    analysis: Analysis
    report: Report
    diagnosis: Diagnosis | None = None
    dumps: tuple[Path, ...] = ()  # compiler dump directories given with the capture (never written to)


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
    """Diagnose the capture at `path`; `progress(stage_index, text)` reports each stage."""
    stage = [0]

    def on_progress(text: str) -> None:
        if text in STAGES:
            stage[0] = STAGES.index(text)
        if progress:
            progress(stage[0], text)

    path = Path(path)
    find_capture(path)  # fail fast with the precise input error
    on_progress(STAGES[0])
    result = diagnose(path, dumps=dumps, progress=on_progress)
    # The views sort and filter the op rows at each key: made once here, not at each read (`OpRows`).
    report = replace(result.report, ops=tuple(result.report.ops))
    return Session(path=path, trace_dir=trace_dir_of(path), profile=result.analysis.profile,
                   analysis=result.analysis, report=report, diagnosis=result, dumps=tuple(dumps))


def rule_explanation(rule: str) -> str:
    """The rule's own "What it does" and "Why it matters" text, or "" for a name the registry lacks."""
    from tpudiag.rules.base import doc_sections
    from tpudiag.rules.registry import get_rule

    found = get_rule(rule)
    if found is None:
        return ""
    sections = doc_sections(found.doc)
    parts = [" ".join(sections[t].split()) for t in ("What it does", "Why it matters") if sections.get(t)]
    return "\n\n".join(parts)
