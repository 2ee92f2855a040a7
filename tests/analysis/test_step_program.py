"""Steps without a `Steps` line (issue 35 §2): the step is the program that repeats and holds the
most device time, matched across cores; every other program is listed beside it."""

from __future__ import annotations

import json

import numpy as np

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.programs_capture import HIGH_ID, OTHER_HIGH_ID, US, Execution, write_programs_capture
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.parsers.capture import load_capture
from tpudiag.render.json_format import render_json
from tpudiag.report_builder import build_report
from tests.rules.scenarios import run_rules
from tpudiag.rules.config import RulesConfig

INIT_ID = 11287434908481120160  # jit_broadcast_in_dim's id in the real v6e capture


def _report(run):
    analysis = analyze(load_capture(run))
    return analysis, build_report(analysis)


def _inference(n_chips: int = 2, n_steps: int = 6, gap_ps: int = 1 * US // 1000) -> list[list[Execution]]:
    """Per chip: a one-off 150 ms initialiser (chip 0 only), 3 warm-up collectives of 15 ms, then
    `n_steps` 10 ms executions of jit_f back to back (1 ns apart), each chip its own length."""
    chips = []
    for c in range(n_chips):
        ex = [Execution("jit_broadcast_in_dim", INIT_ID, 0, 150_000 * US)] if c == 0 else []
        ex += [Execution("jit__psum", OTHER_HIGH_ID, 160_000 * US + i * 20_000 * US, 15_000 * US, op="ar")
               for i in range(3)]
        t = 250_000 * US
        for i in range(n_steps):
            dur = 10_000 * US + (c * 500 * US if i % 2 else 0)  # chip 1's odd steps are 0.5 ms longer
            ex.append(Execution("jit_f", HIGH_ID, t, dur))
            t += dur + gap_ps
        chips.append(ex)
    return chips


def test_the_step_is_the_repeating_program_not_the_longest_one_off(tmp_path):
    # jit_broadcast_in_dim holds the most device time (150 ms, one execution); jit__psum repeats but
    # holds 3 x 15 ms per core (90 ms); jit_f repeats and holds 6 x ~10 ms per core (121.5 ms): the
    # step is jit_f, the repeating program with the most device time.
    _, report = _report(write_programs_capture(tmp_path, _inference()))
    s = report.summary
    assert s.step_program == "jit_f" and s.step_source == "XLA Modules (jit_f)"
    assert s.step_time.count == 6
    # Step time is the slowest core's per step: 10 ms on even steps, 10.5 ms (chip 1) on odd ones.
    assert s.step_time.mean_ps == pytest.approx(10_250 * US)
    assert s.step_time.p50_ps == pytest.approx(10_250 * US)


def test_every_program_is_listed_with_its_own_counts_and_time(tmp_path):
    _, report = _report(write_programs_capture(tmp_path, _inference()))
    rows = {p.module: p for p in report.programs}
    assert [p.module for p in report.programs] == ["jit_broadcast_in_dim", "jit_f", "jit__psum"]
    assert (rows["jit_f"].executions, rows["jit_f"].cores, rows["jit_f"].step) == (6, 2, True)
    assert (rows["jit__psum"].executions, rows["jit__psum"].cores, rows["jit__psum"].step) == (3, 2, False)
    assert (rows["jit_broadcast_in_dim"].executions, rows["jit_broadcast_in_dim"].cores) == (1, 1)
    assert rows["jit__psum"].time_ps == 6 * 15_000 * US and rows["jit__psum"].mean_ps == 15_000 * US
    assert rows["jit_f"].program_id == HIGH_ID
    assert sum(p.share for p in report.programs) == pytest.approx(1.0)
    doc = json.loads(render_json(report))
    assert doc["summary"]["step_program"] == "jit_f"
    assert [(p["module"], p["program_id"], p["executions"], p["step"]) for p in doc["programs"]] == [
        ("jit_broadcast_in_dim", INIT_ID, 1, False), ("jit_f", HIGH_ID, 6, True), ("jit__psum", OTHER_HIGH_ID, 3, False)]


def test_back_to_back_executions_are_not_device_idle(tmp_path):
    # Regression: the merged step sequence of the real capture gave a false device-idle finding.
    analysis, _ = _report(write_programs_capture(tmp_path, _inference()))
    findings, _ = run_rules(analysis, RulesConfig(select=("device-idle",)))
    assert findings == []


def test_executions_are_matched_across_cores_by_start_time(tmp_path):
    # Chip 1's capture starts late: it misses jit_f's first execution. Matching by position would pair
    # chip 0's step k with chip 1's step k + 1; matched by start time, step 0 is on chip 0 only and is
    # left out (a step counts when every core that runs the program ran it), as XProf intersects.
    chips = _inference()
    first_f = min(e.start_ps for e in chips[1] if e.module == "jit_f")
    chips[1] = [e for e in chips[1] if e.start_ps != first_f]
    analysis, report = _report(write_programs_capture(tmp_path, chips))
    assert report.summary.step_time.count == 5
    assert analysis.step_sources["host"].left_out == 1
    assert any("1 executions of `jit_f` are not steps" in w for w in report.warnings)
    steps = analysis.steps.pivot(index="step", columns="core", values="start_ps")
    # Each step's executions start within chip 1's drift (0.5 ms per odd step) of each other, not a
    # whole 10 ms execution apart as positional pairing would put them.
    assert ((steps[1] - steps[0]).abs() <= 1_500 * US).all()


def test_with_no_program_repeating_the_busiest_is_the_step(tmp_path):
    chips = [[Execution("jit_a", HIGH_ID, 0, 5 * US), Execution("jit_b", OTHER_HIGH_ID, 10 * US, 7 * US, op="b")]]
    _, report = _report(write_programs_capture(tmp_path, chips))
    assert report.summary.step_program == "jit_b" and report.summary.step_time.count == 1


@settings(max_examples=40, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(st.integers(2, 4), st.integers(2, 8), st.data())
def test_alignment_keeps_each_execution_with_its_peers(n_cores, n_steps, data):
    """Property: cores whose executions start less than half a period apart (each within +-24 % of
    it), some missing one at either end of the capture, align execution k with execution k, and
    only the executions every core ran are steps."""
    import pandas as pd

    from tpudiag.analysis.steps import aligned_executions

    period = 1_000 * US
    rows, present = [], []
    for core in range(n_cores):
        lo = data.draw(st.integers(0, 1))
        hi = n_steps - data.draw(st.integers(0, 1))
        present.append(set(range(lo, hi)))
        rows += [(core, k * period + data.draw(st.integers(-240 * US, 240 * US)), k) for k in range(lo, hi)]
    chosen = pd.DataFrame({"device": "d", "core": [r[0] for r in rows], "start_ps": [r[1] for r in rows],
                           "dur_ps": 500 * US})
    truth = {(r[0], r[1]): r[2] for r in rows}
    markers, left_out = aligned_executions(chosen)
    running = [p for p in present if p]  # a core that never ran the program is not one of its cores
    common = set.intersection(*running) if running else set()
    counts = [len(p) for p in present]
    first_ref = min(present[counts.index(max(counts))], default=0)  # the reference: lowest core with the most
    assert len(markers) == len(running) * len(common) and left_out == len(rows) - len(markers)
    for r in markers.itertuples():
        assert truth[(r.core, r.start_ps)] == r.step + first_ref


def _mods(rows):
    # (program_id, module, core, dur_ps): one row per execution, as `analysis.steps` reads them
    import pandas as pd
    return pd.DataFrame({"program_id": [r[0] for r in rows], "module": pd.Categorical([r[1] for r in rows]),
                         "core": [r[2] for r in rows], "dur_ps": [r[3] for r in rows]})


def test_step_program_table():
    from tpudiag.analysis.steps import step_program
    # Two executions on one core repeat: the step, though a one-off holds 10x its time.
    assert step_program(_mods([(5, "jit_f", 0, 50), (5, "jit_f", 0, 50), (9, "jit_init", 0, 1000)])) == (5, "jit_f")
    # Once on each of two cores is not a repeat: with none repeating, the most time wins.
    assert step_program(_mods([(5, "jit_f", 0, 50), (5, "jit_f", 1, 50), (9, "jit_init", 0, 1000)])) == (9, "jit_init")
    # Equal time: the lower id, then the name.
    assert step_program(_mods([(7, "jit_a", 0, 10), (7, "jit_a", 0, 10), (5, "jit_b", 0, 10), (5, "jit_b", 0, 10)])
                        ) == (5, "jit_b")
    assert step_program(_mods([(0, "jit_b", 0, 10), (0, "jit_b", 0, 10), (0, "jit_a", 0, 10), (0, "jit_a", 0, 10)])
                        ) == (0, "jit_a")


def test_no_executions_align_to_no_steps_with_an_integer_step_column():
    import pandas as pd
    from tpudiag.analysis.steps import aligned_executions
    empty = pd.DataFrame({"device": pd.Series([], dtype=str), "core": pd.Series([], dtype="int32"),
                          "start_ps": pd.Series([], dtype="int64"), "dur_ps": pd.Series([], dtype="int64")})
    markers, left_out = aligned_executions(empty)
    assert (len(markers), left_out, markers["step"].dtype) == (0, 0, np.int64)


def _executions(starts_by_core, dur=100):
    import pandas as pd
    rows = [(core, s) for core, starts in starts_by_core.items() for s in starts]
    return pd.DataFrame({"device": [f"/device:TPU:{c}" for c, _ in rows], "core": [c for c, _ in rows],
                         "start_ps": [s for _, s in rows], "dur_ps": [dur] * len(rows)})


@pytest.mark.parametrize(("starts_by_core", "dur", "kept", "left_out"), [
    # Reference core 0 every 1000 ps: an execution joins the nearest reference start when nearer than
    # half the median period (500). 10 -> step 0; 1400 -> step 1 (400 off); 2500 is exactly 500 off
    # step 2: not nearer, left out, and with it core 0's step 2 (not on every core).
    ({0: [0, 1000, 2000], 1: [10, 1400, 2500]}, 100, {(0, 0, 0), (1, 0, 10), (0, 1, 1000), (1, 1, 1400)}, 2),
    # Periods 1000 and 2000: median 1500, reach 750. 500 is midway between 0 and 1000: the later one.
    ({0: [0, 1000, 3000], 1: [500, 3000]}, 100, {(0, 1, 1000), (1, 1, 500), (0, 2, 3000), (1, 2, 3000)}, 1),
    # Two reference executions still have a period (1000, reach 500), whatever the executions last.
    ({0: [0, 1000], 1: [1300]}, 100, {(0, 1, 1000), (1, 1, 1300)}, 1),
    # Two executions of core 1 near step 1: the nearer one (50 off) is the step's.
    ({0: [0, 1000], 1: [1300, 1050]}, 100, {(0, 1, 1000), (1, 1, 1050)}, 2),
    # One execution per core, of no length, at the same time: the same step.
    ({0: [0], 1: [0]}, 0, {(0, 0, 0), (1, 0, 0)}, 0),
])
def test_aligned_executions_table(starts_by_core, dur, kept, left_out):
    from tpudiag.analysis.steps import aligned_executions
    markers, n_left_out = aligned_executions(_executions(starts_by_core, dur))
    assert set(zip(markers["core"], markers["step"], markers["start_ps"])) == kept
    assert n_left_out == left_out
