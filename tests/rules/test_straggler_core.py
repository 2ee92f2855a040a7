"""straggler-core (TPD111): the slow core, the ops behind it; across hosts; near miss, healthy and a slow host quiet."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.model.profile import Platform
from tpudiag.rules import RulesConfig
from tpudiag.rules.straggler_core import Options

US = sc.US


def _run(analysis, *names, **options):
    names = names or ("straggler-core",)
    findings, _ = run_rules(analysis, RulesConfig(select=names, options={"straggler-core": options}))
    return findings


def test_one_slow_core_and_the_op_behind_it(tmp_path: Path, snapshot):
    # Chip 3's fusion.62 takes 500 µs longer (893 -> 1,393 µs); the other three wait 500 µs longer in
    # the all-reduce, so every step ends together and step lengths alone cannot tell the cores apart.
    (f,) = _run(sc.analyse_hosts(sc.straggler_cores(), tmp_path))
    assert f.severity == Severity.MEDIUM and f.saving.basis == "measured"  # 500 µs of ~10 ms: 5 %
    assert f.saving.ps == pytest.approx(sc.CORE_EXTRA, rel=0.01)
    assert f.message.startswith("`TPU:3` works ") and "more than the other 3 cores" in f.message
    assert f.ops == ("fusion.62",)  # the only op slower there; the all-reduce is shorter, not longer
    q = {(x.subject, x.name): x.value for x in f.quantities}
    assert q[("/device:TPU:3", "extra work per step (ps)")] == pytest.approx(sc.CORE_EXTRA, rel=0.01)
    assert q[("fusion.62", "extra per step (ps)")] == pytest.approx(sc.CORE_EXTRA, rel=0.01)
    ev = {e.subject: dict(e.values) for e in f.evidence}
    assert ev["fusion.62"]["ratio"] == "1.56x" and ev["fusion.62"]["extra/step"] == "500.0 µs"
    assert ev["fusion.62"]["category"] == "convolution fusion"  # the design's matmul fusion
    assert "TPU:3" in f.fix
    snapshot("straggler-core", render_findings([f]))


def test_a_slow_core_on_another_host_names_the_host_and_straggler_host_defers(tmp_path: Path):
    # 2 hosts x 4 chips; chip 1 of host1 is slow and, not in lockstep, its steps end 500 µs later: host1's
    # step time (its slowest core's) lags, which straggler-host's own test finds, but the lag is one
    # core's, so the one finding is the core's.
    from tpudiag.analysis.host_compare import find_straggler, host_stats

    a = sc.analyse_hosts(sc.straggler_cores(slow=(1, 1), n_hosts=2, lockstep=False), tmp_path)
    assert find_straggler(host_stats(a), 0.03, 3.0).host == "host1"
    findings = _run(a, "straggler-core", "straggler-host")
    assert [(f.rule, f.host) for f in findings] == [("straggler-core", "host1")]
    assert findings[0].message.startswith("`TPU:1` on `host1` works ")
    assert "the other 7 cores on every host" in findings[0].message


def test_a_slow_host_is_straggler_hosts_finding_not_a_cores(tmp_path: Path):
    # Every chip of host2 is slow: no core is slower than its own host's other cores.
    a = sc.analyse_hosts(sc.straggler_hosts(), tmp_path)
    findings = _run(a, "straggler-core", "straggler-host")
    assert [(f.rule, f.host) for f in findings] == [("straggler-host", "host2")]
    b = sc.analyse_hosts(sc.straggler_cores(slow=None, n_hosts=2, whole_host=1), tmp_path / "sync")
    assert _run(b) == []


def test_near_miss_inside_the_noise_band_and_healthy(tmp_path: Path):
    # 200 µs over 7.39 ms of work (2.7 %) is inside the 3 % band (222 µs); a 2 % band finds it.
    near = sc.analyse_hosts(sc.straggler_cores(extra_ps=200 * US), tmp_path / "near")
    assert _run(near) == []
    assert [f.ops for f in _run(near, min_lag_fraction=0.02)] == [("fusion.62",)]
    healthy = sc.analyse_hosts(sc.straggler_cores(slow=None), tmp_path / "healthy")
    assert _run(healthy) == []


def test_the_bundled_example_names_tpu3_and_its_fusions():
    # examples/make_example_capture.py runs chip 3's `fusion.*` ops at 95 % speed: 21.62 ms of work per
    # step against 20.54 ms on the others (busy - collective time of the steps table, by hand).
    import tpudiag

    d = tpudiag.diagnose(sc.REPO / "examples" / "captures" / "train_v6e_4chip")
    (f,) = [f for f in d.findings if f.rule == "straggler-core"]
    assert f.message.startswith("`TPU:3` works 21.62 ms per step, 1.08 ms")
    assert f.saving.ps == pytest.approx(1.078e9, rel=0.01)
    assert f.ops and all(name.startswith("fusion.") for name in f.ops)
    assert d.report.hosts[0].slowest_core == "/device:TPU:3"


def test_options_validate():
    with pytest.raises(ValueError, match="max_ops_shown"):
        Options(max_ops_shown=0)


def test_gpus_without_steps_compare_their_work_over_the_capture(tmp_path: Path):
    from tests import gpu_captures as gc

    # 4 GPUs, 4 iterations, no step markers; GPU 1's gemm takes 100 µs longer each time (700 vs 600
    # µs): 400 µs more work over the capture, and the all-reduces make the others wait for it.
    capture = gc.training(n_gpus=4, ar_at_us=100, slow_gpu=1, slow_extra_us=100, with_steps=False)
    (f,) = _run(sc.analyse_path(gc.write(capture, tmp_path)))
    # Each GPU's span, first op to last: 3.6 ms (the last gemm ends 600 µs into the fourth 1 ms step), 3.7 ms
    # on GPU 1; mean 3.625 ms, of which 400 µs is 11.0 %.
    assert f.message.startswith("`GPU:1` works 2.80 ms over the capture, 400.0 µs (11.0% of the capture's mean span "
                                "per core)")
    assert "more than the other 3 GPUs (median 2.40 ms): its ops take longer there: `gemm_fusion_dot.1` +400.0 µs" \
        in f.message
    assert f.saving.ps == 400 * US and "the others wait for it at the next collective" in f.saving.explanation
    assert "nvidia-smi" in f.fix


def test_gpus_without_collectives_save_nothing(tmp_path: Path):
    from tests import gpu_captures as gc

    # The same GPUs with the all-reduces taken out: nothing synchronises them, so none waits.
    capture = gc.training(n_gpus=4, ar_at_us=100, slow_gpu=1, slow_extra_us=100, with_steps=False)
    capture = dataclasses.replace(capture, gpus=tuple(
        dataclasses.replace(g, kernels=tuple(k for k in g.kernels if k.stream != gc.NCCL)) for g in capture.gpus))
    (f,) = _run(sc.analyse_path(gc.write(capture, tmp_path)))
    assert f.saving.ps == 0 and "no collective makes the others wait" in f.saving.explanation
    assert f.message.endswith("no collective in the capture, so no other GPU waits for it")


# -- helpers called directly ------------------------------------------------------------------------

def test_fix_for_work_only_the_slow_core_runs():
    from tpudiag.analysis.core_balance import OpExtra
    from tpudiag.rules.straggler_core import _fix

    only = [OpExtra("fusion.9", "loop fusion", 300.0, 0.0, 300.0), OpExtra("copy.2", "copy", 100.0, 0.0, 100.0)]
    tpu = SimpleNamespace(platform=Platform.TPU, gpu=None)
    assert _fix("`TPU:3`", only, tpu, "cores", "the step") == (
        "`TPU:3` runs work the other cores do not (`fusion.9`, `copy.2`): spread it over them or move it out of the "
        "step")
    slower = [OpExtra("fusion.9", "loop fusion", 300.0, 200.0, 100.0), *only[1:]]
    assert _fix("`TPU:3`", slower, tpu, "cores", "the step") == (
        "check `TPU:3`: its health, clocks and thermal throttling (`tpu-info`); the same ops run faster on the "
        "other cores")
    assert _fix("`TPU:3`", [], tpu, "cores", "the step").startswith("check `TPU:3`: ")


def test_others_median_and_signed_times():
    from tpudiag.analysis.core_balance import CoreWork
    from tpudiag.rules.straggler_core import _others, _signed, core_label

    cores = [CoreWork("h", f"/device:TPU:{i}", i, 3, w, 0.0, 10.0) for i, w in enumerate((1.0, 2.0, 10.0, 4.0))]
    assert _others(cores, cores[2]) == 2.0  # median of 1, 2, 4
    assert _others(cores, cores[0]) == 4.0  # median of 2, 10, 4
    alone = cores[:1]
    assert _others(alone, alone[0]) == 1.0  # no others: itself
    assert _signed(1_000_000.0) == "+1.0 µs" and _signed(-1_000_000.0) == "-1.0 µs" and _signed(0.0) == "+0 ps"
    assert core_label("/device:TPU:3") == "TPU:3" and core_label("TPU:3") == "TPU:3"


# -- the rule over core work figures given by hand ---------------------------------------------------

def _core(host, i, work_us, *, std_us=10.0, step_us=10_000.0, n_steps=5):
    from tpudiag.analysis.core_balance import CoreWork

    return CoreWork(host, f"/device:TPU:{i}", i, n_steps, work_us * US, std_us * US, step_us * US)


def _check_cores(monkeypatch, cores, slow, extras, *, whole=False, synchronised=True, hosts=("host0",), **options):
    """straggler-core's `check` with `cores` (what `core_work` gives; `capture_core_work` when `whole`), the
    slow ones `slow` as (core, reference µs, band µs) and `extras` the ops behind each, by device."""
    import pandas as pd

    from tpudiag.analysis.core_balance import SlowCore
    from tpudiag.rules import straggler_core as sc_rule
    from tpudiag.rules.base import RuleContext

    found = [SlowCore(c, ref * US, band * US, ref * US) for c, ref, band in slow]
    monkeypatch.setattr(sc_rule, "core_work", lambda steps: [] if whole else list(cores))
    monkeypatch.setattr(sc_rule, "capture_core_work", lambda op_cores, step_ps: list(cores))
    monkeypatch.setattr(sc_rule, "slow_cores", lambda c, fraction, sigmas: found)
    monkeypatch.setattr(sc_rule, "op_extras", lambda op_cores, c, core, categories, whole_capture: extras[core.device])
    monkeypatch.setattr(sc_rule, "step_basis", lambda analysis: SimpleNamespace(step_ps=10_000 * US))
    ops = pd.DataFrame({"name": ["all-reduce.1", "fusion.1"], "category": ["all-reduce", "loop fusion"],
                        "family": ["all-reduce" if synchronised else "", ""]})
    analysis = SimpleNamespace(digests={}, steps=None, ops=ops, platform=Platform.TPU,
                               profile=SimpleNamespace(hosts=[SimpleNamespace(host=h, device=SimpleNamespace(
                                   platform=Platform.TPU, gpu=None)) for h in hosts]))
    return sc_rule.check(RuleContext(analysis), Options(**options))


def _extra(name, core_us, peers_us, category="loop fusion"):
    from tpudiag.analysis.core_balance import OpExtra

    return OpExtra(name, category, core_us * US, peers_us * US, (core_us - peers_us) * US)


def test_a_core_running_ops_the_others_do_not(monkeypatch):
    cores = [_core("host0", i, w) for i, w in enumerate((7000, 7000, 7000, 7600))]
    extras = {"/device:TPU:3": [_extra("copy.5", 400, 0), _extra("fusion.9", 200, 0)]}
    (f,) = _check_cores(monkeypatch, cores, [(cores[3], 7000, 210)], extras)
    # 600 µs over the others' 7 ms median: 6 % of the 10 ms step, medium.
    assert f.message == ("`TPU:3` works 7.60 ms per step, 600.0 µs (6.0% of the step) more than the other 3 cores "
                         "(median 7.00 ms): it runs ops the others do not: `copy.5` +400.0 µs, `fusion.9` +200.0 µs")
    assert f.severity == Severity.MEDIUM and f.host == "host0" and f.ops == ("copy.5", "fusion.9")
    assert f.fix == ("`TPU:3` runs work the other cores do not (`copy.5`, `fusion.9`): spread it over them or move it "
                     "out of the step")
    assert f.saving.ps == 600 * US and f.saving.explanation == (
        "`TPU:3`'s work per step beyond the other cores' median (noise band 210.0 µs); the others wait for it at the "
        "next collective")
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("TPU:3", (("work/step", "7.60 ms"), ("vs the others' median", "+600.0 µs"), ("std", "10.0 µs"))),
        # Each fast core's others: two at 7 ms and the slow one, median 7 ms.
        ("TPU:0", (("work/step", "7.00 ms"), ("vs the others' median", "+0 ps"), ("std", "10.0 µs"))),
        ("TPU:1", (("work/step", "7.00 ms"), ("vs the others' median", "+0 ps"), ("std", "10.0 µs"))),
        ("TPU:2", (("work/step", "7.00 ms"), ("vs the others' median", "+0 ps"), ("std", "10.0 µs"))),
        ("copy.5", (("category", "loop fusion"), ("on TPU:3", "400.0 µs"), ("others (median)", "0 ps"),
                    ("ratio", "only there"), ("extra/step", "400.0 µs"))),
        ("fusion.9", (("category", "loop fusion"), ("on TPU:3", "200.0 µs"), ("others (median)", "0 ps"),
                      ("ratio", "only there"), ("extra/step", "200.0 µs")))]
    assert [(q.subject, q.name, q.value) for q in f.quantities] == [
        ("/device:TPU:3", "extra work per step (ps)", 600 * US), ("/device:TPU:3", "work per step (ps)", 7600 * US),
        ("/device:TPU:3", "others' median work per step (ps)", 7000 * US),
        ("copy.5", "extra per step (ps)", 400 * US), ("fusion.9", "extra per step (ps)", 200 * US)]


def test_more_ops_than_shown_and_none_at_all(monkeypatch):
    cores = [_core("host0", 0, 7000), _core("host0", 1, 7600)]
    extras = {"/device:TPU:1": [_extra("fusion.1", 700, 400), _extra("fusion.2", 300, 100),
                                _extra("fusion.3", 150, 100)]}
    (f,) = _check_cores(monkeypatch, cores, [(cores[1], 7000, 210)], extras, max_ops_shown=2)
    # One other core: singular.
    assert f.message.endswith("more than the other 1 core (median 7.00 ms): its ops take longer there: `fusion.1` "
                              "+300.0 µs, `fusion.2` +200.0 µs and 1 more")
    assert f.ops == ("fusion.1", "fusion.2")
    # Each core against the other one alone (not the median of both, 7.3 ms).
    assert [dict(e.values)["vs the others' median"] for e in f.evidence[:2]] == ["+600.0 µs", "-600.0 µs"]
    assert dict(f.evidence[2].values)["ratio"] == "1.75x"  # 700 / 400
    assert f.fix == ("check `TPU:1`: its health, clocks and thermal throttling (`tpu-info`); the same ops run faster "
                     "on the other cores")
    (f,) = _check_cores(monkeypatch, cores, [(cores[1], 7000, 210)], {"/device:TPU:1": []})
    assert f.message.endswith("(median 7.00 ms): no op takes longer there: the extra time is spread thin")
    assert f.ops == () and [e.subject for e in f.evidence] == ["TPU:1", "TPU:0"]


def test_a_slow_core_among_several_hosts_and_without_a_step(monkeypatch):
    cores = [_core("host0", 0, 7000), _core("host0", 1, 7000), _core("host1", 0, 7000), _core("host1", 1, 7700)]
    extras = {"/device:TPU:1": [_extra("fusion.1", 1100, 400)]}
    (f,) = _check_cores(monkeypatch, cores, [(cores[3], 7000, 210)], extras, hosts=("host0", "host1"))
    assert f.message.startswith("`TPU:1` on `host1` works 7.70 ms per step, 700.0 µs (7.0% of the step) more than the "
                                "other 3 cores on every host (median 7.00 ms)")
    # Cores by work, then host, then core.
    assert [e.subject for e in f.evidence[:4]] == ["TPU:1 (host1)", "TPU:0 (host0)", "TPU:1 (host0)", "TPU:0 (host1)"]
    assert f.fix.startswith("check `TPU:1` on `host1`: ")
    # Without steps: the whole capture is one step, no spread to show.
    (f,) = _check_cores(monkeypatch, cores, [(cores[3], 7000, 210)], extras, hosts=("host0", "host1"), whole=True)
    assert f.message.startswith("`TPU:1` on `host1` works 7.70 ms over the capture, 700.0 µs (7.0% of the capture's "
                                "mean span per core) more than")
    assert f.evidence[0].values == (("work", "7.70 ms"), ("vs the others' median", "+700.0 µs"))
    assert dict(f.evidence[4].values)["extra"] == "700.0 µs"
    only = {"/device:TPU:1": [_extra("copy.3", 700, 0)]}
    (f,) = _check_cores(monkeypatch, cores, [(cores[3], 7000, 210)], only, hosts=("host0", "host1"), whole=True)
    assert f.fix == ("`TPU:1` on `host1` runs work the other cores do not (`copy.3`): spread it over them or move it "
                     "out of the timed loop")


def test_a_slow_core_nothing_waits_for_and_a_step_of_no_length(monkeypatch):
    cores = [_core("host0", 0, 7000), _core("host0", 1, 7600, step_us=0.0)]
    extras = {"/device:TPU:1": [_extra("fusion.1", 1000, 400)]}
    (f,) = _check_cores(monkeypatch, cores, [(cores[1], 7000, 210)], extras, synchronised=False)
    assert f.message.endswith("; no collective in the capture, so no other core waits for it")
    assert "(0.0% of the step)" in f.message and f.severity == Severity.LOW
    assert f.saving.ps == 0 and f.saving.explanation == (
        "`TPU:1`'s work per step beyond the other cores' median (noise band 210.0 µs); nothing saved: no collective "
        "makes the others wait for it")
