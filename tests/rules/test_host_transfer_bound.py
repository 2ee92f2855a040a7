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
