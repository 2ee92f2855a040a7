"""TUI test harness: sessions with fixed findings, a Pilot runner at 120x40, text snapshots.

As in posting and harlequin: the app is driven with Pilot at a fixed terminal size, the cursor
does not blink, and the developer's own Textual settings (TEXTUAL_* variables) are kept out.
Snapshots are the screen's text (`tests/tui/snapshots/*.txt`); regenerate them on purpose with
`UPDATE_SNAPSHOTS=1 pytest tests/tui` and review the diff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("textual")

from tests.conftest import REPO, US, small_design  # noqa: E402
from tests.snapshot_util import check_snapshot  # noqa: E402
from tpudiag.model.findings import Evidence, Finding, Saving, Severity  # noqa: E402
from tpudiag.tui.session import Session, load_session  # noqa: E402
from tpudiag.writers.tpu_design import write_capture  # noqa: E402

SIZE = (120, 40)
SNAPSHOTS = Path(__file__).parent / "snapshots"
EXAMPLE = Path("examples/captures/train_v6e_4chip")  # relative: the path shows on screen

# Findings made up for the screens, so snapshots do not change when a rule's wording does.
FINDINGS = (
    Finding("padded-logits", "TPD901", Severity.MEDIUM, "`fusion.8` pads 50257 to 50432 columns",
            Saving(2_280 * US, "modelled", "self time per step x padding share"), "pad the vocabulary to 50432",
            evidence=(Evidence("fusion.8", (("time share", "28.6%"), ("FLOP util", "49.4%"))),),
            host="host0", ops=("fusion.8",)),
    Finding("exposed-all-reduce", "TPD902", Severity.LOW, "`all-reduce.3` is exposed for 620 µs per step",
            Saving(620 * US, "measured", "exposed time per step"), "make the all-reduce asynchronous",
            host="host0", ops=("all-reduce.3",)),
)


@pytest.fixture(autouse=True)
def _no_developer_config(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TEXTUAL"):
            monkeypatch.delenv(name)


def with_findings(session: Session, findings=FINDINGS) -> Session:
    report = dataclasses.replace(session.report, findings=tuple(findings), rules_skipped=())
    return dataclasses.replace(session, report=report)


@pytest.fixture(scope="session")
def example_session() -> Session:
    old = Path.cwd()
    os.chdir(REPO)
    try:
        return with_findings(load_session(EXAMPLE))
    finally:
        os.chdir(old)


def _two_host_design(hostname: str, first_chip: int, slow_step: int | None):
    def step_ps_for(chip: int, step: int) -> int:
        return 10_800 * US if step == slow_step else 10_000 * US
    return small_design(hostname=hostname, first_chip=first_chip, step_ps_for=step_ps_for)


@pytest.fixture(scope="session")
def two_host_session(tmp_path_factory) -> Session:
    """Two hosts of 2 chips; host1's step 3 is 800 µs longer: the straggler."""
    root = tmp_path_factory.mktemp("two_host")
    run = root / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    write_capture(_two_host_design("host0", 0, None), run)
    write_capture(_two_host_design("host1", 2, 3), run)
    old = Path.cwd()
    os.chdir(root)
    try:
        return with_findings(load_session(Path("logdir")), findings=())
    finally:
        os.chdir(old)


def screen_text(app) -> str:
    """The current screen as plain text, one line per terminal row (trailing spaces dropped)."""
    strips = app.screen._compositor.render_strips()  # what export_screenshot renders, without styles
    return "\n".join(strip.text.rstrip() for strip in strips).rstrip() + "\n"


def _without_cwd(text: str) -> str:
    """Screens that show the working directory (the export dialog) differ between checkouts:
    name it `<cwd>` and collapse the padding its length changes, on those lines only."""
    cwd = str(Path.cwd())
    return "\n".join(re.sub(r" {2,}", " ", line.replace(cwd, "<cwd>")) if cwd in line else line
                     for line in text.split("\n"))


def assert_snapshot(app, name: str) -> None:
    text = _without_cwd(screen_text(app))
    check_snapshot(SNAPSHOTS / f"{name}.txt", text)


async def settle(pilot, rounds: int = 500) -> None:
    """Wait until the screen stops changing: on a loaded machine the first frames are laid out
    before the terminal size is applied (a bar 20 cells wide, the tab underline unplaced). Up to
    10 s: a stable screen returns after three equal frames, so only a starved run waits longer."""
    seen = []
    for _ in range(rounds):
        await pilot.pause(0.02)
        seen.append(screen_text(pilot.app))
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
            return


def run(app, scenario, size=SIZE):
    """Run `scenario(pilot)` against `app` at a fixed size; return the app."""
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()  # the tab underline is placed after the first layout
            await settle(pilot)
            await scenario(pilot)
    asyncio.run(main())
    return app


def make_app(session: Session, **kw):
    from tpudiag.tui.app import TpudiagApp

    app = TpudiagApp(session=session, cursor_blink=False, **kw)
    app.animation_level = "none"  # the tab underline slides otherwise: screens would differ by timing
    return app
