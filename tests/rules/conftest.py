"""Fixtures for the rule tests: analysed scenario captures and golden-file snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from tpudiag.model.findings import Finding

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("TPUDIAG_UPDATE_SNAPSHOTS") == "1"


def render_findings(findings: list[Finding]) -> str:
    """The findings exactly as the terminal report prints them, without colour, 110 columns wide."""
    from tpudiag.render.terminal import finding_lines

    console = Console(width=110, record=True, color_system=None, force_terminal=False, file=open(os.devnull, "w"))
    for i, f in enumerate(findings, start=1):
        for line in finding_lines(f, i):
            console.print(line)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


@pytest.fixture
def snapshot():
    """`snapshot(name, text)`: compare with `snapshots/<name>.txt`; TPUDIAG_UPDATE_SNAPSHOTS=1 rewrites it."""

    def check(name: str, text: str) -> None:
        path = SNAPSHOTS / f"{name}.txt"
        if UPDATE or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if not UPDATE:
                pytest.fail(f"snapshot {path.name} did not exist and was written: review it and rerun")
        assert text == path.read_text(), f"snapshot {path.name} differs; rerun with TPUDIAG_UPDATE_SNAPSHOTS=1"

    return check
