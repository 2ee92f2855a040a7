"""Fixtures for the rule tests: analysed scenario captures and golden-file snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from tests.snapshot_util import check_snapshot
from tpudiag.model.findings import Finding

SNAPSHOTS = Path(__file__).parent / "snapshots"


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
    """`snapshot(name, text)`: compare with `snapshots/<name>.txt` (`tests.snapshot_util.check_snapshot`)."""

    def check(name: str, text: str) -> None:
        check_snapshot(SNAPSHOTS / f"{name}.txt", text)

    return check
