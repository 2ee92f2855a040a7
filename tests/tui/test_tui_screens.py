"""Snapshot of every screen at 120x40, reached the way a user would (keys)."""

from __future__ import annotations

import pytest

from tests.tui.conftest import assert_snapshot, make_app, run, with_findings


def _keys(*keys):
    async def scenario(pilot):
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
    return scenario


@pytest.mark.parametrize("name, keys", [
    ("overview", ()),
    ("findings", ("f",)),
    ("findings_second", ("f", "down")),
    ("ops", ("p",)),
    ("ops_sorted_flop_util", ("p", "s")),
    ("ops_search_all_reduce", ("slash", *"all-reduce", "enter")),
    ("op_detail_from_ops", ("p", "enter")),
    ("op_detail_from_finding", ("f", "enter")),
    ("timeline", ("t",)),
    ("timeline_next_step", ("t", "right_square_bracket")),
    ("hosts_single", ("h",)),
    ("help", ("question_mark",)),
    ("export_dialog", ("p", "e")),
])
def test_example_snapshot(example_session, name, keys):
    async def scenario(pilot):
        await _keys(*keys)(pilot)
        assert_snapshot(pilot.app, f"example_{name}")
    run(make_app(example_session), scenario)


@pytest.mark.parametrize("name, keys", [
    ("overview", ()),
    ("ops", ("p",)),
    ("timeline", ("t",)),
    ("hosts", ("h",)),
])
def test_two_host_snapshot(two_host_session, name, keys):
    async def scenario(pilot):
        await _keys(*keys)(pilot)
        assert_snapshot(pilot.app, f"two_host_{name}")
    run(make_app(two_host_session), scenario)


def test_findings_says_rules_not_run(example_session):
    async def scenario(pilot):
        await _keys("f")(pilot)
        assert_snapshot(pilot.app, "findings_rules_not_run")
    run(make_app(with_findings(example_session, findings=(), rules_run=False)), scenario)


def test_findings_says_no_findings(example_session):
    async def scenario(pilot):
        await _keys("f")(pilot)
        assert_snapshot(pilot.app, "findings_none")
    run(make_app(with_findings(example_session, findings=(), rules_run=True)), scenario)
