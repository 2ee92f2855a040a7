"""The TUI on a capture whose host, program and op names hold rich markup and terminal escapes.

Regression for issue 13: a host or program named `[/x]` crashed the op-detail screen with a rich
`MarkupError`, and the markdown export wrote raw HTML, links and images from op names.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("textual")

from tests.robustness.hostile import MARKUP, OP, assert_inert, write_hostile  # noqa: E402
from tests.tui.conftest import make_app, run, screen_text, with_findings  # noqa: E402
from tpudiag.model.findings import Evidence, Finding, Saving, Severity  # noqa: E402
from tpudiag.tui import export  # noqa: E402
from tpudiag.tui.screens import OpDetailScreen  # noqa: E402
from tpudiag.tui.session import load_session  # noqa: E402

US = 1_000_000


@pytest.fixture(scope="module")
def hostile_session(tmp_path_factory):
    root = tmp_path_factory.mktemp("tui_hostile")
    write_hostile(root)
    old = Path.cwd()
    os.chdir(root)
    try:
        session = load_session(Path("logdir"))
    finally:
        os.chdir(old)
    # A finding quoting the hostile op, as a rule's message would.
    finding = Finding("hostile-op", "TPD999", Severity.HIGH, f"`{OP}` takes 60% of the step",
                      Saving(3000 * US, "measured", f"self time of {OP}"), f"rename {OP}",
                      evidence=(Evidence(OP, (("time share", f"60% {MARKUP}"),)),), host=session.report.hosts[0].host,
                      ops=(OP,))
    return with_findings(session, findings=(finding,))


async def _press(pilot, *keys):
    await pilot.press(*keys)
    await pilot.pause()


def test_every_view_and_the_op_detail_render_hostile_names(hostile_session, tmp_path):
    seen = {}

    async def scenario(pilot):
        for key in ("o", "f", "p", "t", "h"):
            await _press(pilot, key)
            seen[key] = screen_text(pilot.app)
        await _press(pilot, "p", "enter")  # the op detail: host and program in one markup cell before
        assert isinstance(pilot.app.screen, OpDetailScreen)
        seen["detail"] = screen_text(pilot.app)
        await _press(pilot, "e", "enter")

    app = run(make_app(hostile_session, cwd=tmp_path), scenario)
    for key, text in seen.items():
        bad = [line for line in text.splitlines() if "\x1b" in line or "\u202e" in line]
        assert not bad, (key, bad)
        assert_inert(text)
    assert MARKUP in seen["detail"] and "\\x1b]0;pwned\\x07" in seen["detail"]  # shown literally, escaped
    exported = app.exported.read_text(encoding="utf-8")
    assert_inert(exported)


def test_every_markdown_export_is_inert_and_has_no_html_or_links(hostile_session):
    from tests.render.test_markdown import gfm_html
    from tpudiag.analysis.drilldown import OpFilter, op_detail
    from tpudiag.analysis.stragglers import host_step_matrix

    report = hostile_session.report
    op = next(o for o in report.ops if o.name == OP)
    docs = [export.overview_md(report), export.findings_md(report, report.findings[0]),
            export.ops_md(report.ops, OpFilter(text=OP), "self time", True),
            export.op_detail_md(op_detail(hostile_session.analysis, report, op)),
            export.hosts_md(host_step_matrix(report.hosts))]
    for doc in docs:
        assert_inert(doc)
        html = gfm_html(doc)
        assert "<img" not in html and "<a " not in html, doc
