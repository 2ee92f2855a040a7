"""Loading in a worker, exporting markdown, the mouse, and the honesty of empty states."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.tui.conftest import EXAMPLE, make_app, run, screen_text
from tpudiag.tui.app import TpudiagApp
from tpudiag.tui.screens import LoadingPanel, OpDetailScreen
from tpudiag.tui.session import rule_explanation


async def press(pilot, *names):
    await pilot.press(*names)  # Pilot waits for each key to be handled before the next
    await pilot.pause()


async def wait_loaded(pilot, tries: int = 200):
    for _ in range(tries):
        if pilot.app.session is not None and pilot.app.query("#tabs"):
            await pilot.pause()  # the tabs activate their first pane after mounting
            return
        await pilot.pause(0.05)
    raise AssertionError("the capture did not load")


def test_loads_in_a_worker_with_stages_then_shows_the_overview(monkeypatch):
    monkeypatch.chdir(REPO)
    stages = []
    original = LoadingPanel.stage

    def spy(self, index, text):
        stages.append(index)
        original(self, index, text)

    monkeypatch.setattr(LoadingPanel, "stage", spy)
    app = TpudiagApp(EXAMPLE, cursor_blink=False)
    app.animation_level = "none"

    async def scenario(pilot):
        await wait_loaded(pilot)
        await pilot.pause()
        assert not pilot.app.query(LoadingPanel)
        assert pilot.app.current_view == "overview"
        assert "Duty cycle 85.1%" in screen_text(pilot.app)
    run(app, scenario)
    assert stages[0] == 0 and stages[-1] == 3 and stages == sorted(stages)


def test_keys_while_loading_say_so(monkeypatch, tmp_path):
    # A file that is not a trace: the worker fails and the panel shows the one-line error.
    bad = tmp_path / "run" / "host0.xplane.pb"
    bad.parent.mkdir()
    bad.write_bytes(b"\x0a\xff\xff not a protobuf")
    app = TpudiagApp(bad.parent, cursor_blink=False)

    async def scenario(pilot):
        for _ in range(100):
            if "error:" in screen_text(pilot.app):
                break
            await pilot.pause(0.05)
        text = screen_text(pilot.app)
        assert "error:" in text and "press q to quit" in text
        await press(pilot, "p")
        assert any("still loading" in str(n.message) for n in pilot.app._notifications)
    run(app, scenario)


def test_export_writes_the_current_view_to_the_named_file(example_session, tmp_path):
    async def scenario(pilot):
        await press(pilot, "p", "s", "e", *"out/ops.md", "enter")
    app = run(make_app(example_session, cwd=tmp_path), scenario)
    target = tmp_path / "out" / "ops.md"
    assert app.exported == target
    text = target.read_text()
    assert text.startswith("# tpudiag ops\n\nsorted by FLOP util (descending)")
    assert "| fusion.7 |" in text


def test_export_defaults_to_the_current_directory(example_session, tmp_path):
    async def scenario(pilot):
        await press(pilot, "t", "e", "enter")
    app = run(make_app(example_session, cwd=tmp_path), scenario)
    assert app.exported == tmp_path / "tpudiag-timeline.md"
    assert "| host0 TPU:3 | 26.00 ms |" in app.exported.read_text()


def test_export_of_the_op_detail_screen(example_session, tmp_path):
    async def scenario(pilot):
        await press(pilot, "p", "enter", "e", "enter")
    app = run(make_app(example_session, cwd=tmp_path), scenario)
    assert app.exported == tmp_path / "tpudiag-op.md"
    assert app.exported.read_text().startswith("# `fusion.8` on `host0`")  # names as code spans


def test_export_never_writes_into_the_trace_directory(example_session):
    trace_dir = example_session.trace_dir
    before = sorted(p.name for p in trace_dir.rglob("*"))

    async def scenario(pilot):
        await press(pilot, "e", "enter")
        assert any("refusing to write into the trace directory" in str(n.message)
                   for n in pilot.app._notifications)
    app = run(make_app(example_session, cwd=trace_dir / "plugins"), scenario)
    assert app.exported is None
    assert sorted(p.name for p in trace_dir.rglob("*")) == before


def test_export_never_writes_into_a_dump_directory(example_session, tmp_path):
    """The compiler dumps given with the capture are inputs too: an export aimed there is refused."""
    from dataclasses import replace

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    session = replace(example_session, dumps=(dumps,))

    async def scenario(pilot):
        await press(pilot, "e", "enter")
        assert any("refusing to write the export inside the input directory" in str(n.message)
                   for n in pilot.app._notifications)
    app = run(make_app(session, cwd=dumps), scenario)
    assert app.exported is None
    assert list(dumps.iterdir()) == []


def test_export_can_be_cancelled(example_session, tmp_path):
    async def scenario(pilot):
        await press(pilot, "e", "escape")
    app = run(make_app(example_session, cwd=tmp_path), scenario)
    assert app.exported is None and not list(tmp_path.iterdir())


def test_mouse_click_on_a_tab_switches_and_back_returns(example_session):
    async def scenario(pilot):
        await pilot.click("#--content-tab-hosts")
        await pilot.pause()
        assert pilot.app.current_view == "hosts"
        await press(pilot, "escape")
        assert pilot.app.current_view == "overview"
    run(make_app(example_session), scenario)


def test_mouse_click_on_a_column_header_sorts(example_session):
    async def scenario(pilot):
        await press(pilot, "p")
        table = pilot.app.query_one("#ops-table")
        x = 0
        for column in table.ordered_columns:
            if str(column.label).startswith("FLOP util"):
                break
            x += column.get_render_width(table)
        await pilot.click("#ops-table", offset=(x + 2, 0))
        await pilot.pause()
        ops = pilot.app.query_one("#view-ops")
        assert ops.sort_key == "flop_util" and ops.descending
        await pilot.pause(0.6)  # not a double click
        await pilot.click("#ops-table", offset=(x + 2, 0))
        await pilot.pause()
        assert ops.sort_key == "flop_util" and not ops.descending
    run(make_app(example_session), scenario)


def test_mouse_click_on_a_row_opens_the_detail(example_session):
    async def scenario(pilot):
        await press(pilot, "p")
        await pilot.click("#ops-table", offset=(3, 2))  # second row; the header is row 0
        await pilot.click("#ops-table", offset=(3, 2))
        await pilot.pause()
        assert isinstance(pilot.app.screen, OpDetailScreen)
        assert pilot.app.screen.detail.op.name == example_session.report.ops[1].name
    run(make_app(example_session), scenario)


def test_filter_by_category_select(example_session):
    async def scenario(pilot):
        await press(pilot, "p")
        ops = pilot.app.query_one("#view-ops")
        pilot.app.query_one("#ops-category").value = "all-gather"
        await pilot.pause()
        assert {op.category for op in ops.shown} == {"all-gather"} and len(ops.shown) == 4
    run(make_app(example_session), scenario)


def test_the_explanation_comes_from_the_rule_registry():
    from tpudiag.rules.base import doc_sections
    from tpudiag.rules.registry import get_rule

    what = " ".join(doc_sections(get_rule("exposed-collective").doc)["What it does"].split())
    assert rule_explanation("exposed-collective").startswith(what)
    assert rule_explanation("no-such-rule") == ""


def test_the_loader_runs_the_rules(example_session, monkeypatch):
    monkeypatch.chdir(REPO)
    from tpudiag.tui.session import load_session

    report = load_session(EXAMPLE).report
    assert "exposed-collective" in {f.rule for f in report.findings}  # the example's, from the rules


def test_op_detail_lists_the_findings_that_cite_it(example_session):
    async def scenario(pilot):
        await press(pilot, "f", "enter")
        text = screen_text(pilot.app)
        assert "Finding TPD901" in text and "HLO             %fusion.8 = bf16[8192,50257]" in text
        assert "LLO             n/a: no compiler dumps for this capture" in text
    run(make_app(example_session), scenario)


def test_enter_on_a_finding_opens_the_first_cited_op_the_table_lists(example_session):
    # A spill in a loop body cites the kernel (no row of its own) and then the op that runs it.
    from dataclasses import replace

    from tests.tui.conftest import FINDINGS, with_findings

    nested = replace(FINDINGS[0], ops=("closed_call.4", "fusion.8"))

    async def scenario(pilot):
        await press(pilot, "f", "enter")
        assert isinstance(pilot.app.screen, OpDetailScreen)
        assert "HLO             %fusion.8 = bf16[8192,50257]" in screen_text(pilot.app)
    run(make_app(with_findings(example_session, (nested,))), scenario)


def test_with_compiler_dumps_the_ops_sort_by_spills_and_the_detail_shows_llo_facts(monkeypatch):
    # The modelled v5e transformer and its compiler dumps, both bundled (examples/models).
    capture = REPO / "examples" / "models" / "captures" / "transformer_train_v5e"
    dumps = REPO / "examples" / "models" / "dumps" / "transformer_train_v5e"
    if not (capture.exists() and dumps.exists()):
        pytest.skip("the bundled model captures are not in this checkout")
    from tpudiag.tui.session import load_session

    session = load_session(capture, dumps=(dumps,))
    assert session.report.summary.dumps

    async def scenario(pilot):
        await press(pilot, "p", *"s" * 4)  # self time -> FLOP util -> HBM BW -> padding -> spills
        ops = pilot.app.query_one("#view-ops")
        assert ops.sort_key == "spills"
        top = ops.shown[0]
        assert top.spill_stores is not None
        await press(pilot, "enter")
        text = screen_text(pilot.app)
        total = top.spill_stores + (top.spill_fills or 0)
        assert f"LLO             VMEM spills {total} (stores {top.spill_stores}" in text
    run(make_app(session), scenario)


def test_the_ui_answers_keys_while_a_slow_capture_loads(monkeypatch):
    # Parsing is made slow on purpose: the worker thread holds it while the app keeps handling keys.
    import threading

    import tpudiag.tui.session as session_module

    monkeypatch.chdir(REPO)
    release = threading.Event()
    original = session_module.diagnose

    def slow_load(*args, **kwargs):
        release.wait(timeout=10)
        return original(*args, **kwargs)

    monkeypatch.setattr(session_module, "diagnose", slow_load)
    app = TpudiagApp(EXAMPLE, cursor_blink=False)
    app.animation_level = "none"

    async def scenario(pilot):
        await pilot.pause(0.2)
        assert pilot.app.session is None and "1/4" in screen_text(pilot.app)
        await press(pilot, "question_mark")
        from tpudiag.tui.screens import HelpScreen

        assert isinstance(pilot.app.screen, HelpScreen)  # answered while the worker is blocked
        await press(pilot, "escape")
        release.set()
        await wait_loaded(pilot)
        assert pilot.app.current_view == "overview"
    run(app, scenario)


def test_regression_a_multi_host_capture_loads_inside_the_app(tmp_path, monkeypatch):
    # Several hosts parse in a process pool. Started from inside the app, where stderr is Textual's
    # capture object (fileno -1), multiprocessing's resource tracker failed with "bad value(s) in
    # fds_to_keep" and the worker died with a traceback.
    from tests.tui.conftest import _two_host_design
    from tpudiag.writers.tpu_design import write_capture

    run_dir = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(_two_host_design("host0", 0, None), run_dir)
    write_capture(_two_host_design("host1", 2, 3), run_dir)
    app = TpudiagApp(tmp_path / "logdir", cursor_blink=False)
    app.animation_level = "none"

    async def scenario(pilot):
        await wait_loaded(pilot, tries=400)
        assert pilot.app.session.report.summary.hosts == ("host0", "host1")
    run(app, scenario)


def test_timeline_of_a_host_file_gone_since_loading_says_so(tmp_path, monkeypatch):
    """A multi-host capture keeps no events: the timeline re-reads each host's file. A file removed
    since loading is an error line on the timeline, not a crash."""
    from tests.tui.conftest import _two_host_design
    from tpudiag.tui.session import load_session
    from tpudiag.writers.tpu_design import write_capture

    run_dir = tmp_path / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    write_capture(_two_host_design("host0", 0, None), run_dir)
    write_capture(_two_host_design("host1", 2, 3), run_dir)
    monkeypatch.chdir(tmp_path)
    session = load_session(tmp_path / "logdir")
    assert all(h.events is None for h in session.analysis.profile.hosts)
    (run_dir / "host1.xplane.pb").unlink()

    async def scenario(pilot):
        await press(pilot, "t")
        text = " ".join(screen_text(pilot.app).split())  # the error line wraps
        assert "error: cannot read the host again for its timeline" in text and "no such file" in text
        await press(pilot, "right_square_bracket", "h")  # no timeline to step through; the app goes on
        assert pilot.app.current_view == "hosts"
    run(make_app(session), scenario)
