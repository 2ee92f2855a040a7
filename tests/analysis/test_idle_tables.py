"""Device idle per step and its host causes (`analysis.idle`) on hand-built events: every gap, period
and cause worked out by hand from the timeline drawn in each test, by the module's definition (idle:
the part of a step's period no op covers; each gap's time attributed once, compilation before
synchronisation before input before host-bound; the rest unexplained)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.idle import (IdleTables, _gaps_on_core, capture_windows, host_cause, host_idle,
                                   host_idle_tables, idle_tables)
from tpudiag.model import schemas

TPU0, SC0 = "/device:TPU:0", "/device:TPU:0 SparseCore 0"


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENTS from (device, core, start_ps, end_ps) rows."""
    dev, core, start, end = zip(*rows)
    n = len(rows)
    dur = [e - s for s, e in zip(start, end)]
    return schemas.EVENTS.frame({
        "host": ["h"] * n, "device": list(dev), "core": list(core), "chip": list(core), "program_id": [1] * n,
        "module": ["m"] * n, "name": [f"op.{i}" for i in range(n)], "category": ["loop fusion"] * n,
        "start_ps": list(start), "dur_ps": dur, "self_ps": dur, "depth": [0] * n, "step": [0] * n})


def _host_events(rows: list[tuple]) -> pd.DataFrame:
    """HOST_EVENTS from (name, start_ps, end_ps) rows."""
    name, start, end = zip(*rows)
    return schemas.HOST_EVENTS.frame({"thread": ["main"] * len(rows), "name": list(name), "start_ps": list(start),
                                      "dur_ps": [e - s for s, e in zip(start, end)]})


def _steps(rows: list[tuple]) -> pd.DataFrame:
    """Steps from (core, step, start_ps, dur_ps, io_ps) rows."""
    core, step, start, dur, io = zip(*rows)
    return pd.DataFrame({"core": list(core), "step": list(step), "start_ps": list(start), "dur_ps": list(dur),
                         "io_ps": list(io)})


@pytest.mark.parametrize(("name", "cause"), [
    ("backend_compile", "compilation"), ("PjitFunction(lower_jaxpr)", "compilation"),
    ("TransferFromDevice", "synchronisation"), ("block_until_ready", "synchronisation"),
    ("TransferToDevice", "input"), ("tf.data iterator GetNext", "input"),
    ("PjitFunction(train_step)", "host-bound"), ("", "host-bound")])
def test_host_cause_by_name(name, cause):
    assert host_cause(name) == cause


# Core 0, steps 0 [0, 100) and 1 [100, 200) (a Steps line), ops [10, 40), [30, 50), [60, 100),
# [100, 150), [180, 190); a SparseCore op [50, 60) is not TensorCore work. Gaps: [0, 10) (before the
# first op: lead), [50, 60); [150, 180), [190, 200).
# Host spans: backend_compile [0, 8) and PjitFunction [0, 5) over the first gap: 8 compilation (it
# comes first), 2 unexplained. TransferToDevice [150, 170) and block_until_ready [160, 185) over
# [150, 180): synchronisation first (20), input what is left of its span (10).
EVENTS = [(TPU0, 0, 10, 40), (TPU0, 0, 30, 50), (TPU0, 0, 60, 100), (TPU0, 0, 100, 150), (TPU0, 0, 180, 190),
          (SC0, 0, 50, 60)]
HOST = [("backend_compile", 0, 8), ("PjitFunction(train_step)", 0, 5), ("TransferToDevice", 150, 170),
        ("block_until_ready", 160, 185)]
GAP_COLUMNS = ["step", "start_ps", "end_ps", "idle_ps", "between_ps", "lead_ps", "compilation_ps",
               "synchronisation_ps", "input_ps", "host_bound_ps", "unexplained_ps"]


def test_gaps_and_their_causes_over_steps():
    host = SimpleNamespace(host="h", events=_events(EVENTS), host_events=_host_events(HOST))
    gaps, steps = host_idle_tables(host, _steps([(0, 0, 0, 100, 7), (0, 1, 100, 100, 0)]), executions=False)
    assert gaps[GAP_COLUMNS].to_numpy().tolist() == [
        [0, 0, 10, 10, 0, 10, 8, 0, 0, 0, 2],
        [0, 50, 60, 10, 0, 0, 0, 0, 0, 0, 10],
        [1, 150, 180, 30, 0, 0, 0, 20, 10, 0, 0],
        [1, 190, 200, 10, 0, 0, 0, 0, 0, 0, 10]]
    assert set(gaps["host"]) == {"h"} and set(gaps["core"]) == {0}
    assert steps[["step", "period_ps", "io_ps", "idle_ps", "between_ps", "lead_ps", "compilation_ps",
                  "synchronisation_ps", "input_ps", "host_bound_ps", "unexplained_ps"]].to_numpy().tolist() == [
        [0, 100, 7, 20, 0, 10, 8, 0, 0, 0, 12],
        [1, 100, 0, 40, 0, 0, 0, 20, 10, 0, 10]]
    assert all(gaps[c].dtype == np.int64 for c in GAP_COLUMNS[1:])


def test_host_bound_is_what_no_earlier_cause_covers():
    host = SimpleNamespace(host="h", events=_events([(TPU0, 0, 50, 100)]),
                           host_events=_host_events([("PjitFunction(f)", 0, 30), ("backend_compile", 20, 40)]))
    gaps, _ = host_idle_tables(host, _steps([(0, 0, 0, 100, 0)]), executions=False)
    assert gaps[GAP_COLUMNS].to_numpy().tolist() == [[0, 0, 50, 50, 0, 50, 20, 0, 0, 20, 10]]


def test_without_host_spans_every_gap_is_unexplained():
    for host_events in (None, _host_events(HOST).iloc[:0]):
        host = SimpleNamespace(host="h", events=_events(EVENTS), host_events=host_events)
        gaps, _ = host_idle_tables(host, _steps([(0, 0, 0, 100, 0)]), executions=False)
        assert gaps["unexplained_ps"].tolist() == [10, 10] and gaps["compilation_ps"].tolist() == [0, 0]


# Module executions on core 0 at 0 (50 long), 100 (50 long) and 300: periods [0, 100) and [100, 300);
# the last has no next start, so no period. Ops [0, 40), [100, 150), [300, 310).
# Gaps: [40, 100) of which 50 after the execution ended (at 50); [150, 300), all after it ended.
def test_execution_periods_run_to_the_next_start():
    host = SimpleNamespace(host="h", events=_events([(TPU0, 0, 0, 40), (TPU0, 0, 100, 150), (TPU0, 0, 300, 310)]),
                           host_events=None)
    gaps, steps = host_idle_tables(host, _steps([(0, 2, 300, 10, 0), (0, 0, 0, 50, 0), (0, 1, 100, 50, 0)]),
                                   executions=True)
    assert gaps[["step", "start_ps", "end_ps", "idle_ps", "between_ps", "lead_ps"]].to_numpy().tolist() == [
        [0, 40, 100, 60, 50, 0], [1, 150, 300, 150, 150, 0]]
    assert steps[["step", "period_ps", "idle_ps", "between_ps"]].to_numpy().tolist() == [[0, 100, 60, 50],
                                                                                      [1, 200, 150, 150]]


def test_a_step_no_gap_falls_in_has_zero_idle():
    host = SimpleNamespace(host="h", events=_events([(TPU0, 0, 0, 100), (TPU0, 1, 0, 50)]), host_events=None)
    gaps, steps = host_idle_tables(host, _steps([(0, 0, 0, 100, 0), (1, 0, 0, 100, 0)]), executions=False)
    assert gaps[["core", "start_ps", "end_ps"]].to_numpy().tolist() == [[1, 50, 100]]
    assert steps[["core", "idle_ps", "unexplained_ps"]].to_numpy().tolist() == [[0, 0, 0], [1, 50, 50]]


def test_no_steps_or_no_events_give_empty_tables():
    host = SimpleNamespace(host="h", events=_events(EVENTS), host_events=None)
    for h, steps in ((host, _steps([(0, 0, 0, 1, 0)]).iloc[:0]),
                     (SimpleNamespace(host="h", events=None, host_events=None), _steps([(0, 0, 0, 1, 0)]))):
        gaps, per_step = host_idle_tables(h, steps, executions=False)
        assert gaps.empty and per_step.empty
        assert "unexplained_ps" in gaps.columns and "period_ps" in per_step.columns


def test_gaps_on_core_edges():
    # windows [0, 10), [10, 20), [20, 30); busy [0, 10) exactly, [12, 15), nothing in the third
    win, gs, ge = _gaps_on_core(np.array([0, 10, 20]), np.array([10, 20, 30]), np.array([0, 12]), np.array([10, 15]))
    assert list(zip(win.tolist(), gs.tolist(), ge.tolist())) == [(1, 10, 12), (1, 15, 20), (2, 20, 30)]
    win, gs, ge = _gaps_on_core(np.array([5]), np.array([8]), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert (win.tolist(), gs.tolist(), ge.tolist()) == ([0], [5], [8])
    win, gs, ge = _gaps_on_core(np.array([5]), np.array([8]), np.array([0]), np.array([100]))
    assert (win.tolist(), gs.tolist(), ge.tolist()) == ([], [], [])


def test_capture_windows_span_each_core_from_first_start_to_last_end():
    events = _events([(TPU0, 0, 5, 10), (TPU0, 0, 20, 40), ("/device:TPU:1", 1, 0, 100), (TPU0, 0, 7, 8)])
    out = capture_windows(events)
    assert out[["core", "step", "start_ps", "dur_ps", "io_ps"]].to_numpy().tolist() == [[0, 0, 5, 35, 0],
                                                                                        [1, 0, 0, 100, 0]]
    for empty in (capture_windows(None), capture_windows(events.iloc[:0])):
        assert empty.empty and list(empty.columns) == ["core", "step", "start_ps", "dur_ps", "io_ps"]  # a steps table's


def _step_rows(rows: list[tuple]) -> pd.DataFrame:
    """Per-step idle rows from (host, core, step, period, io, idle, between, lead, compilation, unexplained)."""
    cols = ["host", "core", "step", "period_ps", "io_ps", "idle_ps", "between_ps", "lead_ps", "compilation_ps",
            "unexplained_ps"]
    frame = pd.DataFrame(rows, columns=cols)
    for c in ("synchronisation_ps", "input_ps", "host_bound_ps"):
        frame[c] = 0
    return frame


def test_host_idle_takes_the_least_idle_core_per_step():
    # step 0: core 0 idles 30 of 100, core 1 10 of 120 (least idle: core 1, period the longest, 120);
    # step 1: core 0 idles 50, core 1 60 (least: core 0, 50). Means: idle 30, period 110, io max per step.
    steps = _step_rows([("h", 0, 0, 100, 5, 30, 0, 30, 20, 10), ("h", 1, 0, 120, 9, 10, 4, 0, 10, 0),
                        ("h", 0, 1, 100, 1, 50, 2, 50, 0, 50), ("h", 1, 1, 90, 0, 60, 0, 0, 60, 0)])
    (idle,) = host_idle(IdleTables(gaps=pd.DataFrame(), steps=steps, executions=False))
    assert (idle.host, idle.n_steps, idle.period_ps, idle.idle_ps) == ("h", 2, 110.0, 30.0)
    assert (idle.between_ps, idle.lead_ps, idle.io_ps) == (3.0, 25.0, 5.0)
    assert idle.causes_ps == {"compilation": 5.0, "synchronisation": 0.0, "input": 0.0, "host-bound": 0.0,
                              "unexplained": 25.0}
    assert (idle.worst_step, idle.worst_idle_ps) == (1, 50)
    assert idle.share == pytest.approx(30 / 110)


def test_host_idle_over_a_whole_capture_takes_each_cores_own_window():
    # no steps: core 0 idles 30 of its 100, core 1 40 of its 400 (the least share: 0.1): its own window
    steps = _step_rows([("h", 0, 0, 100, 0, 30, 0, 0, 0, 30), ("h", 1, 0, 400, 0, 40, 0, 0, 0, 40),
                        ("h", 2, 0, 0, 0, 0, 0, 0, 0, 0)])
    (idle,) = host_idle(IdleTables(gaps=pd.DataFrame(), steps=steps.iloc[:2], executions=False, whole_capture=True))
    assert (idle.period_ps, idle.idle_ps) == (400.0, 40.0)
    # a core with an empty window has no share, read as 0: it stands for the host (idle 0 of 0)
    (idle,) = host_idle(IdleTables(gaps=pd.DataFrame(), steps=steps, executions=False, whole_capture=True))
    assert (idle.period_ps, idle.idle_ps) == (0.0, 0.0) and idle.share == 0.0


def _digest(steps: bool, executions: bool, idle_ps: int) -> SimpleNamespace:
    gaps = pd.DataFrame({"host": ["x"], "core": [0], "step": [0], "start_ps": [0], "end_ps": [idle_ps],
                         "idle_ps": [idle_ps], "between_ps": [0], "lead_ps": [0], "compilation_ps": [0],
                         "synchronisation_ps": [0], "input_ps": [0], "host_bound_ps": [0], "unexplained_ps": [idle_ps]})
    per = _step_rows([("x", 0, 0, 100, 0, idle_ps, 0, 0, 0, idle_ps)])
    return SimpleNamespace(steps=pd.DataFrame({"step": [0]}) if steps else pd.DataFrame({"step": []}),
                           executions=executions, idle_gaps=gaps, idle_steps=per)


def test_idle_tables_keep_hosts_with_steps_and_name_them():
    out = idle_tables({"a": _digest(True, False, 10), "b": _digest(False, True, 20), "c": _digest(True, True, 30)})
    assert out.gaps["host"].tolist() == ["a", "c"] and out.steps["idle_ps"].tolist() == [10, 30]
    assert out.executions and not out.whole_capture
    assert out.steps["host"].tolist() == ["a", "c"]
    out = idle_tables({"a": _digest(True, False, 10)})
    assert not out.executions
    assert idle_tables({"a": _digest(True, True, 10), "b": _digest(True, False, 20)}).executions  # any host's


def test_idle_tables_without_steps_anywhere_measure_whole_captures():
    out = idle_tables({"a": _digest(False, False, 10), "b": _digest(False, False, 20)})
    assert out.whole_capture and out.gaps["host"].tolist() == ["a", "b"]
    empty = idle_tables({})
    assert empty.gaps.empty and empty.steps.empty and empty.whole_capture


def test_a_lead_gap_after_time_zero():
    # step [100, 200), its first op at 120: 20 ps before anything runs
    host = SimpleNamespace(host="h", events=_events([(TPU0, 0, 120, 200)]), host_events=None)
    gaps, _ = host_idle_tables(host, _steps([(0, 0, 100, 100, 0)]), executions=False)
    assert gaps[["start_ps", "end_ps", "idle_ps", "lead_ps"]].to_numpy().tolist() == [[100, 120, 20, 20]]


def test_host_idle_of_two_cores_tables_made_by_the_pipeline():
    # steps [0, 100), [100, 200) on cores 0 and 1. Core 0 busy [0, 60), [100, 190): idles 40, 10;
    # core 1 busy [0, 90), [100, 150): idles 10, 50. The least idle core per step idles 10 in each.
    events = _events([(TPU0, 0, 0, 60), (TPU0, 0, 100, 190), ("/device:TPU:1", 1, 0, 90), ("/device:TPU:1", 1, 100, 150)])
    host = SimpleNamespace(host="h", events=events, host_events=None)
    steps = _steps([(0, 0, 0, 100, 0), (0, 1, 100, 100, 0), (1, 0, 0, 100, 0), (1, 1, 100, 100, 0)])
    gaps, per_step = host_idle_tables(host, steps, executions=False)
    digest = SimpleNamespace(steps=steps, executions=False, idle_gaps=gaps, idle_steps=per_step)
    (idle,) = host_idle(idle_tables({"h": digest}))
    assert (idle.n_steps, idle.period_ps, idle.idle_ps, idle.worst_idle_ps) == (2, 100.0, 10.0, 10)
