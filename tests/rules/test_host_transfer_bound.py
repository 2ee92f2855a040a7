"""host-transfer-bound (TPD112): a step waiting on copies from host memory, its levers; near misses quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.rules import RulesConfig
from tpudiag.rules.host_transfer_bound import Options

US = sc.US
OFFLOAD = SHARED / "data" / "real-captures" / "tpu-v6e-hostoffload-inference" / "trace"


def _run(analysis, **options):
    findings, _ = run_rules(analysis, RulesConfig(select=("host-transfer-bound",),
                                                  options={"host-transfer-bound": options}))
    return findings


def test_a_step_waiting_on_a_prefetch_from_host_memory(tmp_path: Path, snapshot):
    a = sc.analyse(sc.host_offload(), tmp_path)
    (f,) = _run(a)
    # copy-done waits 5 ms of each 10 ms step (plus 1 µs copy-starts and the offload's 1 µs wait).
    assert f.severity == Severity.HIGH and f.saving.basis == "measured"
    assert f.saving.ps == pytest.approx(5003 * US, rel=1e-3)
    assert f.ops == ("copy-done",)  # the VMEM prefetch copy-done.2 is not a host transfer
    assert "host to HBM 0.134 GB per step at 19.2 GB/s per core (host link nominal 32 GB/s)" in f.message
    q = {(x.subject, x.name): x.value for x in f.quantities}
    assert q[("host to HBM", "bytes per step")] == sc.OFFLOAD_BYTES_F32
    assert q[("host to HBM", "achieved bytes/s")] == pytest.approx(sc.OFFLOAD_BYTES_F32 / 7e-3, rel=1e-3)
    # Every lever's precondition holds, HBM room unknown: no buffer assignment in this capture.
    assert "start the copies earlier" in f.fix and "2.10 ms of compute" in f.fix
    assert "free HBM is unknown" in f.fix and "move fewer bytes" in f.fix and "narrower dtype" in f.fix
    snapshot("host-transfer-bound", render_findings([f]))


def test_levers_only_where_their_precondition_holds(tmp_path: Path):
    # bf16 arrays: no narrower-dtype lever; compute down to the 101 µs of fusion.1 and the VMEM copy, 2 %
    # of the 5 ms wait (under the 5 % `min_overlap_compute`): nothing to overlap with.
    (f,) = _run(sc.analyse(sc.host_offload(dtype="bf16", compute_ps=US), tmp_path))
    assert "narrower dtype" not in f.fix and "start the copies earlier" not in f.fix
    assert "move fewer bytes" in f.fix


def test_near_miss_a_short_wait_and_no_host_copies(tmp_path: Path):
    # 500 µs of a 10 ms step (5 %) is under the 10 % threshold; a 3 % threshold reports it.
    short = sc.analyse(sc.host_offload(wait_ps=500 * US), tmp_path / "short")
    assert _run(short) == []
    assert len(_run(short, min_share=0.03)) == 1
    example = sc.analyse_hosts(sc.straggler_cores(slow=None), tmp_path / "none")
    assert _run(example) == []


def test_the_breakdown_counts_the_waits_as_host_transfers_not_compute(tmp_path: Path):
    a = sc.analyse(sc.host_offload(), tmp_path)
    s = a.steps.iloc[0]
    # fusion.1 (2 ms less the 1 µs copy-start before it) and the 100 µs VMEM copy-done.2 are compute.
    assert s.host_transfer_ps == 5003 * US and s.compute_ps == 2100 * US
    assert s.compute_ps + s.collective_ps + s.io_ps + s.host_transfer_ps + s.idle_ps == s.dur_ps


@pytest.mark.skipif(not OFFLOAD.exists(), reason=f"{OFFLOAD} is absent (real captures sit in ../shared)")
def test_real_v6e_host_offload_capture():
    # Established by hand from the file: jit_f copies three f32[5,1024,1024,256] arrays (5 GiB each)
    # from S(5) into HBM (copy-start, .2, .4) and three back (copy-start.1, .3, .5) per execution;
    # on TPU:0 the prefetches' windows (copy-start to the end of copy-done) cover 593.8 ms of a
    # 784 ms execution: 16.1 GB / 593.8 ms = 27.1 GB/s; the offloads' 587.0 ms: 27.4 GB/s.
    import tpudiag

    d = tpudiag.diagnose(OFFLOAD)
    (f,) = [f for f in d.findings if f.rule == "host-transfer-bound"]
    assert set(f.ops) >= {"copy-done", "copy-done.2", "copy-done.4", "copy-done.5"}
    rates = {t.direction: t for t in d.report.summary.host_transfers}
    assert rates["host to HBM"].achieved_bytes_per_s == pytest.approx(27.1e9, rel=0.01)
    assert rates["HBM to host"].achieved_bytes_per_s == pytest.approx(27.4e9, rel=0.01)
    assert rates["host to HBM"].link_bytes_per_s == 32e9 and rates["host to HBM"].dtypes == ("f32",)
    b = d.report.summary.breakdown
    assert b.host_transfer_ps / b.step_ps > 0.95 and b.compute_ps / b.step_ps < 0.05
    # jit_f peaks at 21.5 GB of v6e's 34.4 GB: 12.9 GB free, less than the 16.1 GB prefetched.
    hbm = next(e for e in f.evidence if e.subject == "HBM free")
    assert dict(hbm.values)["kept in HBM"] == "does not fit" and "keep the prefetched" not in f.fix


def test_options_validate():
    with pytest.raises(ValueError, match="min_share"):
        Options(min_share=2.0)


# -- helpers called directly ------------------------------------------------------------------------

def _rate(direction="host to HBM", *, achieved=19.2e9, link=32e9, dtypes=("f32",), above_link=False, per_step=1.0,
          nbytes=134e6, wait_ps=5000 * US, ops=("copy-done",)):
    from tpudiag.model.report import HostTransferRate

    return HostTransferRate(direction, ops, per_step, nbytes, wait_ps, achieved, link, dtypes, above_link)


def _program(module, limit, peak):
    from types import SimpleNamespace

    return SimpleNamespace(module=module, hbm_limit_bytes=limit, hbm_peak_bytes=peak)


def test_gigabytes_shown_to_three_significant_digits():
    from tpudiag.rules.host_transfer_bound import _gb

    assert _gb(134_217_728) == "0.134 GB"  # 128 MiB
    assert _gb(16.1e9) == "16.1 GB" and _gb(12_345_678_901) == "12.3 GB" and _gb(0) == "0 GB"


def test_hbm_room_is_the_tightest_program_that_runs_the_copies():
    from tpudiag.rules.host_transfer_bound import HbmRoom, _hbm_room

    memory = (_program("jit_a", 100, 60), _program("jit_b", 100, 90),  # 40 and 10 bytes free
              _program("jit_c", 0, 10), _program("jit_d", None, 10),  # no limit known: skipped
              _program("jit_e", 100, None),  # no buffer assignment: skipped
              _program("jit_z", 100, 99))  # tightest, but runs none of the copies
    modules = {"jit_a", "jit_b", "jit_c", "jit_d", "jit_e"}
    assert _hbm_room(memory, modules) == HbmRoom("jit_b", 10, 100, 90)
    assert _hbm_room(memory, {"jit_a"}) == HbmRoom("jit_a", 40, 100, 60)
    # A peak of 0 is a buffer assignment (nothing live), not a missing one.
    assert _hbm_room((_program("jit_0", 100, 0),), {"jit_0"}) == HbmRoom("jit_0", 100, 100, 0)
    # Equal room: the first module by name, whatever the order of the programs.
    tie = (_program("jit_y", 100, 50), _program("jit_x", 200, 150))
    assert _hbm_room(tie, {"jit_x", "jit_y"}).module == "jit_x"
    assert _hbm_room(memory, {"jit_c", "jit_d", "jit_e"}) is None and _hbm_room((), {"jit_a"}) is None


def test_prefetched_bytes_fit_up_to_exactly_the_free_room():
    from tpudiag.rules.host_transfer_bound import HbmRoom, _fits

    room = HbmRoom("jit_f", 1000, 3000, 2000)
    assert _fits(room, 1000) is True and _fits(room, 1001) is False and _fits(None, 1) is None


def test_hbm_evidence_with_and_without_a_buffer_assignment():
    from tpudiag.rules.host_transfer_bound import HbmRoom, _hbm_evidence

    e = _hbm_evidence(None, 134e6)
    assert e.subject == "HBM free" and e.values == (
        ("at the program's peak", "unknown (no buffer assignment: the compiled HLO gives it)"),
        ("prefetched/step", "0.134 GB"))
    # The real offload capture's figures: jit_f peaks at 21.5 GB of 34.4 GB, 12.9 GB free; 16.1 GB prefetched.
    room = HbmRoom("jit_f", 12_900_000_000, 34_400_000_000, 21_500_000_000)
    assert _hbm_evidence(room, 16.1e9).values == (
        ("program", "jit_f"), ("peak", "21.5 GB"), ("limit", "34.4 GB"), ("free at the peak", "12.9 GB"),
        ("prefetched/step", "16.1 GB"), ("kept in HBM", "does not fit"))
    assert dict(_hbm_evidence(room, 12.9e9).values)["kept in HBM"] == "fits"


def test_each_lever_only_with_its_precondition():
    from tpudiag.rules.host_transfer_bound import HbmRoom, _levers

    fewer = "move fewer bytes: copy only the slices a step uses, or offload less"
    # Nothing to overlap, nothing prefetched, bf16: only fewer bytes.
    assert _levers((_rate(dtypes=("bf16",)),), 0.0, 5000 * US, 0.0, None) == [fewer]
    # 2 ms of compute against a 5 ms wait hides up to 2 ms; 8 ms of it hides the whole 5 ms wait.
    assert _levers((_rate(dtypes=()),), 2000 * US, 5000 * US, 0.0, None)[0] == (
        "start the copies earlier so they overlap compute (the step has 2.00 ms of compute to hide up to 2.00 ms "
        "behind)")
    assert "(the step has 8.00 ms of compute to hide up to 5.00 ms behind)" in \
        _levers((_rate(dtypes=()),), 8000 * US, 5000 * US, 0.0, None)[0]
    # Prefetched bytes without a buffer assignment: the lever with its condition; with one, only if they fit.
    assert _levers((_rate(dtypes=()),), 0.0, 5000 * US, 134e6, None) == [
        "keep the prefetched arrays (0.134 GB per step) in HBM if they fit: free HBM is unknown without the "
        "program's buffer assignment", fewer]
    room = HbmRoom("jit_f", 2_000_000_000, 16_000_000_000, 14_000_000_000)
    assert _levers((_rate(dtypes=()),), 0.0, 5000 * US, 1e9, room) == [
        "keep the prefetched arrays in HBM: 1 GB fits in the 2 GB free at `jit_f`'s peak", fewer]
    assert _levers((_rate(dtypes=()),), 0.0, 5000 * US, 3e9, room) == [fewer]
    # Wide dtypes of every direction, each once, sorted.
    rates = (_rate(dtypes=("f64", "bf16")), _rate("HBM to host", dtypes=("f32", "f64")))
    assert _levers(rates, 0.0, 5000 * US, 0.0, None)[-1] == (
        "keep offloaded state in a narrower dtype: the copies move f32/f64, bf16 halves the bytes where its "
        "precision allows")


def test_direction_text_rate_link_and_a_rate_not_shown():
    from tpudiag.rules.host_transfer_bound import _direction_text

    assert _direction_text(_rate()) == "host to HBM 0.134 GB per step at 19.2 GB/s per core (host link nominal 32 GB/s)"
    assert _direction_text(_rate(link=None)) == "host to HBM 0.134 GB per step at 19.2 GB/s per core"
    assert _direction_text(_rate("HBM to host", achieved=None, above_link=True)) == (
        "HBM to host 0.134 GB per step (rate n/a: its windows imply more than the nominal link) (host link nominal "
        "32 GB/s)")
    assert _direction_text(_rate(achieved=None, link=None)) == "host to HBM 0.134 GB per step"


def test_rate_values_with_unknowns():
    from tpudiag.rules.host_transfer_bound import _rate_values

    # 19.2 of 32 GB/s: 60.0 %.
    assert _rate_values(_rate(per_step=1.5, ops=("copy-done", "copy-done.2"))) == (
        ("copies/step", "1.5"), ("bytes/step", "0.134 GB"), ("waited/step", "5.00 ms"),
        ("achieved (per core)", "19.2 GB/s"), ("host link (nominal)", "32 GB/s"), ("of nominal", "60.0%"),
        ("dtypes", "f32"), ("ops", "copy-done, copy-done.2"))
    v = dict(_rate_values(_rate(link=None, dtypes=("bf16", "f32"))))
    assert (v["host link (nominal)"], v["of nominal"], v["dtypes"]) == ("unknown", "n/a", "bf16, f32")
    assert dict(_rate_values(_rate(dtypes=())))["dtypes"] == "unknown"
    assert dict(_rate_values(_rate(per_step=2 / 3)))["copies/step"] == "0.667"


def test_op_waits_sum_one_direction_per_op():
    import pandas as pd
    from types import SimpleNamespace

    from tpudiag.rules.host_transfer_bound import _op_waits

    t = pd.DataFrame({"direction": pd.Categorical(["host to HBM", "host to HBM", "HBM to host", "host to HBM"]),
                      "name": pd.Categorical(["copy-done", "copy-done", "copy-done.1", "copy-done.2"]),
                      "wait_ps": [3.0, 4.0, 100.0, 1.0]})
    a = SimpleNamespace(host_transfers=t)
    assert _op_waits(a, _rate()) == {"copy-done": 7.0, "copy-done.2": 1.0}
    assert _op_waits(a, _rate("HBM to host")) == {"copy-done.1": 100.0}


def test_the_rule_without_a_chip_and_with_the_programs_hbm_room(tmp_path: Path):
    from tpudiag.rules import host_transfer_bound as htb
    from tpudiag.rules.base import RuleContext

    a = sc.analyse(sc.host_offload(), tmp_path)
    # No chip: no nominal link to show or to compare with.
    (f,) = htb.check(RuleContext(a), Options())
    assert f.message == ("host transfers hold each 10.00 ms step for 5.00 ms (50.0%), waiting in `copy-done`: host to "
                         "HBM 0.134 GB per step at 19.2 GB/s per core; HBM to host 0.0336 GB per step at 11.6 GB/s per "
                         "core")
    prefetch = dict(f.evidence[0].values)
    assert (prefetch["host link (nominal)"], prefetch["of nominal"]) == ("unknown", "n/a")
    # The design's figures: 5,003 µs waited per step; 128 MiB over the 7 ms window from copy-start to the end
    # of copy-done; 32 MiB back over the 2.901 ms from copy-start.1 to the end of copy-done.1.
    q = {(x.subject, x.name): x.value for x in f.quantities}
    assert q == {("step", "host-copy wait per step (ps)"): 5003 * US,
                 ("host to HBM", "bytes per step"): sc.OFFLOAD_BYTES_F32,
                 ("HBM to host", "bytes per step"): sc.OFFLOAD_BYTES_F32 // 4,
                 ("host to HBM", "achieved bytes/s"): pytest.approx(sc.OFFLOAD_BYTES_F32 / 7e-3, rel=1e-3),
                 ("HBM to host", "achieved bytes/s"): pytest.approx(sc.OFFLOAD_BYTES_F32 / 4 / 2.901e-3, rel=1e-3)}
    assert f.evidence[2].values == (("host-copy wait/step", "5.00 ms"), ("compute/step", "2.10 ms"),
                                    ("step", "10.00 ms"))
    # The copies run in `jit_train_step`: its room decides; another program's is not looked at.
    room = (_program("jit_train_step", 16_000_000_000, 15_000_000_000), _program("jit_other", 100, 100))
    (f,) = htb.check(RuleContext(a, memory=room), Options())
    assert "keep the prefetched arrays in HBM: 0.134 GB fits in the 1 GB free at `jit_train_step`'s peak" in f.fix
    assert dict(f.evidence[-1].values)["kept in HBM"] == "fits"
    tight = (_program("jit_train_step", 16_000_000_000, 15_900_000_000),)
    (f,) = htb.check(RuleContext(a, memory=tight), Options())
    assert "keep the prefetched" not in f.fix and dict(f.evidence[-1].values)["kept in HBM"] == "does not fit"


def test_thresholds_around_the_designed_wait(tmp_path: Path):
    a = sc.analyse(sc.host_offload(), tmp_path)
    # 5,003 µs of a 10 ms step: 50.03 %.
    assert len(_run(a, min_share=0.5)) == 1 and _run(a, min_share=0.51) == []
    # 2.1 ms of compute is 42 % of the 5,003 µs wait (0.41975): the overlap lever from a 41 % bar, not a 42 % one.
    assert "start the copies earlier" in _run(a, min_overlap_compute=0.41)[0].fix
    assert "start the copies earlier" not in _run(a, min_overlap_compute=0.42)[0].fix
    # Severity: high from 30 % by default; 50.03 % is under a 51 % bar and over a 50 % medium one.
    assert _run(a, high_share=0.51, medium_share=0.5)[0].severity == Severity.MEDIUM
    assert _run(a, high_share=0.52, medium_share=0.51)[0].severity == Severity.LOW


def test_the_ops_waited_in_from_a_twentieth_of_the_wait_most_first(tmp_path: Path, monkeypatch):
    from tpudiag.rules import host_transfer_bound as htb

    a = sc.analyse(sc.host_offload(), tmp_path)
    # Per op, the time waited in it (µs): 10,000 in all, so an op counts from 500 µs (a twentieth) on.
    waits = {"host to HBM": {"copy-done": 4501, "copy-done.2": 2000},
             "HBM to host": {"copy-done.1": 2000, "copy-done.3": 500, "copy-done.5": 500, "copy-done.7": 499}}
    monkeypatch.setattr(htb, "_op_waits", lambda analysis, rate: {
        name: us * US for name, us in waits[rate.direction].items()})
    (f,) = _run(a)
    # Most first, equal waits by name, copy-done.7 (499 µs) left out; four by default.
    assert f.ops == ("copy-done", "copy-done.1", "copy-done.2", "copy-done.3")
    assert "waiting in `copy-done`, `copy-done.1`, `copy-done.2`, `copy-done.3`: host to HBM" in f.message
    assert _run(a, max_ops_shown=6)[0].ops == ("copy-done", "copy-done.1", "copy-done.2", "copy-done.3", "copy-done.5")


def test_a_wait_of_exactly_min_share_is_reported(tmp_path: Path):
    # 997 µs in copy-done plus the 3 µs of the copy-starts and the offload: 1 ms of the 10 ms step, 10 % exactly.
    (f,) = _run(sc.analyse(sc.host_offload(wait_ps=997 * US), tmp_path))
    assert f.saving.ps == 1000 * US and "(10.0%)" in f.message


def test_compute_of_exactly_min_overlap_compute_offers_the_overlap(tmp_path: Path):
    # 4,197 µs in copy-done plus 3 µs: 4.2 ms waited; 2.1 ms of compute is half of it exactly.
    a = sc.analyse(sc.host_offload(wait_ps=4197 * US), tmp_path)
    assert "start the copies earlier" in _run(a, min_overlap_compute=0.5)[0].fix
    assert "start the copies earlier" not in _run(a, min_overlap_compute=0.51)[0].fix
