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
    assert f.fix == ("the slow steps compile (a jit's first call, or a new shape or static argument): leave warm-up "
                     "out of the measured steps (`tpudiag run --steps N..M` past it) and keep shapes fixed so no later "
                     "step recompiles")


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


# -- the rule on step tables built by hand -------------------------------------------------------------

def _check_steps(monkeypatch, times_us, extra_ops=None, *, idle_us=None, coll_us=None, compile_us=None,
                 **options):
    """The rule over one host and core whose steps 1, 2, ... last `times_us` (µs), with `idle_us` and
    `coll_us` (per step, µs; none by default) of idle and collective time; `extra_ops` maps a step to the
    (op, µs) it runs besides `fusion.1`, which fills the rest of the step. `compile_us`: per step, the idle
    the host plane shows compiling (no host plane by default)."""
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.rules import step_time_variance as stv

    n = len(times_us)
    idle_us, coll_us = idle_us or [0] * n, coll_us or [0] * n
    steps = pd.DataFrame({"host": ["h0"] * n, "core": [0] * n, "step": list(range(1, n + 1)),
                          "dur_ps": [round(t * US) for t in times_us], "idle_ps": [round(t * US) for t in idle_us],
                          "collective_ps": [round(t * US) for t in coll_us]})
    rows = []
    for step, t in enumerate(times_us, start=1):
        extra = (extra_ops or {}).get(step, [])
        busy = t - idle_us[step - 1] - coll_us[step - 1]
        rows += [(step, "fusion.1", round((busy - sum(us for _, us in extra)) * US))]
        rows += [(step, name, round(us * US)) for name, us in extra]
    worst = pd.DataFrame(rows, columns=["step", "name", "self_ps"])
    compiling = (pd.DataFrame() if compile_us is None else
                 pd.DataFrame({"step": steps["step"], "compilation_ps": [round(t * US) for t in compile_us]}))
    monkeypatch.setattr(stv, "idle_tables", lambda digests: SimpleNamespace(steps=compiling))
    analysis = SimpleNamespace(steps=steps, per_step=SimpleNamespace(op_step_worst=worst), digests={})
    return stv.check(SimpleNamespace(analysis=analysis), Options(**options))


def test_a_step_exactly_at_the_outlier_factor_is_an_outlier(monkeypatch):
    # 29 steps of 10 ms and one of 15 ms: 1.5x the median, the factor itself. The spread alone would not
    # report it: mean 10.167 ms, std 0.897 ms, CV 0.088 under 0.1.
    (f,) = _check_steps(monkeypatch, [10_000] * 29 + [15_000])
    assert f.message == ("1 of 30 steps take 15.00 ms against a median of 10.00 ms (steps 30; CV 0.09): "
                         "`fusion.1` longer (+5.00 ms)")
    # 5 ms of excess over 30 steps: 166.7 µs per step, 1.6 % of the mean step: low.
    assert f.saving.ps == round(5000 * US / 30) and f.severity == Severity.LOW
    assert _check_steps(monkeypatch, [10_000] * 29 + [14_999]) == []


def test_a_spread_exactly_at_max_cv_is_quiet_and_beyond_it_the_slowest_tenth_stands_for_it(monkeypatch):
    # Steps alternate 8 and 12 ms: mean 10, standard deviation (over all steps) 2, CV 0.2 exactly; no
    # step reaches 1.5x the 10 ms median.
    times = [8_000, 12_000] * 5
    assert _check_steps(monkeypatch, times, max_cv=0.2) == []
    (f,) = _check_steps(monkeypatch, times, max_cv=0.19)
    # The slowest tenth and every step tied with it: the five 12 ms steps, every other one. Their excess
    # over the other steps' median (8 ms, not the 10 ms median of all): 5 x 4 ms over 10 steps, 2 ms per
    # step, 20 % of the 10 ms mean: high.
    assert f.message == ("5 of 10 steps take 12.00 ms against a median of 10.00 ms (every 2 steps; CV 0.20): "
                         "`fusion.1` longer (+4.00 ms)")
    assert f.saving.ps == 2000 * US and f.severity == Severity.HIGH
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("steps", (("median", "10.00 ms"), ("CV", "0.20"), ("outliers", "5"), ("period", "2"))),
        ("step 2", (("time", "12.00 ms"), ("x median", "1.20"))), ("step 4", (("time", "12.00 ms"), ("x median", "1.20"))),
        ("step 6", (("time", "12.00 ms"), ("x median", "1.20"))),
        ("fusion.1", (("outlier steps", "12.00 ms"), ("other steps", "8.00 ms"), ("extra", "4.00 ms")))]
    assert f.fix == "compare a slow step with a normal one in the trace viewer; look for contention at those steps"


def test_a_spread_of_steps_mostly_at_one_time_names_the_slow_one_not_every_step(monkeypatch):
    # Regression: 19 steps of 10 ms and one of 14.9 ms (under 1.5x): CV 0.104 (mean 10.245 ms, std 1.066
    # ms) is over 0.1. The 90th percentile of these times is 10 ms, so the slowest tenth was every step:
    # "20 of 20 steps take 10.24 ms against a median of 10.00 ms ...: `fusion.1` only there (+10.24 ms)".
    (f,) = _check_steps(monkeypatch, [10_000] * 19 + [14_900])
    assert f.message == ("1 of 20 steps take 14.90 ms against a median of 10.00 ms (steps 20; CV 0.10): "
                         "`fusion.1` longer (+4.90 ms)")
    assert f.saving.ps == round(4900 * US / 20)  # 245 µs per step
    # The spread in one fast step (8, 12, 12, 12, 12 ms: CV 0.14), none slower than the 12 ms median:
    # nothing to report.
    assert _check_steps(monkeypatch, [8_000, 12_000, 12_000, 12_000, 12_000]) == []


def test_min_steps(monkeypatch):
    # 8, 12, 12, 8 ms (CV 0.2): the 12 ms steps stand for the spread, but 5 steps are needed by default.
    assert _check_steps(monkeypatch, [8_000, 12_000, 12_000, 8_000]) == []
    assert len(_check_steps(monkeypatch, [8_000, 12_000, 12_000, 8_000], min_steps=4)) == 1
    assert len(_check_steps(monkeypatch, [8_000, 12_000, 12_000, 8_000, 8_000])) == 1  # 12 ms: 1.5x the median


def test_what_differs_in_the_slow_steps_from_a_twentieth_of_their_excess(monkeypatch):
    # Steps alternate 8 and 12 ms (the spread case above): the slow steps are 4 ms over the others. Each
    # slow step also runs copy.2 (500 µs), copy.3 (200 µs, exactly a twentieth of the 4 ms) and copy.4
    # (100 µs); fusion.1 fills the rest, 11.2 ms against 8 ms.
    extra = {s: [("copy.2", 500), ("copy.3", 200), ("copy.4", 100)] for s in (2, 4, 6, 8, 10)}
    (f,) = _check_steps(monkeypatch, [8_000, 12_000] * 5, extra, max_cv=0.19)
    # Largest first; above a twentieth only, so copy.3 and copy.4 are not named.
    assert f.message.endswith(": `fusion.1` longer (+3.20 ms); `copy.2` only there (+500.0 µs)")
    assert f.ops == ("fusion.1", "copy.2")
    assert f.fix == "the slow steps run extra work: make it asynchronous (async checkpointing, eval elsewhere) or rarer"
    assert f.evidence[-1].values == (("outlier steps", "500.0 µs"), ("other steps", "0 ps"), ("extra", "500.0 µs"))
    (f,) = _check_steps(monkeypatch, [8_000, 12_000] * 5, extra, max_cv=0.19, max_differences=1)
    assert f.ops == ("fusion.1",) and f.message.endswith(": `fusion.1` longer (+3.20 ms)")


SLOW7 = (1, 2, 3, 4, 6, 9, 13)  # no fixed interval


def _slow(steps, slow, normal, n=20):
    return [slow if s in steps else normal for s in range(1, n + 1)]


def test_more_idle_and_collectives_in_the_slow_steps(monkeypatch):
    # 20 steps of 10 ms; steps 1, 2, 3, 4, 6, 9 and 13 take 20 ms: 10 ms over the others, so differences
    # count from 500 µs. Slow steps idle 3 ms (1 ms of it compiling) and spend 2 ms in collectives; the others
    # 1 ms and 1 ms; fusion.1 fills the rest (15 against 8 ms).
    times = _slow(SLOW7, 20_000, 10_000)
    kw = dict(idle_us=_slow(SLOW7, 3000, 1000), coll_us=_slow(SLOW7, 2000, 1000))
    (f,) = _check_steps(monkeypatch, times, compile_us=_slow(SLOW7, 1000, 0), **kw)
    # Mean 13.5 ms, standard deviation 4.77 ms: CV 0.35. 7 x 10 ms over 20 steps: 3.5 ms per step, 26 % of the mean.
    assert f.message == ("7 of 20 steps take 20.00 ms against a median of 10.00 ms (steps 1, 2, 3, 4, 6, 9, …; CV "
                         "0.35): `fusion.1` longer (+7.00 ms); +2.00 ms idle (1.00 ms of it compiling); +1.00 ms in "
                         "collectives")
    assert f.saving.ps == 3500 * US and f.severity == Severity.HIGH
    assert f.evidence[0].values == (("median", "10.00 ms"), ("CV", "0.35"), ("outliers", "7"), ("period", "none"))
    assert f.fix == "the device waits in the slow steps: move periodic host work (logging, metrics, refills) off the step"
    # 500 µs of compiling is a twentieth exactly: not named.
    (f,) = _check_steps(monkeypatch, times, compile_us=_slow(SLOW7, 500, 0), **kw)
    assert "; +2.00 ms idle; +1.00 ms in collectives" in f.message
    # Compiling decides the fix from half the 10 ms the slow steps take longer: 5 ms exactly is not yet.
    (f,) = _check_steps(monkeypatch, times, compile_us=_slow(SLOW7, 5000, 0), **kw)
    assert "(5.00 ms of it compiling)" in f.message and f.fix.startswith("the device waits in the slow steps")
    (f,) = _check_steps(monkeypatch, times, compile_us=_slow(SLOW7, 5001, 0), **kw)
    assert f.fix.startswith("the slow steps compile")


def test_idle_and_collectives_exactly_a_twentieth_more_are_not_named(monkeypatch):
    # Six slow steps of 20 ms (listed whole): 1.5 ms idle and 1.5 ms in collectives against 1 ms and 1 ms in
    # the others, 500 µs more each, a twentieth of the 10 ms exactly. Mean 13 ms, std 4.58 ms: CV 0.35.
    six = SLOW7[:6]
    (f,) = _check_steps(monkeypatch, _slow(six, 20_000, 10_000), idle_us=_slow(six, 1500, 1000),
                        coll_us=_slow(six, 1500, 1000))
    assert f.message == ("6 of 20 steps take 20.00 ms against a median of 10.00 ms (steps 1, 2, 3, 4, 6, 9; CV 0.35): "
                         "`fusion.1` longer (+9.00 ms)")
    assert f.fix == "compare a slow step with a normal one in the trace viewer; look for contention at those steps"
    # The same idle everywhere is no difference, however large.
    (f,) = _check_steps(monkeypatch, _slow(six, 20_000, 10_000), idle_us=[2000] * 20)
    assert "idle" not in f.message


def test_an_op_of_no_time_in_the_other_steps_runs_only_in_the_slow_ones(monkeypatch):
    # copy.2 has rows in every step but takes time only in the slow ones (2 ms there).
    extra = {s: [("copy.2", 2000 if s in SLOW7 else 0)] for s in range(1, 21)}
    (f,) = _check_steps(monkeypatch, _slow(SLOW7, 20_000, 10_000), extra)
    assert "`fusion.1` longer (+8.00 ms); `copy.2` only there (+2.00 ms)" in f.message
    (f,) = _check_steps(monkeypatch, _slow(SLOW7, 20_000, 10_000), extra, max_differences=1)
    assert [e.subject for e in f.evidence] == ["steps", "step 1", "step 2", "step 3", "fusion.1"]
