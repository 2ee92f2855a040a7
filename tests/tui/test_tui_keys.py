"""Every binding the help screen documents, pressed with Pilot, and what it must do."""

from __future__ import annotations

import pytest

from tests.tui.conftest import make_app, run
from tpudiag.tui import keys
from tpudiag.tui.screens import ExportScreen, HelpScreen, MemoryScreen, OpDetailScreen


async def press(pilot, *names):
    await pilot.press(*names)  # Pilot waits for each key to be handled before the next
    await pilot.pause()


# (key, what to press first) -> check(app). One case per documented key; the meta-test below keeps
# this table in step with `tpudiag.tui.keys`.
def _view(view_id):
    return lambda app: app.current_view == view_id


CASES = {
    ("global", "o"): (("p",), _view("overview")),
    ("global", "f"): ((), _view("findings")),
    ("global", "p"): ((), _view("ops")),
    ("global", "t"): ((), _view("timeline")),
    ("global", "h"): ((), _view("hosts")),
    ("global", "m"): (("p",), lambda app: isinstance(app.screen, MemoryScreen)),
    ("global", "slash"): ((), lambda app: app.current_view == "ops" and app.focused.id == "ops-search"),
    ("global", "e"): (("p",), lambda app: isinstance(app.screen, ExportScreen) and app.screen.view == "ops"),
    ("global", "question_mark"): ((), lambda app: isinstance(app.screen, HelpScreen)),
    ("global", "escape"): (("p", "t"), lambda app: app.current_view == "ops" and app.history == ["overview"]),
    ("global", "k"): ((), lambda app: any("kernels lab" in str(n.message) for n in app._notifications)),
    ("global", "q"): ((), lambda app: app._exit_renderables is not None or not app.is_running),
    ("ops", "s"): (("p",), lambda app: app.query_one("#view-ops").sort_key == "flop_util"),
    ("ops", "r"): (("p",), lambda app: app.query_one("#view-ops").descending is False),
    ("ops", "c"): (("slash", "z", "z", "enter"), lambda app: app.query_one("#view-ops").filter.text == ""
                   and len(app.query_one("#view-ops").shown) == len(app.session.report.ops)),
    ("ops", "enter"): (("p", "down"), lambda app: isinstance(app.screen, OpDetailScreen)
                       and app.screen.detail.op == app.session.report.ops[1]),
    ("findings", "enter"): (("f", "down"), lambda app: isinstance(app.screen, OpDetailScreen)
                            and app.screen.detail.op.name == "all-reduce.3"),
    ("timeline", "left_square_bracket"): (("t", "right", "right"), lambda app: _step(app) == 11),
    ("timeline", "left"): (("t", "right"), lambda app: _step(app) == 10),
    ("timeline", "right_square_bracket"): (("t",), lambda app: _step(app) == 11),
    ("timeline", "right"): (("t", "right"), lambda app: _step(app) == 12),
    ("timeline", "d"): (("t",), lambda app: _selected(app) == (0, 0)),
    ("timeline", "a"): (("t", "d", "d", "d"), lambda app: _selected(app) == (0, 1)),
    ("timeline", "s"): (("t", "d"), lambda app: _selected(app)[0] == 1),
    ("timeline", "w"): (("t", "d", "s", "s"), lambda app: _selected(app)[0] == 1),
    ("timeline", "enter"): (("t", "d", "d"), lambda app: isinstance(app.screen, OpDetailScreen)
                            and app.screen.detail.op.name == _lane_op(app, 0, 1)),
    ("findings", "l"): (("f", "up"), lambda app: app.current_view == "timeline" and _selected(app) is not None
                        and _lane_op(app, *_selected(app)) == "fusion.8"),
    ("hosts", "enter"): (("h",), lambda app: app.current_view == "timeline" and _step(app) == 10),
    ("op detail", "escape"): (("p", "enter"), lambda app: not isinstance(app.screen, OpDetailScreen)
                              and app.current_view == "ops"),
}


def _step(app):
    return app.query_one("#view-timeline").timeline.step


def _selected(app):
    return app.query_one("#timeline-chart").selected


def _lane_op(app, lane: int, span: int) -> str:
    return app.query_one("#view-timeline").timeline.lanes[lane].spans[span].name


def documented():
    return [(k.scope, name) for k in keys.ALL for name in k.keys.split(",")]


def test_every_documented_key_has_a_case():
    assert sorted(documented()) == sorted(CASES)


async def reset(pilot):
    """Back to a fresh overview without restarting the app: screens popped, history cleared."""
    app = pilot.app
    while len(app.screen_stack) > 1:
        await app.pop_screen()
    await app.action_view("overview", remember=False)
    ops = app.query("#view-ops")
    if ops:
        ops.first().action_clear_filters()
        ops.first().sort_key, ops.first().descending = "self_time", True
        ops.first().refresh_table()
    timeline = app.query("#view-timeline")
    if timeline:
        timeline.first().show_step(timeline.first().timeline.steps[0])
    app.history.clear()
    app._notifications.clear()
    await pilot.pause()


# One app per scope keeps the suite quick; `reset` puts the app back between keys. `q` ends the
# app, so it runs alone.
@pytest.mark.parametrize("scope", sorted({scope for scope, _ in CASES}))
def test_keys_of_scope(example_session, scope):
    cases = [(s, k) for s, k in documented() if s == scope and k != "q"]

    async def scenario(pilot):
        for s, key in cases:
            await reset(pilot)
            before, check = CASES[(s, key)]
            await press(pilot, *before)
            await press(pilot, key)
            assert check(pilot.app), f"{key} in {scope} did not do what the help says"
    run(make_app(example_session), scenario)


def test_q_quits(example_session):
    async def scenario(pilot):
        await press(pilot, "q")
        assert CASES[("global", "q")][1](pilot.app)
    run(make_app(example_session), scenario)


def test_escape_leaves_the_search_box_before_going_back(example_session):
    async def scenario(pilot):
        await press(pilot, "slash", "a")
        assert pilot.app.focused.id == "ops-search"
        await press(pilot, "escape")
        assert pilot.app.current_view == "ops" and pilot.app.focused.id == "ops-table"
        await press(pilot, "escape")
        assert pilot.app.current_view == "overview"
    run(make_app(example_session), scenario)


def test_letters_typed_in_the_search_box_do_not_switch_views(example_session):
    async def scenario(pilot):
        await press(pilot, "slash", *"fusion.1", "0")
        app = pilot.app
        assert app.current_view == "ops" and app.query_one("#view-ops").filter.text == "fusion.10"
        assert [op.name for op in app.query_one("#view-ops").shown] == ["fusion.10"]
    run(make_app(example_session), scenario)


def test_enter_on_a_straggler_host_opens_its_slowest_step(two_host_session):
    async def scenario(pilot):
        await press(pilot, "h", "down", "enter")  # host1: step 3 is 800 µs longer
        assert pilot.app.current_view == "timeline" and _step(pilot.app) == 3
        await press(pilot, "escape")
        assert pilot.app.current_view == "hosts"
    run(make_app(two_host_session), scenario)


def test_kernels_lab_on_an_op_names_the_command_to_run(example_session):
    async def scenario(pilot):
        await press(pilot, "p", "enter", "k")
        messages = [str(n.message) for n in pilot.app._notifications]
        assert any(f"tpudiag lab extract {example_session.path} --op fusion.8" in m for m in messages)
    run(make_app(example_session), scenario)


def test_kernels_lab_on_the_ops_tables_row_fills_in_that_op(example_session):
    async def scenario(pilot):
        await press(pilot, "p", "k")  # the ops table, cursor on its first row, no detail screen opened
        messages = [str(n.message) for n in pilot.app._notifications]
        assert any(f"tpudiag lab extract {example_session.path} --op fusion.8 -o lab/fusion.8" in m for m in messages)
        assert not any("--op NAME" in m for m in messages)
    run(make_app(example_session), scenario)


def test_help_toggles_and_esc_closes_it(example_session):
    async def scenario(pilot):
        await press(pilot, "question_mark", "question_mark")
        assert not isinstance(pilot.app.screen, HelpScreen)
        await press(pilot, "question_mark", "escape")
        assert not isinstance(pilot.app.screen, HelpScreen)
    run(make_app(example_session), scenario)
