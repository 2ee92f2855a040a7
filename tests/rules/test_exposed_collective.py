"""exposed-collective (TPD101): positive, negative and near-miss captures, and XProf agreement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples
from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.rules import RulesConfig
from tpudiag.analysis.collective_windows import classify, collective_windows
from tpudiag.rules.exposed_collective import ASYNC_FLAGS, Options

US = sc.US


def _run(analysis, **options):
    config = RulesConfig(select=("exposed-collective",), options={"exposed-collective": options})
    findings, skipped = run_rules(analysis, config)
    assert skipped == []
    return findings


def test_sync_and_exposed_async_windows_are_measured(tmp_path: Path, snapshot):
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    findings = _run(analysis)
    by_kind = {("synchronous" if f.message.startswith("synchronous") else "async"): f for f in findings}
    sync, async_ = by_kind["synchronous"], by_kind["async"]
    # Sync all-reduce: 800 µs on the slower chip, every step (the step time is the slowest core's).
    assert sync.saving.ps == 800 * US and sync.saving.basis == "measured"
    assert "on v6e by default" in sync.message
    # Only an all-reduce is synchronous: the async-collective flags would not change it.
    assert ASYNC_FLAGS not in sync.fix and sync.fix.startswith("all-reduces stay synchronous at entry level")
    # Async: 410 (adjacent) + 20 (hidden) + 400 (partial, double suffix) µs per step.
    assert async_.saving.ps == 830 * US
    assert "6 exposed, 6 partial, 6 hidden" in async_.message
    assert "6 have double-suffix names" in async_.message
    assert "no compute is scheduled between start and done in 6 windows" in async_.fix
    assert sync.severity == async_.severity == Severity.MEDIUM  # 8.0 % and 8.3 % of the step: 3-10 %
    assert [f.saving.ps for f in findings] == sorted((f.saving.ps for f in findings), reverse=True)
    snapshot("exposed-collective", render_findings(findings))


def test_per_window_numbers(tmp_path: Path):
    windows = collective_windows(sc.analyse(sc.exposed_collectives(), tmp_path))
    w = windows[(windows["device"] == "/device:TPU:0") & (windows["step"] == 1)].set_index("name")
    assert w.loc["all-gather-start.1", ["span_ps", "exposed_ps", "klass"]].tolist() == [410 * US, 410 * US, "exposed"]
    assert w.loc["all-gather-start.2", ["span_ps", "exposed_ps", "klass"]].tolist() == [1020 * US, 20 * US, "hidden"]
    assert w.loc["all-gather-start.3.0", ["span_ps", "exposed_ps", "klass"]].tolist() == [1400 * US, 400 * US,
                                                                                         "partial"]
    assert bool(w.loc["all-gather-start.3.0", "double_suffix"]) and not bool(w.loc["all-gather-start.2",
                                                                                  "double_suffix"])
    assert w.loc["all-reduce.4", ["kind", "exposed_ps"]].tolist() == ["sync", 500 * US]
    # Invariant: exposed + covered = span, ratio in [0, 1].
    assert (windows["exposed_ps"] + windows["covered_ps"] == windows["span_ps"]).all()
    assert windows["overlap_ratio"].between(0, 1).all()


def test_windows_from_start_done_pairs_without_async_line(tmp_path: Path):
    # The same capture without an `Async XLA Ops` line: windows come from start/done pairs, and the
    # double-suffix pair still pairs (XProf's pairing would drop it).
    windows = collective_windows(sc.analyse(sc.exposed_collectives(async_line=False), tmp_path))
    assert set(windows.loc[windows["kind"] == "async", "source"]) == {"start/done pair"}
    assert (windows["name"] == "all-gather-start.3.0").sum() == 6
    assert windows.loc[windows["kind"] == "async", "exposed_ps"].sum() == 6 * 830 * US


def test_hidden_collectives_give_no_finding(tmp_path: Path):
    analysis = sc.analyse(sc.hidden_collectives(), tmp_path)
    assert _run(analysis) == []
    windows = collective_windows(analysis)
    assert set(windows["klass"]) == {"hidden"}


def test_near_miss_below_min_exposed_fraction(tmp_path: Path):
    # 90 µs exposed per 10 ms step = 0.9 %: under the default 1 %, reported once the option is lowered.
    analysis = sc.analyse(sc.barely_exposed(), tmp_path)
    assert _run(analysis) == []
    findings = _run(analysis, min_exposed_fraction=0.005)
    assert len(findings) == 1 and findings[0].saving.ps == 90 * US
    assert findings[0].severity == Severity.LOW


def test_classification_thresholds_are_inclusive():
    opts = Options().thresholds  # the rule's defaults, as the windows are classed with them

    assert classify(0.9, opts) == "hidden"
    assert classify(0.8999, opts) == "partial"
    assert classify(0.1, opts) == "exposed"
    assert classify(0.1001, opts) == "partial"
    mine = Options(hidden_threshold=0.7, exposed_threshold=0.2).thresholds  # the user's own, both of them
    assert classify(0.7, mine) == "hidden" and classify(0.2, mine) == "exposed" and classify(0.25, mine) == "partial"


def test_bad_thresholds_are_rejected_with_both_values():
    with pytest.raises(ValueError, match="exposed_threshold=0.5, hidden_threshold=0.4"):
        Options(hidden_threshold=0.4, exposed_threshold=0.5)


SYNC_GATHER = sc.OpDef("all-gather.5", "all-gather", bytes_accessed=1.0e7)


@pytest.mark.parametrize(("device_type", "peaks", "expect"), [
    ("TPU v6 Lite", (918.0, 1640.0), f"make the all-gathers asynchronous: compile with `{ASYNC_FLAGS}`"),
    ("TPU v5 lite", (197.0, 819.0), "overlap the all-gathers with independent compute"),  # v5e: async by default
    ("TPU v4", (275.0, 1200.0), "all-gathers synchronous on v4 by default: try"),
    ("TPU v5p", (459.0, 2765.0), "all-gathers synchronous on v5p by default: try"),
])
def test_sync_advice_follows_the_generation(tmp_path: Path, device_type, peaks, expect):
    # A synchronous all-gather next to the synchronous all-reduce: the flags are advised for the
    # all-gather only, and the all-reduce gets its own advice on every generation.
    def schedule(chip, step):
        return sc.exposed_collectives_schedule(chip, step) + [sc.Placed("all-gather.5", 7000 * US, 300 * US)]

    d = sc.design(sc.COLLECTIVE_OPS + (SYNC_GATHER,), schedule, device_type=device_type, peak_tflops=peaks[0],
                  peak_hbm_gbs=peaks[1])
    sync = [f for f in _run(sc.analyse(d, tmp_path)) if f.message.startswith("synchronous")][0]
    assert sync.saving.ps == 1100 * US  # 800 µs all-reduce + 300 µs all-gather on chip 1
    assert expect in sync.fix
    assert "; all-reduces stay synchronous at entry level even on v5e" in sync.fix


def _xprof_overlap(run: Path, tmp_path: Path) -> dict:
    xprof = shutil.which("xprof") or str(Path(sys.executable).with_name("xprof"))
    if not Path(xprof).exists():
        pytest.skip("the xprof CLI is not installed")
    copy = tmp_path / "xprof_copy"
    shutil.copytree(run, copy)  # xprof writes cache files next to the traces: give it a copy
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([xprof, "analyze_async_overlap", str(copy), "--top_k=1000", "--bypass_cache=True"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.mark.xprof
@pytest.mark.parametrize("async_line", [True, False], ids=["async-line", "start-done-pairs"])
def test_agrees_with_xprof_analyze_async_overlap(tmp_path: Path, async_line: bool):
    """Per-window spans, exposed time and class match `xprof analyze_async_overlap` where it applies.

    Where it does not (double-suffix names): with an `Async XLA Ops` line XProf counts their start
    and done ops as compute and reports the windows hidden; without one it does not pair them at
    all. tpudiag reports them partial (400 µs exposed) either way.
    """
    design = sc.exposed_collectives(async_line=async_line)
    doc = _xprof_overlap(sc.write_run(design, tmp_path / "ours"), tmp_path)
    theirs = {(r["plane"], r["name"], round(r["start_ps"])): r for r in doc["top_exposed"]}
    ours = collective_windows(sc.analyse(design, tmp_path / "again"))
    ours = ours[ours["kind"] == "async"]
    assert len(ours) == 18
    assert doc["summary"]["count"] == (18 if async_line else 12)
    compared = 0
    for w in ours.itertuples():
        r = theirs.get((w.device, w.name, w.start_ps))
        if w.double_suffix:
            assert w.klass == "partial" and w.exposed_ps == 400 * US
            if async_line:
                assert r["class"] == "hidden" and r["exposed_ps"] == 0 and r["span_ps"] == w.span_ps
            else:
                assert r is None
            continue
        assert (r["span_ps"], r["exposed_ps"], r["class"]) == (w.span_ps, w.exposed_ps, w.klass), w.name
        compared += 1
    assert compared == 12


# -- collectives inside a loop --------------------------------------------------------------------


def test_a_loop_around_the_collectives_hides_nothing(tmp_path: Path):
    """The enclosing `while` is a container, not compute: the windows inside keep their values,
    and the synchronous all-reduce nested one level down is still counted."""
    flat = collective_windows(sc.analyse(sc.exposed_collectives(), tmp_path / "flat"))
    looped = collective_windows(sc.analyse(sc.looped_collectives(), tmp_path / "loop"))
    cols = ["name", "kind", "span_ps", "exposed_ps", "klass"]
    assert looped[cols].values.tolist() == flat[cols].values.tolist()
    findings = _run(sc.analyse(sc.looped_collectives(), tmp_path / "again"))
    assert sorted(f.saving.ps for f in findings) == [800 * US, 830 * US]


def test_nesting_facts_per_device():
    """Containers have a deeper next event on their device; anything under a collective is inside it."""
    import numpy as np

    from tpudiag.analysis.collective_windows import nesting_facts

    # device 0: while(0) > [fusion(1), all-reduce(1) > fusion(2)]; device 1: a lone fusion at depth 0
    dev = np.array([0, 0, 0, 0, 1])
    start = np.array([0, 0, 10, 10, 0])
    depth = np.array([0, 1, 1, 2, 0])
    is_coll = np.array([False, False, True, False, False])
    has_child, in_coll = nesting_facts(dev, start, depth, is_coll)
    assert has_child.tolist() == [True, False, True, False, False]
    assert in_coll.tolist() == [False, False, False, True, False]


@pytest.mark.xprof
def test_xprof_counts_the_loop_as_covering_its_windows(tmp_path: Path):
    """The deliberate departure from XProf, documented in the rule: `analyze_async_overlap` counts
    the `while` op as compute and calls every window inside it hidden."""
    doc = _xprof_overlap(sc.write_run(sc.looped_collectives(), tmp_path / "ours"), tmp_path)
    assert doc["summary"]["count"] == 18 and doc["summary"]["hidden"] == 18 and doc["summary"]["exposed_ps"] == 0


# -- the compiled schedule says why ---------------------------------------------------------------

SCHEDULED_HLO = """HloModule jit_train_step, is_scheduled=true

ENTRY %main (p: f32[8]) -> f32[16] {
  %p = f32[8]{0} parameter(0)
  %all-gather-start.1 = (f32[8]{0}, f32[16]{0}) all-gather-start(f32[8]{0} %p), dimensions={0}
  %all-gather-done.1 = f32[16]{0} all-gather-done((f32[8]{0}, f32[16]{0}) %all-gather-start.1)
  %all-gather-start.2 = (f32[8]{0}, f32[16]{0}) all-gather-start(f32[8]{0} %p), dimensions={0}
  %fusion.2 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fc
  %all-gather-done.2 = f32[16]{0} all-gather-done((f32[8]{0}, f32[16]{0}) %all-gather-start.2)
  ROOT %all-reduce.4 = f32[16]{0} all-reduce(f32[16]{0} %all-gather-done.2), to_apply=%add
}
"""
# all-gather.1: start and done adjacent; all-gather.2: fusion.2 scheduled inside; all-reduce.4:
# issued synchronously at entry level. (all-gather.3.0 is not in this program.)


def test_compiled_schedule_explains_exposure(tmp_path: Path):
    from tpudiag.model.inputs import CompiledInputs, HloInput
    from tpudiag.parsers.hlo_text import parse_hlo_text

    program = parse_hlo_text(SCHEDULED_HLO)
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    findings, _ = run_rules(analysis, RulesConfig(select=("exposed-collective",)), CompiledInputs(hlo=(HloInput(program, "xla-dump"),)))
    sync = next(f for f in findings if f.message.startswith("synchronous"))
    async_ = next(f for f in findings if f.message.startswith("async"))
    assert "the compiled program issues `all-reduce.4` synchronously (the default on v6e)" in sync.message
    assert "`all-gather-start.1` start and finish with nothing scheduled between" in async_.message
    schedule = {e.subject: dict(e.values).get("schedule") for e in async_.evidence}
    assert schedule["all-gather-start.1"] == "adjacent in the schedule"
    assert schedule["all-gather-start.2"] == "1 op scheduled inside"
    assert schedule["all-gather-start.3.0"] is None
    # The savings are the trace's: the schedule explains, it does not change the measurement.
    assert (sync.saving.ps, async_.saving.ps) == (800 * US, 830 * US)


def test_schedule_from_the_hlo_proto_a_capture_embeds(tmp_path: Path):
    # The v5e MLP's real HloProto: its `async-collective-start` has `copy-done` and `fusion.47`
    # scheduled before `async-collective-done`. The trace names the same ops and leaves it exposed.
    proto = (sc.REPO / "tests" / "fixtures" / "dumps" / "v5e_mlp_train" / "module.pb").read_bytes()
    ops = (sc.COMPUTE, sc.OpDef("async-collective-start", "async-collective-start"),
           sc.OpDef("async-collective-done", "async-collective-done"))

    def schedule(chip, step):
        return [sc.Placed("fusion.1", 0, 1000 * US), sc.Placed("async-collective-start", 1000 * US, 10 * US),
                sc.Placed("async-collective-done", 1010 * US, 300 * US)]

    d = sc.design(ops, schedule, device_type="TPU v5 lite", peak_tflops=197.0, peak_hbm_gbs=819.0,
                  hlo_proto=proto)
    findings, _ = run_rules(sc.analyse(d, tmp_path), RulesConfig(select=("exposed-collective",)))
    (f,) = findings
    assert f.saving.ps == 310 * US
    rows = {e.subject: dict(e.values) for e in f.evidence}
    assert rows["async-collective-start"]["schedule"] == "2 ops scheduled inside"


def test_multi_host_saving_is_the_worst_core_of_any_host(tmp_path: Path):
    # Two hosts of 2 chips each; host1's all-reduce takes 1,200 µs: the step waits for it.
    def slow_host_schedule(chip, step):
        return [p if p.op != "all-reduce.4" else sc.Placed(p.op, p.offset_ps, 1200 * US)
                for p in sc.exposed_collectives_schedule(chip, step)]

    run = tmp_path / "plugins" / "profile" / "run"
    from tpudiag.writers.tpu_design import write_capture

    write_capture(sc.exposed_collectives(), run)
    write_capture(sc.design(sc.COLLECTIVE_OPS, slow_host_schedule, hostname="host1", first_chip=2), run)
    from tpudiag.analysis.profile_analysis import analyze
    from tpudiag.parsers.capture import load_capture

    findings = _run(analyze(load_capture(run, jobs=1)))
    sync = next(f for f in findings if f.message.startswith("synchronous"))
    assert sync.saving.ps == 1200 * US and sync.host == ""
    async_ = next(f for f in findings if f.message.startswith("async"))
    assert async_.saving.ps == 830 * US and "36 windows" in async_.message


@settings(max_examples=bounded_examples(15, 6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gaps=st.lists(st.integers(0, 400), min_size=3, max_size=3), inside=st.integers(0, 900),
       done=st.integers(1, 500))
def test_window_invariants(tmp_path_factory, gaps, inside, done):
    """For any placement: covered + exposed = span, 0 <= ratio <= 1, savings never exceed the step."""

    def schedule(chip, step):
        t = gaps[0] * US
        out = [sc.Placed("all-gather-start.1", t, 10 * US)]
        t += 10 * US + gaps[1] * US
        if inside:
            out.append(sc.Placed("fusion.1", t, inside * US))
            t += inside * US
        out.append(sc.Placed("all-gather-done.1", t + gaps[2] * US, done * US))
        return out

    analysis = sc.analyse(sc.design(sc.COLLECTIVE_OPS, schedule), tmp_path_factory.mktemp("w"))
    w = collective_windows(analysis)
    assert len(w) == 6
    assert (w["covered_ps"] + w["exposed_ps"] == w["span_ps"]).all()
    assert w["overlap_ratio"].between(0, 1).all()
    assert (w["covered_ps"] == inside * US).all()
    for f in _run(analysis, min_exposed_fraction=0.0):
        assert 0 < f.saving.ps <= sc.STEP


# -- GPU captures: NCCL/RCCL kernels against compute kernels on the GPU's other streams ------------

def test_gpu_collective_kernel_exposed_after_the_gemm(tmp_path: Path):
    from tests import gpu_captures as gc

    # 4 steps of 1 ms on 2 GPUs: a 600 µs gemm on the compute stream, then a 200 µs all-reduce on the
    # NCCL stream with nothing on any other stream: 200 µs exposed per step, 8 kernels exposed.
    analysis = sc.analyse_path(gc.write(gc.training(), tmp_path))
    (f,) = _run(analysis)
    assert f.saving.ps == 200 * US
    assert f.message.startswith("async NCCL collective kernels leave 200.0 µs per step exposed (20.0%")
    assert "8 kernels: 8 exposed, 0 partial, 0 hidden by compute on other streams" in f.message
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in f.fix and "xla_tpu" not in f.fix
    windows = collective_windows(analysis)
    assert set(windows["source"]) == {"kernel"} and set(windows["kind"]) == {"async"}
    assert windows["span_ps"].tolist() == [200 * US] * 8


def test_gpu_collective_kernel_hidden_by_a_gemm_on_another_stream(tmp_path: Path):
    from tests import gpu_captures as gc

    # The same all-reduce 100 µs into the 600 µs gemm: covered whole by the compute stream.
    analysis = sc.analyse_path(gc.write(gc.training(ar_at_us=100), tmp_path))
    assert _run(analysis) == []
    # Nothing exposed is nothing to report, even with no threshold on the exposed fraction.
    assert _run(analysis, min_exposed_fraction=0.0) == []
    windows = collective_windows(analysis)
    assert (windows["klass"] == "hidden").all() and (windows["exposed_ps"] == 0).all()


def test_gpu_collective_kernel_half_covered_is_partial(tmp_path: Path):
    from tests import gpu_captures as gc

    # Started 100 µs before the 600 µs gemm ends: 100 of its 200 µs covered, 100 µs exposed per step.
    (f,) = _run(sc.analyse_path(gc.write(gc.training(ar_at_us=500, step_us=1000), tmp_path)))
    assert f.saving.ps == 100 * US and "0 exposed, 8 partial, 0 hidden" in f.message


def test_the_steps_with_most_exposure_come_first_and_step_0_counts(tmp_path: Path):
    # Steps numbered from 0; in step 1 chip 1's all-reduce takes 900 µs instead of 800.
    def schedule(chip, step):
        return [sc.Placed(p.op, p.offset_ps, 900 * US) if p.op == "all-reduce.4" and chip == 1 and step == 1 else p
                for p in sc.exposed_collectives_schedule(chip, step)]

    d = sc.design(sc.COLLECTIVE_OPS, schedule, first_step=0)
    sync = next(f for f in _run(sc.analyse(d, tmp_path)) if f.message.startswith("synchronous"))
    steps = [(e.subject, dict(e.values)) for e in sync.evidence if e.subject.startswith("step ")]
    assert steps == [("step 1", {"exposed (worst core)": "900.0 µs"}), ("step 0", {"exposed (worst core)": "800.0 µs"})]
    # Mean over the 3 steps of the worst core: (800 + 900 + 800) / 3.
    assert sync.saving.ps == round((800 + 900 + 800) * US / 3)


def test_the_wait_for_a_straggler_is_taken_once_from_the_synchronous_collectives(tmp_path: Path):
    # The straggler-host capture (4 v5p hosts; the fast hosts wait 500 µs per step for host2 in the
    # all-reduce), with an adjacent all-gather opening every step on every host: 10 + 390 µs exposed,
    # taken from fusion.60's time so the steps keep their length.
    from dataclasses import replace

    def with_gather(schedule):
        def placed(chip, step):
            first, *rest = schedule(chip, step)
            return [sc.Placed("all-gather-start.1", 0, 10 * US), sc.Placed("all-gather-done.1", 10 * US, 390 * US),
                    sc.Placed(first.op, 400 * US, first.dur_ps - 400 * US), *rest]
        return placed

    designs = [replace(d, ops=d.ops + (sc.AG1_START, sc.AG1_DONE), schedule=with_gather(d.schedule))
               for d in sc.straggler_hosts()]
    findings = _run(sc.analyse_hosts(designs, tmp_path))
    by_kind = {f.message.split()[0]: f for f in findings}
    # The 500 µs wait comes off the synchronous all-reduce (2,607 µs on the fast hosts) ...
    assert by_kind["synchronous"].saving.ps == pytest.approx(sc.STRAGGLER_AR_SLOW, rel=0.01)
    assert "500.0 µs more per step is the other hosts waiting for straggler `host2`" in by_kind["synchronous"].message
    # ... and only once: the all-gather keeps its 400 µs.
    assert by_kind["async"].saving.ps == 400 * US and "straggler" not in by_kind["async"].message


def test_a_synchronous_collective_under_the_threshold_does_not_stop_the_async_finding(tmp_path: Path):
    # The all-reduce takes 50 µs of the 10 ms step (0.5 %, under `min_exposed_fraction`); the async
    # windows still expose 830 µs.
    def schedule(chip, step):
        return [sc.Placed(p.op, p.offset_ps, 50 * US) if p.op == "all-reduce.4" else p
                for p in sc.exposed_collectives_schedule(chip, step)]

    (f,) = _run(sc.analyse(sc.design(sc.COLLECTIVE_OPS, schedule), tmp_path))
    assert f.message.startswith("async collective windows leave 830.0 µs per step exposed")


# Two families of each kind. Synchronous: all-reduce.4 500 µs and all-gather.6 300 µs (the larger one
# last by name). Async: collective-permute.2 adjacent (10 + 400 µs exposed) and all-gather.1 around
# fusion.2's 1,000 µs (hidden; its start and done, 20 µs, exposed).
TWO_FAMILY_OPS = (sc.COMPUTE, sc.COMPUTE2, sc.AG1_START, sc.AG1_DONE, sc.AR,
                  sc.OpDef("all-gather.6", "all-gather", bytes_accessed=1.0e7),
                  sc.OpDef("collective-permute-start.2", "collective-permute", bytes_accessed=1.0e7),
                  sc.OpDef("collective-permute-done.2", "collective-permute", bytes_accessed=1.0e7))


def two_family_schedule(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.1", 0, 2000 * US),
            sc.Placed("collective-permute-start.2", 2000 * US, 10 * US),
            sc.Placed("collective-permute-done.2", 2010 * US, 400 * US),
            sc.Placed("all-gather-start.1", 2500 * US, 10 * US), sc.Placed("fusion.2", 2510 * US, 1000 * US),
            sc.Placed("all-gather-done.1", 3510 * US, 10 * US),
            sc.Placed("all-reduce.4", 4000 * US, 500 * US), sc.Placed("all-gather.6", 4500 * US, 300 * US)]


def test_two_families_of_one_kind_are_told_largest_first(tmp_path: Path):
    sync, async_ = _run(sc.analyse(sc.design(TWO_FAMILY_OPS, two_family_schedule), tmp_path))
    # 500 + 300 µs of the 10 ms step: 8.0 %.
    assert sync.message.startswith("synchronous collectives leave 800.0 µs per step exposed (8.0% of the 10.00 ms "
                                   "step): all-reduce 500.0 µs, all-gather 300.0 µs;")
    assert sync.ops == ("all-reduce.4", "all-gather.6")
    # Evidence: one row per family, by name; then the ops by exposure.
    assert [e.subject for e in sync.evidence[:4]] == ["family all-gather", "family all-reduce", "all-reduce.4",
                                                     "all-gather.6"]
    assert dict(sync.evidence[0].values)["exposed/step"] == "300.0 µs"
    assert dict(sync.evidence[1].values)["exposed/step"] == "500.0 µs"
    # 2 chips x 3 steps: 6 windows per op; the permute's 6 exposed, the all-gather's 6 hidden.
    assert async_.message == ("async collective windows leave 430.0 µs per step exposed (4.3% of the 10.00 ms "
                              "step): collective-permute 410.0 µs, all-gather 20.0 µs; 12 windows: 6 exposed, "
                              "0 partial, 6 hidden")
    assert async_.fix.startswith("no compute is scheduled between start and done in 6 windows: start the "
                                 "collective-permute, all-gather earlier")
    assert [e.subject for e in async_.evidence[:2]] == ["family all-gather", "family collective-permute"]
    assert async_.ops == ("collective-permute-start.2", "all-gather-start.1")


def test_the_exposed_fraction_threshold_is_inclusive(tmp_path: Path):
    # The synchronous all-reduce exposes 800 µs of each 10 ms step: 8 % exactly.
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    findings = _run(analysis, min_exposed_fraction=0.08)
    assert sorted(f.message.split()[0] for f in findings) == ["async", "synchronous"]
    assert {f.host for f in findings} == {"host0"}
    # The ops named are the most exposed first, at most `max_evidence_rows`: all-gather.1's 410 µs windows
    # before all-gather.3.0's 400 and all-gather.2's 20.
    async_ = next(f for f in _run(analysis, max_evidence_rows=1) if f.message.startswith("async"))
    assert async_.ops == ("all-gather-start.1",)


def test_without_steps_the_capture_is_the_step(tmp_path: Path):
    # No Steps line and no module executions: each chip's three periods are one span, 26.65 ms per core
    # on average; chip 1's three 800 µs all-reduces are 2.40 ms of it (9.0 %), the async windows 3 x 830 µs.
    findings = _run(sc.analyse(sc.exposed_collectives(steps_line=False, modules_line=False), tmp_path))
    by_kind = {f.message.split()[0]: f for f in findings}
    assert by_kind["synchronous"].message.startswith(
        "synchronous collectives leave 2.40 ms exposed (9.0% of the capture): all-reduce 2.40 ms;")
    assert by_kind["async"].message.startswith(
        "async collective windows leave 2.49 ms exposed (9.3% of the capture): all-gather 2.49 ms;")
    assert by_kind["async"].saving.explanation == ("largest exposed collective time on any core over the capture, "
                                                   "averaged over 1 step (no steps: whole capture)")


def test_the_default_is_named_only_where_collectives_are_synchronous_by_default(tmp_path: Path):
    # v5e runs all-gathers async by default: the compiled program's synchronous all-reduce is stated
    # without "(the default on v5e)".
    from tpudiag.model.inputs import CompiledInputs, HloInput
    from tpudiag.parsers.hlo_text import parse_hlo_text

    d = sc.exposed_collectives(device_type="TPU v5 lite", peak_tflops=197.0, peak_hbm_gbs=819.0)
    compiled = CompiledInputs(hlo=(HloInput(parse_hlo_text(SCHEDULED_HLO), "xla-dump"),))
    findings, _ = run_rules(sc.analyse(d, tmp_path), RulesConfig(select=("exposed-collective",)), compiled)
    sync = next(f for f in findings if f.message.startswith("synchronous"))
    assert sync.message.endswith(": all-reduce 800.0 µs; the compiled program issues `all-reduce.4` synchronously")


def test_a_gpu_family_fully_hidden_is_not_named(tmp_path: Path):
    import dataclasses

    from tests import gpu_captures as gc

    # The GPU training capture plus an all-gather kernel 100 µs into each step's 600 µs gemm, 100 µs long:
    # covered whole by the compute stream. Only the all-reduce's 200 µs are exposed; 16 kernels in all.
    c = gc.training()
    gpus = tuple(dataclasses.replace(g, kernels=g.kernels + tuple(
        gc.Kernel("ncclDevKernel_AllGather_RING_LL", s + 100, 100, "all-gather-start.2", gc.NCCL) for s, _ in g.steps))
        for g in c.gpus)
    (f,) = _run(sc.analyse_path(gc.write(dataclasses.replace(c, gpus=gpus), tmp_path)))
    assert f.message.startswith("async NCCL collective kernels leave 200.0 µs per step exposed (20.0% of the 1.00 ms "
                                "step): all-reduce 200.0 µs; 16 kernels: 8 exposed, 0 partial, 8 hidden")
    assert f.fix.endswith("or start the all-reduce earlier")
    # A GPU has no ICI: no link figures in the evidence.
    assert [k for e in f.evidence for k, _ in e.values if k == "ICI"] == []


def test_only_exposed_windows_are_called_adjacent(tmp_path: Path):
    # A program in which both all-gathers start and finish with nothing between; in the trace
    # all-gather.2's window is hidden by fusion.2 (another run of the program, say): only all-gather.1 is named.
    from tpudiag.model.inputs import CompiledInputs, HloInput
    from tpudiag.parsers.hlo_text import parse_hlo_text

    both_adjacent = SCHEDULED_HLO.replace(
        "  %fusion.2 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fc\n", "")
    compiled = CompiledInputs(hlo=(HloInput(parse_hlo_text(both_adjacent), "xla-dump"),))
    findings, _ = run_rules(sc.analyse(sc.exposed_collectives(), tmp_path), RulesConfig(select=("exposed-collective",)),
                            compiled)
    async_ = next(f for f in findings if f.message.startswith("async"))
    assert "; `all-gather-start.1` start and finish with nothing scheduled between;" in async_.message
    schedule = {e.subject: dict(e.values).get("schedule") for e in async_.evidence}
    assert schedule["all-gather-start.2"] == "adjacent in the schedule"


def all_reduce_only(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.1", 0, 2000 * US), sc.Placed("all-reduce.4", 2000 * US, 500 * US)]


def all_gather_only(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.1", 0, 2000 * US), sc.Placed("all-gather.6", 2000 * US, 300 * US)]


def test_family_rows_are_by_name_whatever_host_has_which(tmp_path: Path):
    # Two hosts: host0 runs only a synchronous all-reduce (500 µs), host1 only a synchronous all-gather
    # (300 µs). The evidence's family rows read all-gather, then all-reduce.
    ops = (sc.COMPUTE, sc.AR, sc.OpDef("all-gather.6", "all-gather", bytes_accessed=1.0e7))
    designs = [sc.design(ops, all_reduce_only, hostname="host0"),
               sc.design(ops, all_gather_only, hostname="host1", first_chip=2)]
    (sync,) = _run(sc.analyse_hosts(designs, tmp_path))
    assert [e.subject for e in sync.evidence if e.subject.startswith("family")] == ["family all-gather",
                                                                                    "family all-reduce"]
