"""step-time-variance (TPD108): periodic slow steps and what differs in them; near miss and healthy quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.rules import RulesConfig
from tpudiag.rules.step_time_variance import Options, period

US = sc.US


def _run(analysis, **options):
    findings, _ = run_rules(analysis, RulesConfig(select=("step-time-variance",),
                                                  options={"step-time-variance": options}))
    return findings


def test_a_checkpoint_every_fifth_step(tmp_path: Path, snapshot):
    (f,) = _run(sc.analyse(sc.periodic_checkpoint(), tmp_path))
    # Designed: steps 5, 10, 15, 20 take 10 + 6 + 2 = 18 ms; the others 10 ms.
    assert "4 of 20 steps take 18.00 ms against a median of 10.00 ms (every 5 steps" in f.message
    ev = {e.subject: dict(e.values) for e in f.evidence}
    assert ev["step 5"]["time"] == "18.00 ms"
    assert "`copy.71` only there (+6.00 ms)" in f.message and "+2.00 ms idle" in f.message
    assert f.ops == ("copy.71",) and "asynchronous" in f.fix
    # 4 x 8 ms of excess over 20 steps: 1.6 ms per step on average, 13.8 % of the 11.6 ms mean: medium.
    assert f.saving.ps == pytest.approx(1600 * US, rel=0.05) and f.saving.basis == "measured"
    assert f.severity == Severity.MEDIUM
    snapshot("step-time-variance", render_findings([f]))


def test_near_miss_and_healthy(tmp_path: Path):
    # Every 5th step 12 ms (1.2x the median, CV 0.08): under both bars.
    near = sc.analyse(sc.periodic_checkpoint(copy_ps=1500 * US, idle_ps=500 * US), tmp_path / "near")
    assert _run(near) == []
    assert len(_run(near, outlier_factor=1.15)) == 1
    healthy = sc.analyse(sc.periodic_checkpoint(every=0), tmp_path / "healthy")
    findings, _ = run_rules(healthy)
    assert [f for f in findings if f.severity >= Severity.LOW] == []


def test_period_needs_three_evenly_spaced_outliers():
    assert period([10, 20, 30]) == 10
    assert period([10, 20]) is None and period([3, 7, 20]) is None and period([4, 5, 6]) is None


def test_options_validate():
    with pytest.raises(ValueError, match="outlier_factor"):
        Options(outlier_factor=1.0)


def test_a_first_step_that_compiles_is_not_called_periodic_host_work(tmp_path: Path):
    # Regression (a CPU `tpudiag run`): the jit's first call compiled in step 1 and the fix said
    # "move periodic host work (logging, metrics, refills) off the step", whose precondition fails.
    # By design: step 1 takes 50 ms, 40 ms of them idle while the host is in `backend_compile`.
    (f,) = _run(sc.analyse(sc.first_step_compiles(), tmp_path))
    assert "1 of 10 steps take 50.00 ms" in f.message
    assert "+40.00 ms idle (40.00 ms of it compiling)" in f.message
    assert f.fix.startswith("the slow steps compile") and "periodic" not in f.fix


def test_idle_without_compilation_keeps_the_periodic_host_work_fix(tmp_path: Path):
    # Near miss: the same 40 ms wait with the host in a span that is not compilation.
    design = sc.first_step_compiles()
    hosted = sc.design(design.ops, design.schedule, n_steps=10, step_ps_for=design.step_ps_for, n_chips=1,
                       host_spans=lambda step: [sc.HostSpan("main/1", "save_metrics", 0, sc.COMPILE_PS)]
                       if step == 1 else [])
    (f,) = _run(sc.analyse(hosted, tmp_path))
    assert "compiling" not in f.message and "periodic host work" in f.fix


# -- helpers called directly ------------------------------------------------------------------------

def test_period_of_outlier_steps_by_hand():
    assert period([5, 10, 15, 20]) == 5 and period([30, 10, 20]) == 10  # sorted first
    assert period([0, 2, 4]) == 2  # the shortest interval that is a period: every other step
    assert period([10, 20, 30, 45]) is None  # one gap differs
    assert period([1, 2, 3, 4]) is None  # consecutive steps are a run, not a period
    assert period([]) is None and period([7]) is None


def test_op_time_by_step_keeps_the_steps_and_drops_time_outside_them():
    import pandas as pd
    from types import SimpleNamespace

    worst = pd.DataFrame({"step": [-1, 0, 0, 3], "name": ["copy.1", "fusion.1", "copy.1", "fusion.1"],
                          "host": ["h", "h", "h", "h"], "self_ps": [9.0, 1.0, 2.0, 3.0]}, index=[10, 11, 12, 13])
    from tpudiag.rules.step_time_variance import _op_time_by_step

    got = _op_time_by_step(SimpleNamespace(per_step=SimpleNamespace(op_step_worst=worst)))
    # Step -1 (outside every step) dropped, step 0 kept; only the three columns, numbered from 0.
    assert got.to_dict("list") == {"step": [0, 0, 3], "name": ["fusion.1", "copy.1", "fusion.1"],
                                   "self_ps": [1.0, 2.0, 3.0]}
    assert list(got.index) == [0, 1, 2]
    outside = SimpleNamespace(per_step=SimpleNamespace(op_step_worst=worst[worst["step"] < 0]))
    empty = _op_time_by_step(outside)
    assert empty.empty and list(empty.columns) == ["step", "name", "self_ps"]


def test_compile_excess_by_hand(monkeypatch):
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.rules import step_time_variance as stv

    # Per step, the worst core's compiling idle: step 1 40 (cores 40 and 10), step 2 6, step 3 4, step 4 0.
    steps = pd.DataFrame({"step": [1, 1, 2, 2, 3, 4], "core": [0, 1, 0, 1, 0, 0],
                          "compilation_ps": [40.0, 10.0, 5.0, 6.0, 4.0, 0.0]})
    monkeypatch.setattr(stv, "idle_tables", lambda digests: SimpleNamespace(steps=steps))
    a = SimpleNamespace(digests={})
    assert stv._compile_excess(a, [1]) == pytest.approx(40 - (6 + 4 + 0) / 3)
    assert stv._compile_excess(a, [1, 2]) == pytest.approx((40 + 6) / 2 - (4 + 0) / 2)  # 23 - 2
    assert stv._compile_excess(a, [1, 2, 3, 4]) == pytest.approx(12.5)  # no other step: nothing to subtract
    assert stv._compile_excess(a, [4]) == 0.0  # compiles less than the others: no excess
    quiet = steps.assign(compilation_ps=0.0)
    monkeypatch.setattr(stv, "idle_tables", lambda digests: SimpleNamespace(steps=quiet))
    assert stv._compile_excess(a, [9]) == 0.0  # no outlier step in the table
    monkeypatch.setattr(stv, "idle_tables", lambda digests: SimpleNamespace(steps=steps.iloc[:0]))
    assert stv._compile_excess(a, [1]) == 0.0  # no idle table (no steps)
