"""straggler-host (TPD107): the slow host, the op behind it, the fast hosts' wait; near miss and healthy quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.rules import RulesConfig
from tpudiag.rules.straggler_host import Options

US = sc.US


def _run(analysis, **options):
    findings, _ = run_rules(analysis, RulesConfig(select=("straggler-host",), options={"straggler-host": options}))
    return findings


def test_v5p_host_with_one_slow_fusion(tmp_path: Path, snapshot):
    # The issue's third capture: host2's fusion.62 takes 3.8x longer, its steps 12.0 ms against 10.0 ms.
    a = sc.analyse_hosts(sc.straggler_hosts(), tmp_path)
    (f,) = _run(a)
    assert f.host == "host2" and f.severity == Severity.HIGH and f.saving.basis == "measured"
    assert f.saving.ps == pytest.approx(2000 * US, rel=0.05)  # designed lag: 12.0 - 10.0 ms
    assert "20.0% longer than the other 3 hosts" in f.message
    assert "`fusion.62` takes 3.8x longer there" in f.message and f.ops[0] == "fusion.62"
    ev = {e.subject: dict(e.values) for e in f.evidence}
    assert ev["fusion.62"]["ratio"] == "3.80x"
    # The fast hosts wait 500 µs longer in the all-reduce: attributed to host2.
    assert ev["fast hosts"]["waiting in collectives/step"] == "500.0 µs"
    assert "fusion.62" in f.fix and "host2" in f.fix
    snapshot("straggler-host", render_findings([f]))
    # The rows the snapshot leaves to JSON: fusion.62, 893 µs x 3.8 = 3,393.4 µs on host2, 2,500.4 µs more;
    # then the fast hosts' wait.
    assert [e.subject for e in f.evidence] == ["host2", "host0", "host1", "host3", "fusion.62", "fast hosts"]
    assert ev["fusion.62"] == {"category": "convolution fusion", "on host2": "3.39 ms", "others (median)": "893.0 µs",
                               "ratio": "3.80x", "extra/step": "2.50 ms"}
    assert ev["fast hosts"] == {"waiting in collectives/step": "500.0 µs",
                                "attributed to": "host2 (not their own problem)"}
    assert f.fix == ("find why `fusion.62` is slower on `host2`: check that host's chips (health, clocks, throttling: "
                     "`tpu-info`) and that it runs the same compiled program")
    assert f.saving.explanation == "`host2`'s lag behind the other hosts' median step time (noise band 300.0 µs)"
    # An op counts from `min_op_ratio` times the others' median: 3.8x is under 3.81 and over 3.79.
    (g,) = _run(a, min_op_ratio=3.79)
    assert g.ops == ("fusion.62",)
    (g,) = _run(a, min_op_ratio=3.81)
    assert g.ops == () and g.message == ("`host2` steps take 12.00 ms, 20.0% longer than the other 3 hosts "
                                         "(10.00 ms): no op, idle or input difference explains it")
    assert g.fix == "compare `host2` with the others in the trace viewer: the lag is spread over many ops"
    assert [e.subject for e in g.evidence] == ["host2", "host0", "host1", "host3", "fast hosts"]


def test_the_fast_hosts_wait_is_not_their_exposed_collective(tmp_path: Path):
    a = sc.analyse_hosts(sc.straggler_hosts(), tmp_path)
    findings, _ = run_rules(a, RulesConfig(select=("exposed-collective",)))
    (f,) = findings
    # The fast hosts' all-reduce: 2,607 µs, of which 500 µs is waiting for host2: 2,107 µs is their own.
    assert f.saving.ps == pytest.approx(sc.STRAGGLER_AR_SLOW, rel=0.01)
    assert "500.0 µs more per step is the other hosts waiting for straggler `host2`" in f.message
    healthy = sc.analyse_hosts(sc.straggler_hosts(slow_host=-1), tmp_path / "healthy")
    (g,) = run_rules(healthy, RulesConfig(select=("exposed-collective",)))[0]
    assert g.saving.ps == pytest.approx(sc.STRAGGLER_AR_FAST, rel=0.01) and "straggler" not in g.message


def test_idle_on_the_slow_host_is_named(tmp_path: Path):
    designs = sc.straggler_hosts(slow_op_ps=sc.STRAGGLER_BASE, slow_ar_ps=sc.STRAGGLER_AR_FAST,
                                 slow_idle_ps=1500 * US)
    a = sc.analyse_hosts(designs, tmp_path)
    (f,) = _run(a)
    assert f.host == "host2" and f.ops == ()
    assert f.saving.ps == pytest.approx(1500 * US, rel=0.05)
    assert "+1.50 ms idle per step" in f.message and "input pipeline" in f.fix
    # 11.5 ms against 10 ms: 15 % exactly, high from 15 %.
    assert f.message == "`host2` steps take 11.50 ms, 15.0% longer than the other 3 hosts (10.00 ms): +1.50 ms idle per step"
    assert f.fix == "look at `host2`'s input pipeline and host load: it feeds its devices late"
    assert f.severity == Severity.HIGH
    assert dict(f.evidence[0].values)["idle/step"] == "1.50 ms"
    assert _run(a, high_share=0.2, medium_share=0.15)[0].severity == Severity.MEDIUM
    assert _run(a, high_share=0.2, medium_share=0.16)[0].severity == Severity.LOW


def test_near_miss_inside_the_noise_band_and_healthy(tmp_path: Path):
    # 250 µs slower (2.5 %): inside the 3 % band.
    near = sc.straggler_hosts(slow_op_ps=sc.STRAGGLER_BASE + 250 * US, slow_ar_ps=sc.STRAGGLER_AR_FAST)
    a = sc.analyse_hosts(near, tmp_path / "near")
    assert _run(a) == []
    assert [f.host for f in _run(a, min_lag_fraction=0.02)] == ["host2"]
    healthy = sc.analyse_hosts(sc.straggler_hosts(slow_host=-1), tmp_path / "healthy")
    assert _run(healthy) == []
    findings, _ = run_rules(sc.analyse_hosts(sc.straggler_hosts(slow_host=-1), tmp_path / "single"),
                            RulesConfig(select=("straggler-host", "device-idle")))
    assert findings == []


def test_one_host_has_no_straggler(tmp_path: Path):
    assert _run(sc.analyse_hosts(sc.straggler_hosts(n_hosts=1, slow_host=0), tmp_path)) == []


def test_options_validate():
    with pytest.raises(ValueError, match="min_op_ratio"):
        Options(min_op_ratio=0.5)
