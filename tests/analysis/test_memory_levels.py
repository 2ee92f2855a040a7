"""A roofline level per memory (issue 27 §2): VMEM peaks from the trace or a cited table, each op's
VMEM utilization and intensity, and `bound_by` naming the level that binds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.analysis.ops import VMEM_BINDS_AT, aggregate_ops
from tpudiag.model.hardware import CHIPS, chip_for
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.device_trace import TRACE_VMEM_SOURCE, trace_vmem

TRANSFORMER = REPO / "examples" / "models" / "captures" / "transformer_train_v5e"
REAL_V6E = REPO.parent / "shared" / "data" / "real-captures" / "tpu-v6e-hostoffload-inference" / "trace"


def test_trace_vmem_peaks_need_both_directions_and_plausible_values():
    got = trace_vmem({"peak_vmem_rd_bw_gigabytes_per_second": 23296.0, "peak_vmem_wr_bw_gigabytes_per_second": 16128.0})
    assert (got.read_bytes_per_s, got.write_bytes_per_s, got.source) == (23296e9, 16128e9, TRACE_VMEM_SOURCE)
    assert trace_vmem({"peak_vmem_rd_bw_gigabytes_per_second": 23296.0}) is None  # one direction: no roof
    assert trace_vmem({"peak_vmem_rd_bw_gigabytes_per_second": 0.0, "peak_vmem_wr_bw_gigabytes_per_second": 0.0}) is None
    assert trace_vmem({"peak_vmem_rd_bw_gigabytes_per_second": float("nan"),
                       "peak_vmem_wr_bw_gigabytes_per_second": 1.0}) is None


def test_only_cited_generations_have_a_vmem_bandwidth():
    """v5e: the scaling book's ~22x HBM, labelled approximate; v6e: what libtpu's profiler stamps;
    no other generation has a figure, so none is invented."""
    known = {c.generation: c.vmem_bandwidth for c in CHIPS if c.vmem_bandwidth is not None}
    assert set(known) == {"v5e", "v6e"}
    assert known["v5e"].read_bytes_per_s == 22 * chip_for("v5e").hbm_bytes_per_s
    assert "approximate" in known["v5e"].source and "scaling-book" in known["v5e"].source


@pytest.mark.skipif(not REAL_V6E.exists(), reason="shared real captures not present (../shared/data/real-captures)")
def test_a_real_v6e_trace_gives_its_own_vmem_peaks():
    """The real v6e capture's device plane carries `peak_vmem_rd_bw_gigabytes_per_second`
    23296.0099876864 and `peak_vmem_wr_bw_gigabytes_per_second` 16128.0316932096 (read with the
    XSpace proto by hand): those, not the table, are the VMEM roofs."""
    summary = tpudiag.diagnose(REAL_V6E).report.summary
    assert summary.vmem.source == TRACE_VMEM_SOURCE
    assert summary.vmem.read_bytes_per_s == pytest.approx(23296.0099876864e9)
    assert summary.vmem.write_bytes_per_s == pytest.approx(16128.0316932096e9)


@pytest.fixture(scope="module")
def transformer_host():
    return load_capture(TRANSFORMER).hosts[0]


def test_vmem_intensity_is_at_the_binding_direction_and_absent_without_vmem_bytes(transformer_host):
    ops = aggregate_ops(transformer_host).set_index("name")
    f210 = ops.loc["fusion.210"]
    # 4,831,838,208 FLOPs over 51,904,512 VMEM bytes read (more than the 22,020,096 written; v5e has
    # one figure for both directions): 93.1 FLOP/B, where XLA's HBM bytes give 786,432.
    assert f210["vmem_intensity"] == pytest.approx(4831838208 / 51904512)
    assert f210["vmem_utilization"] == pytest.approx(51904512 / (f210["total_time_ps"] / 1e12) / (22 * 819e9))
    no_vmem = ops[(ops["vmem_read_bytes"] + ops["vmem_write_bytes"]) == 0]
    assert len(no_vmem) and no_vmem["vmem_intensity"].isna().all() and no_vmem["vmem_utilization"].isna().all()


def test_bound_by_is_the_level_with_the_largest_utilization(transformer_host):
    ops = aggregate_ops(transformer_host)
    ops = ops[ops["family"] == ""]
    assert "Unknown" not in set(ops["bound_by"].astype(str))
    vmem = ops[ops["bound_by"] == "VMEM"]
    assert (vmem["bound_basis"] == "VMEM bytes from the layouts").all()
    assert (vmem["vmem_utilization"].fillna(np.inf) >= vmem["flop_utilization"].fillna(0)).all()
    assert (vmem["vmem_utilization"].fillna(np.inf) >= VMEM_BINDS_AT).all()
    # An op bound by latency reaches no roof: no FLOPs, no HBM bytes, under a tenth of VMEM's peak.
    latency = ops[ops["bound_by"] == "latency"]
    assert len(latency) and (latency[["flops", "hbm_bytes", "copied_hbm_bytes"]].sum(axis=1) == 0).all()
    # (an async copy's start moves its bytes over its window, not in its own time: VMEM does not judge it)
    assert (latency[latency["moves"] == ""]["vmem_utilization"].fillna(0) < VMEM_BINDS_AT).all()
    assert (latency["vmem_read_bytes"] + latency["vmem_write_bytes"] > 0).any()  # the floor is exercised


def test_without_a_vmem_peak_no_op_is_bound_by_vmem(transformer_host):
    host = dataclasses.replace(transformer_host, device=dataclasses.replace(transformer_host.device, vmem=None))
    ops = aggregate_ops(host)
    assert "VMEM" not in set(ops["bound_by"].astype(str)) and ops["vmem_intensity"].isna().all()
