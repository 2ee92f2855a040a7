"""Golden files: compare, or rewrite them all with UPDATE_SNAPSHOTS=1 (then review the git diff).

One mechanism and one variable for every snapshot in the suite (JSON goldens, rule findings, TUI
screens, rendered reports). A missing snapshot fails the test and is not written: a snapshot that
writes itself during an ordinary run passes whatever the code printed.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from tpudiag import __version__

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE_VARIABLE = "UPDATE_SNAPSHOTS"


def updating() -> bool:
    """Whether this run rewrites snapshots instead of comparing with them."""
    return os.environ.get(UPDATE_VARIABLE) == "1"


def normalise(text: str, replacements: dict[str, str]) -> str:
    """Machine-specific paths and the tool version replaced by placeholders, longest path first."""
    for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return text.replace(f"tpudiag {__version__}", "tpudiag <version>")


def check_snapshot(path: Path, text: str) -> None:
    """`text` equals the snapshot at `path`; with UPDATE_SNAPSHOTS=1 it becomes the snapshot."""
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        raise AssertionError(f"snapshot {path.name} is missing: make it with {UPDATE_VARIABLE}=1 and review it")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = difflib.unified_diff(expected.splitlines(), text.splitlines(), "snapshot", "now", lineterm="", n=1)
        raise AssertionError(f"{path.name} differs from its snapshot; rerun with {UPDATE_VARIABLE}=1 if on purpose\n"
                             + "\n".join(diff))


def assert_snapshot(text: str, name: str) -> None:
    """`check_snapshot` for a file under tests/snapshots/."""
    check_snapshot(SNAPSHOTS / name, text)
