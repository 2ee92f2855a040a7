"""device-idle (TPD105): idle per step and host with its host-plane cause; near miss and healthy stay quiet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.analysis.idle import host_cause, host_idle, idle_tables
from tpudiag.model.findings import Severity
from tpudiag.rules import RulesConfig
from tpudiag.rules.device_idle import FIXES, Options

US = sc.US


def _run(analysis, **options):
    findings, _ = run_rules(analysis, RulesConfig(select=("device-idle",), options={"device-idle": options}))
    return findings


def test_decode_waits_30_percent_between_executions(tmp_path: Path, snapshot):
    # The v6e decode capture: 30 % of each execution period waiting for the next dispatch.
    findings = _run(sc.analyse(sc.decode_v6e(), tmp_path))
    assert len(findings) == 1
    f = findings[0]
    assert f.severity == Severity.HIGH and f.saving.basis == "measured"
    assert f.saving.ps == pytest.approx(sc.DECODE_GAP, rel=0.05)
    # The rule's period (start to next start) and idle (least idle core) are not the header's step
    # (one execution, the slowest core's) or the breakdown's idle: the message says both inline.
    assert "of each 970.3 µs from one `jit_decode_step` start to the next (30.0%" in f.message
    assert "the step time, 679.2 µs, is one execution" in f.message
    assert "the breakdown's idle, 0 ps, is inside executions, mean over cores): host-bound" in f.message
    assert f.fix == FIXES["host-bound"]
    values = dict(f.evidence[0].values)
    assert values["steps"] == "9"  # the last execution has no next one: its period is unknown
    snapshot("device-idle", render_findings(findings))


@pytest.mark.parametrize(("span", "cause"), [
    ("TransferFromDevice", "synchronisation"), ("Iterator::GetNext", "input"),
    ("PjRtClient::Compile", "compilation"), ("$train.py:120 log_metrics", "host-bound")])
def test_each_cause_gets_its_fix(tmp_path: Path, span, cause):
    # 1.5 ms idle per 10 ms step (15 %: high), 90 % of it under a host span of the cause.
    a = sc.analyse(sc.idle_training(1500 * US, span), tmp_path)
    (f,) = _run(a)
    assert host_cause(span) == cause and f.fix == FIXES[cause]
    assert f.severity == Severity.HIGH
    assert f.saving.ps == pytest.approx(1500 * US, rel=0.05)
    (h,) = host_idle(idle_tables(a.digests))
    assert h.causes_ps[cause] == pytest.approx(1350 * US, rel=0.01)
    assert h.causes_ps["unexplained"] == pytest.approx(150 * US, rel=0.01)


def test_idle_plus_busy_is_the_period(tmp_path: Path):
    a = sc.analyse(sc.idle_training(700 * US, "TransferFromDevice"), tmp_path)
    t = idle_tables(a.digests).steps
    busy = a.steps.set_index(["core", "step"])["busy_ps"]
    for r in t.itertuples():
        assert r.idle_ps + busy[(r.core, r.step)] == r.period_ps
    # 7 % of the step: medium (3 % to 15 %).
    assert _run(a)[0].severity == Severity.MEDIUM


def test_near_miss_and_healthy_have_no_finding(tmp_path: Path):
    near = sc.analyse(sc.idle_training(150 * US, "TransferFromDevice"), tmp_path / "near")  # 1.5 % < 2 %
    assert _run(near) == []
    assert len(_run(near, min_idle_share=0.01)) == 1  # the near miss is measured, just under the bar
    findings, _ = run_rules(sc.analyse(sc.healthy(), tmp_path / "healthy"))
    assert [f for f in findings if f.severity >= Severity.LOW] == []


def test_without_a_host_plane_the_cause_is_unexplained(tmp_path: Path):
    (f,) = _run(sc.analyse(sc.decode_v6e(host_spans=None), tmp_path))
    assert "cause not visible on the host plane" in f.message and f.fix == FIXES["unexplained"]


def test_options_validate():
    with pytest.raises(ValueError, match="min_idle_share"):
        Options(min_idle_share=1.5)


@pytest.mark.xprof
def test_xprof_check_host_boundness_on_an_idle_capture(tmp_path: Path):
    """xprof never answers HOST_BOUND without performance counters (docs/xprof-differences.md); its idle
    ratio counts every step's op time against all steps but the last. Both differences asserted."""
    run = sc.write_run(sc.idle_training(6000 * US, "PjitFunction(train_step)"), tmp_path / "x")
    exe = Path(sys.executable).with_name("xprof")
    proc = subprocess.run([str(exe), "check_host_boundness", str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "NOT_HOST_BOUND" and any("MXU Idleness" in r for r in out["reasons"])
    m = out["metrics"]
    n, busy = 5, sc.IDLE_STEP - 6000 * US
    assert m["number_of_steps"] == n - 1
    assert m["idle_time_ratio_percent"] == pytest.approx(100 * (1 - n * busy / ((n - 1) * sc.IDLE_STEP)), abs=0.1)
    (f,) = _run(sc.analyse(sc.idle_training(6000 * US, "PjitFunction(train_step)"), tmp_path / "ours2"))
    assert "(60.0%, inside steps): host-bound" in f.message


def test_mostly_unexplained_idle_still_names_the_causes_its_evidence_lists():
    """The bundled CPU capture: 128.4 µs of its 179.4 µs idle has no host span over it, 50.6 µs is
    host-bound. The message said only "cause not visible on the host plane" beside that evidence."""
    from pathlib import Path

    import tpudiag

    capture = Path(__file__).resolve().parents[2] / "examples" / "captures" / "cpu_jax_profiler"
    [f] = [f for f in tpudiag.diagnose(capture).findings if f.rule == "device-idle"]
    values = dict(f.evidence[0].values)
    assert (values["unexplained"], values["host-bound"]) == ("128.4 µs", "50.6 µs")
    assert "cause not visible on the host plane for 71.6% of it; the rest: host-bound 50.6 µs" in f.message


def test_main_cause_counts_device_infeed_as_input_and_prefers_a_named_cause_on_a_tie():
    from tpudiag.analysis.idle import HostIdle
    from tpudiag.rules.device_idle import main_cause

    def host(causes, io_ps=0.0):
        return HostIdle("h", 3, 1000.0, 500.0, 0.0, 0.0, io_ps, causes, 1, 500)

    assert main_cause(host({"host-bound": 200.0, "input": 100.0})) == "host-bound"
    assert main_cause(host({"host-bound": 200.0, "input": 100.0}, io_ps=150.0)) == "input"  # 100 + 150 > 200
    assert main_cause(host({"unexplained": 300.0, "compilation": 300.0})) == "compilation"
    assert main_cause(host({"compilation": 300.0, "unexplained": 300.0})) == "compilation"
    assert main_cause(host({"unexplained": 300.0, "compilation": 299.0})) == "unexplained"


def test_a_training_step_with_its_idle_under_a_device_to_host_copy_reads_whole(tmp_path: Path):
    # By design: 2 chips, 5 steps of 10 ms, each ending in 1.5 ms of idle (15 %); the host sits in
    # `TransferFromDevice` for the last 90 % of it (1.35 ms), nothing covers the first 150 µs. Every core
    # and step alike, so the period is the step time and the least idle core's idle the mean's: no note.
    (f,) = _run(sc.analyse(sc.idle_training(1500 * US, "TransferFromDevice"), tmp_path))
    assert f.message == ("the TensorCores idle 1.50 ms of each 10.00 ms step (15.0%, inside steps): synchronisation "
                         "(device-to-host waits) (90.0% of it)")
    assert f.host == "host0" and f.saving.ps == 1500 * US
    assert f.saving.explanation == "idle per step on `host0`, the host with the most; an upper bound"
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("host0", (("idle per step", "1.50 ms"), ("share", "15.0%"), ("steps", "5"), ("synchronisation", "1.35 ms"),
                   ("unexplained", "150.0 µs"), ("most idle step", "1 (1.50 ms)"))),
        # The three steps with the most idle, all equal: the first three, in step order.
        ("step 1", (("idle", "1.50 ms"), ("share", "15.0%"))), ("step 2", (("idle", "1.50 ms"), ("share", "15.0%"))),
        ("step 3", (("idle", "1.50 ms"), ("share", "15.0%")))]
    assert [e.subject for e in _run(sc.analyse(sc.idle_training(1500 * US, "TransferFromDevice"), tmp_path),
                                    max_steps_shown=1)[0].evidence] == ["host0", "step 1"]


# -- the step and idle notes, called directly --------------------------------------------------------

def _noted(step_source=None, *, idle=(100, 200, 100, 200), durs=(1000, 900, 1200, 1100)):
    """One host, cores 0 and 1, steps 0 and 1 (rows: core 0 step 0, core 1 step 0, core 0 step 1, core 1
    step 1), times in µs."""
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.model.profile import Platform

    zeros = [0] * 4
    steps = pd.DataFrame({"host": ["h0"] * 4, "core": [0, 1, 0, 1], "step": [0, 0, 1, 1],
                          "dur_ps": [d * US for d in durs], "idle_ps": [i * US for i in idle], "compute_ps": zeros,
                          "collective_ps": zeros, "io_ps": zeros, "host_transfer_ps": zeros})
    sources = {} if step_source is None else {"h0": step_source}
    return SimpleNamespace(platform=Platform.TPU, steps=steps, profile=SimpleNamespace(hosts=[object()]),
                           step_sources=sources)


def _host(period_us, idle_us):
    from tpudiag.analysis.idle import HostIdle

    return HostIdle("h0", 2, period_us * US, idle_us * US, 0.0, 0.0, 0.0, {}, 0, 0)


def test_period_text_names_the_module_whose_executions_are_the_steps():
    from tpudiag.model.profile import StepKind, StepSource
    from tpudiag.rules.device_idle import period_text

    executions = StepSource(StepKind.XLA_MODULES, module="jit_decode_step")
    assert period_text(_noted(executions), _host(970.3, 0)) == "each 970.3 µs from one `jit_decode_step` start to the next"
    assert period_text(_noted(StepSource(StepKind.STEPS_LINE)), _host(10_000, 0)) == "each 10.00 ms step"
    assert period_text(_noted(None), _host(10_000, 0)) == "each 10.00 ms step"  # a host without a step source


def test_basis_note_says_where_the_rules_step_and_idle_are_not_the_headers():
    from tpudiag.model.profile import StepKind, StepSource
    from tpudiag.rules.device_idle import basis_note

    marked = StepSource(StepKind.STEPS_LINE)
    # The header's step: the slowest core per step, 1,000 and 1,200 µs, mean 1.10 ms; the breakdown's idle:
    # the mean of 100, 200, 100, 200 µs, 150 µs.
    assert basis_note(_noted(marked), _host(1000, 100)) == (
        "; the step time, 1.10 ms, is the slowest core's over every host; idle of the least idle core; the "
        "breakdown's idle, 150.0 µs, is the mean over cores")
    # Within half a percent of the step (5.5 µs) the period is the step; within 1 % the idle is the breakdown's.
    assert basis_note(_noted(marked), _host(1095, 150)) == ""
    assert basis_note(_noted(marked), _host(1105, 150)) == ""
    assert basis_note(_noted(marked), _host(1094, 150)).startswith("; the step time, 1.10 ms, is the slowest")
    assert basis_note(_noted(marked), _host(1106, 150)).startswith("; the step time, 1.10 ms, is the slowest")
    # Exactly half a percent of the 1.1 ms step apart (5.5 µs), exactly 1 % of the 150 µs idle apart: no note.
    assert basis_note(_noted(marked), _host(1094.5, 150)) == ""
    assert basis_note(_noted(marked), _host(1100, 148.5)) == ""
    # 1.49 µs apart: more than 1 % of the smaller idle (1.4851 µs), not of the larger (1.5 µs).
    assert basis_note(_noted(marked), _host(1100, 148.51)) == ""
    assert basis_note(_noted(marked), _host(1100, 148)) == (
        "; idle of the least idle core; the breakdown's idle, 150.0 µs, is the mean over cores")
    # Module executions: the header's step is one execution, the breakdown's idle is inside executions.
    executions = StepSource(StepKind.XLA_MODULES, module="jit_decode_step")
    assert basis_note(_noted(executions), _host(1100, 100)) == (
        "; the step time, 1.10 ms, is one execution; idle of the least idle core; the breakdown's idle, 150.0 µs, "
        "is inside executions, mean over cores")
    # No step source for the host: not executions.
    assert basis_note(_noted(None), _host(1100, 150)) == ""
    # No steps at all: no header step or breakdown to differ from.
    bare = _noted(marked)
    bare.steps = bare.steps.iloc[:0]
    assert basis_note(bare, _host(1100, 150)) == ""


# -- the rule over host idle figures given by hand ---------------------------------------------------

def _idle(host, idle_us, *, period_us=10_000.0, io_us=0.0, lead_us=0.0, between_us=0.0, causes=None, n_steps=5,
          worst_step=2, worst_idle_us=None):
    from tpudiag.analysis.idle import CAUSES, HostIdle

    spans = {c: 0.0 for c in (*CAUSES, "unexplained")} | {c: us * US for c, us in (causes or {}).items()}
    worst = idle_us if worst_idle_us is None else worst_idle_us
    return HostIdle(host, n_steps, period_us * US, idle_us * US, between_us * US, lead_us * US, io_us * US, spans,
                    worst_step, round(worst * US))


def _check_idle(monkeypatch, hosts, *, steps=(), whole=False, executions=False, apart=(), platform=None,
                **options):
    """device-idle's `check` over `hosts` (what `analysis.idle.host_idle` would give) and `steps`, the
    per-step rows of the idle table as (host, step, idle µs, period µs); the analysis holds no step table
    (so no note on the header's figures)."""
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.model.profile import Platform
    from tpudiag.rules import device_idle as di

    table = pd.DataFrame([{"host": h, "step": s, "idle_ps": i * US, "period_ps": p * US} for h, s, i, p in steps],
                         columns=["host", "step", "idle_ps", "period_ps"])
    tables = SimpleNamespace(steps=table, whole_capture=whole, executions=executions)
    monkeypatch.setattr(di, "idle_tables", lambda digests: tables)
    monkeypatch.setattr(di, "host_idle", lambda t: list(hosts))
    empty = pd.DataFrame(columns=["host", "core", "step", "dur_ps", "compute_ps", "collective_ps", "io_ps",
                                  "host_transfer_ps", "idle_ps"])
    profile = SimpleNamespace(hosts=[SimpleNamespace(host=h.host, host_clock_apart=h.host in apart) for h in hosts])
    analysis = SimpleNamespace(digests={}, profile=profile, platform=platform or Platform.TPU, step_sources={},
                               steps=empty)
    return di.check(SimpleNamespace(analysis=analysis), Options(**options))


def test_the_host_with_the_most_idle_speaks_for_several(monkeypatch):
    # host0: 2 ms of a 10 ms step idle, 1.5 ms of it under a host-bound span (75 %); host1: 1 ms idle plus
    # 0.5 ms of device infeed; host2 0.1 ms (1 %, under the 2 % bar).
    hosts = [_idle("host1", 1000, io_us=500, causes={"input": 400, "unexplained": 600}),
             _idle("host0", 2000, causes={"host-bound": 1500, "unexplained": 500}),
             _idle("host2", 100, causes={"unexplained": 100})]
    steps = [("host0", 1, 1500, 10_000), ("host0", 2, 2500, 10_000), ("host0", 3, 2000, 10_000),
             ("host1", 1, 9000, 10_000)]
    (f,) = _check_idle(monkeypatch, hosts, steps=steps)
    assert f.message == ("`host0` idle 2.00 ms of each 10.00 ms step (20.0%, inside steps): host-bound (Python or "
                         "dispatch) (75.0% of it); 2 of 3 hosts idle at least 2.0%")
    assert f.host == "" and f.saving.ps == 2000 * US and f.severity == Severity.HIGH
    assert f.saving.explanation == "idle per step on `host0`, the host with the most; an upper bound"
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("host0", (("idle per step", "2.00 ms"), ("share", "20.0%"), ("steps", "5"), ("host-bound", "1.50 ms"),
                   ("unexplained", "500.0 µs"), ("most idle step", "2 (2.00 ms)"))),
        # host1's infeed counts toward its idle (1.5 ms), not toward its share of idle alone (10 %).
        ("host1", (("idle per step", "1.00 ms"), ("share", "10.0%"), ("steps", "5"),
                   ("device infeed/outfeed", "500.0 µs"), ("input", "400.0 µs"), ("unexplained", "600.0 µs"),
                   ("most idle step", "2 (1.00 ms)"))),
        # host0's steps, most idle first (host1's step 1 is not host0's).
        ("step 2", (("idle", "2.50 ms"), ("share", "25.0%"))), ("step 3", (("idle", "2.00 ms"), ("share", "20.0%"))),
        ("step 1", (("idle", "1.50 ms"), ("share", "15.0%")))]
    assert f.fix == FIXES["host-bound"]
    assert [e.subject for e in _check_idle(monkeypatch, hosts, steps=steps, max_steps_shown=1)[0].evidence] == [
        "host0", "host1", "step 2"]


def test_idle_and_infeed_exactly_at_min_idle_share_count(monkeypatch):
    # 150 µs idle and 50 µs infeed of a 10 ms step: 2 % exactly, the default bar; medium from 3 %, so low.
    # The 50 µs of infeed (input) are less than the 150 µs no host span covers, and named beside them.
    (f,) = _check_idle(monkeypatch, [_idle("host0", 150, io_us=50, causes={"unexplained": 150})])
    assert f.severity == Severity.LOW and f.saving.ps == 200 * US and f.host == "host0"
    assert f.message == ("the TensorCores idle 200.0 µs of each 10.00 ms step (2.0%, inside steps): cause not visible "
                         "on the host plane for 75.0% of it; the rest: device infeed/outfeed 50.0 µs")
    (f,) = _check_idle(monkeypatch, [_idle("host0", 50, io_us=150, causes={"unexplained": 50})])
    assert f.message == ("the TensorCores idle 200.0 µs of each 10.00 ms step (2.0%, inside steps): input-bound "
                         "(75.0% of it)")
    assert _check_idle(monkeypatch, [_idle("host0", 149, io_us=50, causes={"unexplained": 149})]) == []
    # A host without a period (no step ended) has no share: left out.
    assert _check_idle(monkeypatch, [_idle("host0", 150, period_us=0.0)]) == []


def test_idle_before_each_steps_first_op_is_called_out(monkeypatch):
    # 2 ms idle per step, 1 ms of it (half, the bar) before the step's first op.
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, lead_us=1000, causes={"input": 2000})])
    assert f.message.endswith("input-bound (100.0% of it); 1.00 ms of it at the start of each step, before its first "
                              "op (the host preparing the step: data loading?)")
    assert dict(f.evidence[0].values)["before the step's first op"] == "1.00 ms"
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, lead_us=999, causes={"input": 2000})])
    assert "at the start of each step" not in f.message
    assert dict(f.evidence[0].values)["before the step's first op"] == "999.0 µs"
    # Under 1 % of the idle (20 µs) the lead is a leftover, not a row.
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, lead_us=19, causes={"input": 2000})])
    assert "before the step's first op" not in dict(f.evidence[0].values)
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, lead_us=20, causes={"input": 2000})])
    assert dict(f.evidence[0].values)["before the step's first op"] == "20.0 µs"


def test_module_executions_count_the_wait_between_them(monkeypatch):
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, lead_us=1500, between_us=1800,
                                           causes={"host-bound": 2000})], executions=True)
    # Between executions there is no step start to be "before": no lead note, the between row instead.
    assert "between and inside module executions" in f.message and "at the start of each step" not in f.message
    values = dict(f.evidence[0].values)
    assert values["between executions"] == "1.80 ms" and "before the step's first op" not in values


def test_a_capture_without_steps_is_one_window_per_core(monkeypatch):
    from tpudiag.model.profile import Platform

    hosts = [_idle("host0", 2000, period_us=8000, lead_us=1500, causes={"synchronisation": 2000}, n_steps=1)]
    steps = [("host0", 0, 2000, 8000)]
    (f,) = _check_idle(monkeypatch, hosts, steps=steps, whole=True, platform=Platform.GPU)
    assert f.message == ("the GPUs idle 2.00 ms of 8.00 ms (25.0%, over the capture: no steps, so each GPU's first to "
                         "last op): synchronisation (device-to-host waits) (100.0% of it)")
    # One window: no step count, no lead, no most idle step, no per-step rows.
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("host0", (("idle in the capture", "2.00 ms"), ("share", "25.0%"), ("synchronisation", "2.00 ms")))]
    assert f.saving.explanation == "idle in the capture on `host0`, the host with the most; an upper bound"


def test_unexplained_idle_on_a_host_clock_apart_says_why(monkeypatch):
    host = _idle("host0", 2000, causes={"unexplained": 2000})
    (f,) = _check_idle(monkeypatch, [host], apart=("host0",))
    assert f.message.endswith("(20.0%, inside steps): cause not known: the host plane is on another clock than the "
                              "device planes")
    assert f.fix == FIXES["clock apart"]
    (f,) = _check_idle(monkeypatch, [host])
    assert f.message.endswith("(20.0%, inside steps): cause not visible on the host plane")
    assert f.fix == FIXES["unexplained"]
    # A named cause on a host clock apart is still that cause.
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, causes={"input": 2000})], apart=("host0",))
    assert f.fix == FIXES["input"]


def test_mostly_unexplained_idle_names_each_cause_from_one_percent(monkeypatch):
    # 2 ms idle: 1.48 ms unexplained (74 %), 480 µs compilation, 20 µs (exactly 1 %) input, 19 µs host-bound.
    host = _idle("host0", 2000, causes={"unexplained": 1480, "compilation": 480, "input": 20, "host-bound": 19})
    (f,) = _check_idle(monkeypatch, [host])
    assert f.message.endswith("cause not visible on the host plane for 74.0% of it; the rest: compilation 480.0 µs, "
                              "input 20.0 µs")


def test_mostly_unexplained_idle_names_the_device_infeed_beside_it(monkeypatch):
    # 2 ms idle (1.5 ms unexplained, 500 µs host-bound) and 1 ms of device infeed: 3 ms waited, of which
    # the unexplained 1.5 ms is the largest cause (input = 1 ms) and half; the infeed is the rest too.
    host = _idle("host0", 2000, io_us=1000, causes={"unexplained": 1500, "host-bound": 500})
    (f,) = _check_idle(monkeypatch, [host])
    assert f.message.endswith("cause not visible on the host plane for 50.0% of it; the rest: host-bound 500.0 µs, "
                              "device infeed/outfeed 1.00 ms")


def test_a_zero_length_step_has_no_row(monkeypatch):
    steps = [("host0", 1, 0, 0), ("host0", 2, 2000, 10_000)]
    (f,) = _check_idle(monkeypatch, [_idle("host0", 2000, causes={"input": 2000})], steps=steps)
    assert [e.subject for e in f.evidence] == ["host0", "step 2"]


def test_infeed_counts_toward_the_worst_host_and_its_own_cause_only(monkeypatch):
    # host1 waits 1 ms idle plus 1.5 ms of infeed (2.5 ms), host0 2 ms idle: host1 is the worst, listed first.
    # host0's main cause is host-bound (1.5 ms of its 2.3 ms with 300 µs infeed: 65.2 %), its infeed no part of it.
    hosts = [_idle("host0", 2000, io_us=300, causes={"host-bound": 1500, "unexplained": 500}),
             _idle("host1", 1000, io_us=1500, causes={"unexplained": 1000})]
    (f,) = _check_idle(monkeypatch, hosts)
    assert f.message.startswith("`host1` idle 2.50 ms of each 10.00 ms step (25.0%, inside steps): input-bound (60.0% "
                                "of it)")
    assert [e.subject for e in f.evidence] == ["host1", "host0"]
    (f,) = _check_idle(monkeypatch, hosts[:1] + [_idle("host1", 100, causes={"unexplained": 100})])
    assert f.message.startswith("`host0` idle 2.30 ms of each 10.00 ms step (23.0%, inside steps): host-bound (Python "
                                "or dispatch) (65.2% of it)")


def test_two_hosts_are_named_and_infeed_alone_has_no_lead(monkeypatch):
    # host0 never idles but waits 300 µs per step on infeed (3 %): no idle, so nothing before a first op.
    hosts = [_idle("host0", 0, io_us=300, lead_us=0), _idle("host1", 0)]
    (f,) = _check_idle(monkeypatch, hosts)
    assert f.message == "`host0` idle 300.0 µs of each 10.00 ms step (3.0%, inside steps): input-bound (100.0% of it)"
    assert f.evidence[0].values == (("idle per step", "0 ps"), ("share", "0.0%"), ("steps", "5"),
                                    ("device infeed/outfeed", "300.0 µs"), ("compilation", "0 ps"),
                                    ("synchronisation", "0 ps"), ("input", "0 ps"), ("host-bound", "0 ps"),
                                    ("unexplained", "0 ps"), ("most idle step", "2 (0 ps)"))


def test_a_cause_from_one_percent_of_the_idle_has_a_row(monkeypatch):
    # 2 ms idle: input 20 µs is 1 % exactly (a row), host-bound 19 µs under it (none).
    host = _idle("host0", 2000, causes={"unexplained": 1961, "input": 20, "host-bound": 19})
    values = dict(_check_idle(monkeypatch, [host])[0].evidence[0].values)
    assert values["input"] == "20.0 µs" and "host-bound" not in values


def test_steps_of_equal_idle_are_shown_in_step_order(monkeypatch):
    # 40 steps alternating 600 and 500 µs of idle: the five most idle are steps 2, 4, 6, 8 and 10.
    steps = [("host0", s, 600 if s % 2 == 0 else 500, 10_000) for s in range(1, 41)]
    (f,) = _check_idle(monkeypatch, [_idle("host0", 550, causes={"input": 550})], steps=steps, max_steps_shown=5)
    assert [e.subject for e in f.evidence[1:]] == ["step 2", "step 4", "step 6", "step 8", "step 10"]


def test_steps_after_a_zero_length_one_still_have_rows(monkeypatch):
    # No idle anywhere (the host waits on infeed); step 1's marker has no length and comes first among equals.
    steps = [("host0", 1, 0, 0), ("host0", 2, 0, 10_000), ("host0", 3, 0, 10_000)]
    (f,) = _check_idle(monkeypatch, [_idle("host0", 0, io_us=300)], steps=steps)
    assert [e.subject for e in f.evidence] == ["host0", "step 2", "step 3"]
