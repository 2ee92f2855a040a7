"""Snapshot of every screen at 120x40, reached the way a user would (keys).

Each journey starts one app and walks through several screens, checking a snapshot at each stop;
every mismatch of a journey is reported together, by snapshot name.
"""

from __future__ import annotations

import pytest

from tests.tui.conftest import assert_snapshot, make_app, run, settle, with_findings

# (keys to press, snapshot name) in order; each journey is one app.
EXAMPLE_JOURNEYS = {
    "findings": [((), "example_overview"), (("f",), "example_findings"), (("down",), "example_findings_second"),
                 (("enter",), "example_op_detail_from_finding")],
    "ops": [(("p",), "example_ops"), (("enter",), "example_op_detail_from_ops"),
            (("escape", "e"), "example_export_dialog"), (("escape", "s"), "example_ops_sorted_flop_util"),
            (("slash", *"all-reduce", "enter"), "example_ops_search_all_reduce")],
    "timeline_hosts_help": [(("t",), "example_timeline"), (("right_square_bracket",), "example_timeline_next_step"),
                            (("h",), "example_hosts_single"), (("question_mark",), "example_help")],
    # a finding's op on the timeline, selected; then the next op, and its detail
    "timeline_selection": [(("f", "l"), "example_timeline_finding_op"), (("d",), "example_timeline_next_op"),
                           (("enter",), "example_op_detail_from_timeline")],
}
TWO_HOST_JOURNEY = [((), "two_host_overview"), (("p",), "two_host_ops"), (("t",), "two_host_timeline"),
                    (("h",), "two_host_hosts")]


def _journey(stops):
    failures = []

    async def scenario(pilot):
        for keys, name in stops:
            if keys:
                await pilot.press(*keys)
                await settle(pilot)
            try:
                assert_snapshot(pilot.app, name)
            except AssertionError as exc:
                failures.append(str(exc))
    return scenario, failures


@pytest.mark.parametrize("journey", sorted(EXAMPLE_JOURNEYS))
def test_example_snapshots(example_session, journey):
    scenario, failures = _journey(EXAMPLE_JOURNEYS[journey])
    run(make_app(example_session), scenario)
    assert not failures, "\n\n".join(failures)


def test_two_host_snapshots(two_host_session):
    scenario, failures = _journey(TWO_HOST_JOURNEY)
    run(make_app(two_host_session), scenario)
    assert not failures, "\n\n".join(failures)


def test_findings_says_no_findings(example_session):
    scenario, failures = _journey([(("f",), "findings_none")])
    run(make_app(with_findings(example_session, findings=())), scenario)
    assert not failures, "\n\n".join(failures)


def _with_memory(session, tmp_path, monkeypatch):
    """The session with the memory of the issue's near-capacity Adam dump (tests/memory_dumps.py),
    written under a relative name so the screen shows no machine-specific path."""
    import dataclasses

    from tests.memory_dumps import write_adam_dump
    from tpudiag.analysis.device_memory import program_memories
    from tpudiag.pipeline import load_dumps

    monkeypatch.chdir(tmp_path)
    dump = write_adam_dump(tmp_path / "near", layers=10, live_activations=2)
    memory = program_memories(load_dumps([dump.relative_to(tmp_path)]))
    return dataclasses.replace(session, report=dataclasses.replace(session.report, memory=memory), diagnosis=None)


def test_memory_screen(example_session, tmp_path, monkeypatch):
    session = _with_memory(example_session, tmp_path, monkeypatch)
    scenario, failures = _journey([(("m",), "memory_near"), (("escape",), "example_overview")])
    run(make_app(session), scenario)
    assert not failures, "\n\n".join(failures)


def test_memory_screen_without_a_buffer_assignment(example_session):
    scenario, failures = _journey([(("m",), "memory_none")])
    run(make_app(example_session), scenario)
    assert not failures, "\n\n".join(failures)
