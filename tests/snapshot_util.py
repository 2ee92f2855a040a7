"""Golden files under tests/snapshots/: compare, or rewrite with UPDATE_SNAPSHOTS=1 (review the git diff)."""

from __future__ import annotations

import os
from pathlib import Path

from tpudiag import __version__

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"


def normalise(text: str, replacements: dict[str, str]) -> str:
    """Machine-specific paths and the tool version replaced by placeholders, longest path first."""
    for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return text.replace(f"tpudiag {__version__}", "tpudiag <version>")


def assert_snapshot(text: str, name: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(text, encoding="utf-8")
        if os.environ.get("UPDATE_SNAPSHOTS") != "1":
            raise AssertionError(f"snapshot {name} was missing and has been written; review it and rerun")
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} differs from its snapshot; rerun with UPDATE_SNAPSHOTS=1 if on purpose"
