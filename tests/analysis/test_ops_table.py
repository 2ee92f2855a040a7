"""The ops table (`analysis.ops.aggregate_ops`) of hand-built hosts: every rate, utilization, level and
`bound_by` worked out by hand from the op's FLOPs, bytes and time (XProf's definitions, in the
module docstring: totals over occurrences, rates over total time, the larger utilization binds).

Device of the TPU host: 100 TFLOP/s and 1 TB/s per core; its chip's ICI peak 100 GB/s (one link).
Times: 1 µs = 10^6 ps.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.ops import BoundBasis, BoundBy, aggregate_ops
from tpudiag.model import schemas
from tpudiag.model.hardware import ChipSpec, VmemBandwidth
from tpudiag.model.profile import DeviceInfo, PeaksSource, Platform
from tpudiag.parsers.device_trace import NON_XLA_KERNEL

US = 10**6
CHIP = ChipSpec("test", 1e14, 1e12, 2**34, 1, 1, 128, 2**24, None, 1e11, 1, ("test",))
TPU = DeviceInfo(Platform.TPU, "test", CHIP, 1e14, 1e12, PeaksSource.TRACE, 1, 4)


def _host(ops: list[tuple], device: DeviceInfo = TPU, windows: list[tuple] = ()) -> SimpleNamespace:
    """A host from (name, category, [(start µs, dur µs, self µs)...], flops, bytes, hbm bytes, HLO text)
    per op, all on TPU:0 of program 1, and async windows (name, start µs, end µs)."""
    ev = {k: [] for k in ("name", "category", "start_ps", "dur_ps", "self_ps")}
    for name, cat, occurrences, *_ in ops:
        for start, dur, self_ in occurrences:
            for k, v in zip(ev, (name, cat, start * US, dur * US, self_ * US)):
                ev[k].append(v)
    n = len(ev["name"])
    events = schemas.EVENTS.frame({**ev, "host": ["h"] * n, "device": ["/device:TPU:0"] * n, "core": [0] * n,
                                   "chip": [0] * n, "program_id": [1] * n, "module": ["jit_step"] * n,
                                   "depth": [0] * n, "step": [0] * n})
    m = len(ops)
    meta = schemas.OP_METADATA.frame({
        "host": ["h"] * m, "program_id": [1] * m, "name": [o[0] for o in ops], "category": [o[1] for o in ops],
        "symbol_id": [1] * m, "flops": [o[3] for o in ops], "model_flops": [o[3] for o in ops],
        "bytes_accessed": [o[4] for o in ops], "hbm_bytes": [o[5] for o in ops], "shape_with_layout": [""] * m,
        "source": ["f.py:1"] * m, "tf_op": ["jit(step)/op"] * m, "hlo_text": [o[6] for o in ops]})
    w = schemas.ASYNC_WINDOWS.frame({
        "host": ["h"] * len(windows), "device": ["/device:TPU:0"] * len(windows), "core": [0] * len(windows),
        "name": [x[0] for x in windows], "family": ["all-gather"] * len(windows),
        "start_ps": [x[1] * US for x in windows], "end_ps": [x[2] * US for x in windows],
        "source": ["Async XLA Ops"] * len(windows)})
    return SimpleNamespace(host="h", events=events, op_metadata=meta, device=device, async_windows=w,
                           hlo_protos={})


def _row(table: pd.DataFrame, name: str) -> pd.Series:
    rows = table[table["name"].astype(str) == name]
    assert len(rows) == 1, name
    return rows.iloc[0]


AR_TEXT = "%all-reduce.1 = f32[1024]{0} all-reduce(f32[1024]{0} %p), replica_groups={{0,1,2,3}}, to_apply=%add"
AG_TEXT = ("%all-gather-start.1 = (f32[256]{0}, f32[1024]{0}) all-gather-start(f32[256]{0} %p), "
           "replica_groups={{0,1,2,3}}, dimensions={0}")
TPU_OPS = [
    # 2 x 10 µs, 5e8 FLOP and 1 MB each: 1e9 FLOP / 20 µs = 50 TFLOP/s (0.5); 2 MB / 20 µs = 100 GB/s (0.1)
    ("fusion.1", "convolution fusion", [(0, 10, 10), (100, 10, 10)], 5e8, 1e6, 1e6, ""),
    # 10 µs, 1e6 FLOP, 10 MB: 0.1 TFLOP/s (0.001), 1 TB/s (1.0, exactly the peak: a rate)
    ("fusion.2", "loop fusion", [(20, 10, 10)], 1e6, 1e7, 1e7, ""),
    # a loop of 100 µs, 50 of them its own, no cost: reaches no roof
    ("while.1", "while", [(200, 100, 50)], np.nan, np.nan, np.nan, ""),
    # 1 µs, 1e9 FLOP: 1000 TFLOP/s, above the peak: no rate, yet the roof it counts against
    ("fusion.4", "loop fusion", [(40, 1, 1)], 1e9, 0.0, 0.0, ""),
    # 4 KiB all-reduced over 4 chips: 2 x 3/4 x 4096 = 6144 B per device in 10 µs
    ("all-reduce.1", "all-reduce", [(50, 10, 10)], 0.0, 8192.0, 8192.0, AR_TEXT),
    # gathered 4 KiB over 4 chips: 3/4 x 4096 = 3072 B per device, over the 30 µs window, start and done
    ("all-gather-start.1", "all-gather", [(60, 1, 1)], 0.0, 0.0, 0.0, AG_TEXT),
    ("all-gather-done.1", "all-gather", [(90, 1, 1)], 0.0, 0.0, 0.0, ""),
    ("my_kernel", NON_XLA_KERNEL, [(95, 2, 2)], 0.0, 0.0, 0.0, ""),
]


@pytest.fixture  # per test, not per module: mutmut maps a test to the functions it calls itself
def tpu_table() -> pd.DataFrame:
    return aggregate_ops(_host(TPU_OPS, windows=[("all-gather-start.1", 60, 90)]))


def test_totals_are_over_occurrences_and_rates_over_total_time(tpu_table):
    op = _row(tpu_table, "fusion.1")
    assert (op["occurrences"], op["total_time_ps"], op["self_time_ps"]) == (2, 20 * US, 20 * US)
    assert (op["flops"], op["bytes_accessed"], op["hbm_bytes"]) == (1e9, 2e6, 2e6)
    assert op["flop_rate"] == pytest.approx(5e13) and op["flop_utilization"] == pytest.approx(0.5)
    assert op["hbm_bw"] == pytest.approx(1e11) and op["hbm_utilization"] == pytest.approx(0.1)
    assert op["operational_intensity"] == pytest.approx(500) and op["hbm_intensity"] == pytest.approx(500)
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.COMPUTE.value, BoundBasis.UTILIZATION.value)
    assert (op["module"], op["family"], op["source"], op["tf_op"]) == ("jit_step", "", "f.py:1", "jit(step)/op")
    assert op["program_id"] == 1 and op["host"] == "h"


def test_an_op_at_the_hbm_peak_is_hbm_bound(tpu_table):
    op = _row(tpu_table, "fusion.2")
    assert op["hbm_bw"] == pytest.approx(1e12) and op["hbm_utilization"] == pytest.approx(1.0)
    assert op["flop_utilization"] == pytest.approx(1e-3)
    assert op["operational_intensity"] == pytest.approx(0.1)
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.HBM.value, BoundBasis.UTILIZATION.value)


def test_an_op_without_cost_reaches_no_roof_and_self_time_is_its_own(tpu_table):
    op = _row(tpu_table, "while.1")
    assert (op["total_time_ps"], op["self_time_ps"]) == (100 * US, 50 * US)
    assert (op["flops"], op["bytes_accessed"], op["flop_rate"], op["hbm_bw"]) == (0, 0, 0, 0)
    assert np.isnan(op["operational_intensity"]) and np.isnan(op["hbm_intensity"])
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.LATENCY.value, BoundBasis.NONE.value)


def test_a_rate_above_the_peak_is_no_rate_but_still_binds(tpu_table):
    op = _row(tpu_table, "fusion.4")
    assert np.isnan(op["flop_rate"]) and np.isnan(op["flop_utilization"])
    assert op["hbm_bw"] == 0 and op["hbm_utilization"] == 0
    assert op["bound_by"] == BoundBy.COMPUTE.value
    # FLOPs and no bytes: no intensity (not infinite)
    assert np.isnan(op["operational_intensity"]) and np.isnan(op["hbm_intensity"])
    # bytes and no FLOPs: no HBM intensity either
    assert np.isnan(_row(tpu_table, "all-reduce.1")["hbm_intensity"])


def test_a_collective_is_judged_by_its_ici_traffic(tpu_table):
    op = _row(tpu_table, "all-reduce.1")
    assert (op["family"], op["bound_by"], op["bound_basis"]) == ("all-reduce", "collective", "memory space")
    assert (op["group_size"], op["group_source"]) == (4, "replica_groups")
    assert op["ici_bytes"] == pytest.approx(6144) and op["ici_time_ps"] == 10 * US
    assert op["ici_bw"] == pytest.approx(6144 / 1e-5) and op["ici_utilization"] == pytest.approx(6144 / 1e-5 / 1e11)
    # at peak 6144 B take 61 ns: under the 2 µs latency, and it reached well under a tenth of the peak
    assert bool(op["ici_latency_bound"])


def test_an_async_pair_shares_its_starts_traffic_over_the_window(tpu_table):
    start, done = _row(tpu_table, "all-gather-start.1"), _row(tpu_table, "all-gather-done.1")
    for op in (start, done):
        assert (op["family"], op["group_size"], op["group_source"]) == ("all-gather", 4, "replica_groups")
        assert op["ici_bytes"] == pytest.approx(3072) and op["ici_time_ps"] == 30 * US
        assert op["ici_bw"] == pytest.approx(3072 / 3e-5)
    assert _row(tpu_table, "fusion.1")["group_size"] == 0 and not _row(tpu_table, "fusion.1")["ici_latency_bound"]
    assert np.isnan(_row(tpu_table, "fusion.1")["ici_bw"]) and _row(tpu_table, "fusion.1")["group_source"] == ""


def test_a_kernel_no_hlo_op_launched_has_no_cost_data(tpu_table):
    op = _row(tpu_table, "my_kernel")
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.NO_COST_DATA.value, BoundBasis.NONE.value)
    assert np.isnan(op["flop_rate"]) and np.isnan(op["hbm_bw"]) and np.isnan(op["flop_utilization"])
    assert np.isnan(op["hbm_utilization"])


def test_ops_come_in_order_of_first_appearance(tpu_table):
    assert tpu_table["name"].astype(str).tolist() == [o[0] for o in TPU_OPS]


def test_an_ici_rate_above_the_chips_peak_is_no_rate():
    # 6144 B in 0.01 µs: 614 GB/s, above the 100 GB/s ICI peak
    table = aggregate_ops(_host([("all-reduce.1", "all-reduce", [(0, 0.01, 0.01)], 0.0, 0.0, 0.0, AR_TEXT)]))
    op = _row(table, "all-reduce.1")
    assert np.isnan(op["ici_bw"]) and np.isnan(op["ici_utilization"]) and op["ici_bytes"] == pytest.approx(6144)


def test_without_a_chip_a_collective_has_no_ici_utilization():
    device = DeviceInfo(Platform.TPU, "t", None, 1e14, 1e12, PeaksSource.TRACE, 1, 4)
    table = aggregate_ops(_host([("all-reduce.1", "all-reduce", [(0, 10, 10)], 0.0, 0.0, 0.0, AR_TEXT)], device))
    op = _row(table, "all-reduce.1")
    assert op["ici_bw"] == pytest.approx(6144 / 1e-5)
    assert np.isnan(op["ici_utilization"]) and not op["ici_latency_bound"]


def test_without_peaks_an_op_with_cost_has_no_peak_known():
    cpu = DeviceInfo(Platform.CPU, "", None, None, None, PeaksSource.NONE, 1, 1)
    table = aggregate_ops(_host([("dot.1", "dot", [(0, 10, 10)], 1e9, 0.0, 0.0, ""),
                                 ("copy.1", "copy", [(20, 10, 10)], 0.0, 1e6, 1e6, ""),
                                 ("tuple.1", "tuple", [(40, 1, 1)], 0.0, 0.0, 0.0, "")], cpu))
    assert _row(table, "dot.1")["bound_by"] == BoundBy.NO_PEAK.value
    assert _row(table, "copy.1")["bound_by"] == BoundBy.NO_PEAK.value
    assert _row(table, "tuple.1")["bound_by"] == BoundBy.LATENCY.value
    assert np.isnan(_row(table, "dot.1")["flop_utilization"]) and _row(table, "dot.1")["flop_rate"] == pytest.approx(1e14)
    assert np.isnan(_row(table, "copy.1")["hbm_utilization"]) and _row(table, "copy.1")["hbm_bw"] == pytest.approx(1e11)


def test_a_gpu_op_the_cost_analysis_gave_nothing_has_no_cost_data():
    gpu = DeviceInfo(Platform.GPU, "H100", None, 1e14, 1e12, PeaksSource.TRACE, 1, 1)
    table = aggregate_ops(_host([("custom-call.1", "custom-call", [(0, 10, 10)], 0.0, 0.0, 0.0, ""),
                                 ("fusion.1", "loop fusion", [(20, 10, 10)], 0.0, 1e6, 1e6, "")], gpu))
    assert _row(table, "custom-call.1")["bound_by"] == BoundBy.NO_COST_DATA.value
    assert _row(table, "fusion.1")["bound_by"] == BoundBy.HBM.value


VMEM_TEXT = "%{} = f32[262144]{{0:S(1)}} fusion(f32[262144]{{0:S(1)}} %p), kind=kLoop, calls=%f"


def test_the_vmem_level_binds_from_a_tenth_of_its_peak():
    # 1 MiB read and 1 MiB written in VMEM (S(1)); peaks 1 TB/s read, 2 TB/s write.
    # fusion.5 in 2 µs: read 0.524288 of its peak, write 0.262144: VMEM binds, at the read side.
    # fusion.6 in 20 µs: read 0.0524288, under a tenth: not VMEM; nothing else: latency.
    vmem = VmemBandwidth(1e12, 2e12, "test")
    device = DeviceInfo(Platform.TPU, "t", CHIP, 1e14, 1e12, PeaksSource.TRACE, 1, 4, vmem=vmem)
    table = aggregate_ops(_host([("fusion.5", "loop fusion", [(0, 2, 2)], 1e6, 0.0, 0.0, VMEM_TEXT.format("fusion.5")),
                                 ("fusion.6", "loop fusion", [(10, 20, 20)], 0.0, 0.0, 0.0,
                                  VMEM_TEXT.format("fusion.6"))], device))
    five, six = _row(table, "fusion.5"), _row(table, "fusion.6")
    assert (five["vmem_read_bytes"], five["vmem_write_bytes"]) == (2**20, 2**20)
    assert five["vmem_utilization"] == pytest.approx(2**20 / 2e-6 / 1e12)
    assert five["vmem_intensity"] == pytest.approx(1e6 / 2**20)
    assert (five["bound_by"], five["bound_basis"]) == (BoundBy.VMEM.value, BoundBasis.VMEM_BYTES.value)
    assert six["vmem_utilization"] == pytest.approx(2**20 / 2e-5 / 1e12) and np.isnan(six["vmem_intensity"])
    assert six["bound_by"] == BoundBy.LATENCY.value
    # without a VMEM peak there is no VMEM level
    plain = aggregate_ops(_host([("fusion.5", "loop fusion", [(0, 2, 2)], 1e6, 0.0, 0.0,
                                  VMEM_TEXT.format("fusion.5"))]))
    assert np.isnan(_row(plain, "fusion.5")["vmem_utilization"])
    assert _row(plain, "fusion.5")["bound_by"] == BoundBy.COMPUTE.value


def test_an_empty_host_has_an_empty_table():
    host = _host(TPU_OPS)
    host.events = host.events.iloc[:0]
    table = aggregate_ops(host)
    assert table.empty and list(table.columns) == schemas.OPS.names


WRITE_TEXT = "%{} = f32[262144]{{0:S(1)}} fusion(f32[262144]{{0}} %p), kind=kLoop, calls=%f"  # HBM in, VMEM out


def test_the_vmem_level_in_each_direction_and_at_its_edges():
    # peaks 1 TB/s read, 2 TB/s write; 1 MiB = 2^20 B
    vmem = VmemBandwidth(1e12, 2e12, "test")
    device = DeviceInfo(Platform.TPU, "t", CHIP, 1e14, 1e12, PeaksSource.TRACE, 1, 4, vmem=vmem)
    table = aggregate_ops(_host([
        # writes 1 MiB to VMEM in 1 µs, 1e6 FLOP: write 0.524288 of its peak, binds; FLOPs per written byte
        ("w.1", "loop fusion", [(0, 1, 1)], 1e6, 0.0, 0.0, WRITE_TEXT.format("w.1")),
        # 1 MiB read and written in exactly 2^20 ps: read at exactly its peak (a rate, 1.0)
        ("edge.1", "loop fusion", [(10, 1.048576, 1.048576)], 0.0, 0.0, 0.0, VMEM_TEXT.format("edge.1")),
        # the same in half the time: 2x the read peak: no rate, but VMEM still binds it
        ("over.1", "loop fusion", [(20, 0.524288, 0.524288)], 0.0, 0.0, 0.0, VMEM_TEXT.format("over.1")),
        # FLOPs and no VMEM bytes: no VMEM utilization or intensity
        ("plain.1", "loop fusion", [(30, 10, 10)], 1e9, 1e6, 1e6, ""),
        # VMEM bytes in no time: no rate at all
        ("zero.1", "loop fusion", [(40, 0, 0)], 0.0, 0.0, 0.0, VMEM_TEXT.format("zero.1")),
    ], device))
    w = _row(table, "w.1")
    assert (w["vmem_read_bytes"], w["vmem_write_bytes"]) == (0, 2**20)
    assert w["vmem_utilization"] == pytest.approx(2**20 / 1e-6 / 2e12)
    assert w["vmem_intensity"] == pytest.approx(1e6 / 2**20) and w["bound_by"] == BoundBy.VMEM.value
    edge = _row(table, "edge.1")
    assert edge["vmem_utilization"] == 1.0 and edge["bound_by"] == BoundBy.VMEM.value
    over = _row(table, "over.1")
    assert np.isnan(over["vmem_utilization"]) and over["bound_by"] == BoundBy.VMEM.value
    plain = _row(table, "plain.1")
    assert np.isnan(plain["vmem_utilization"]) and np.isnan(plain["vmem_intensity"])
    assert plain["bound_by"] == BoundBy.COMPUTE.value
    zero = _row(table, "zero.1")
    assert np.isnan(zero["vmem_utilization"]) and zero["bound_by"] == BoundBy.LATENCY.value
    assert (zero["flop_rate"], zero["hbm_bw"]) == (0.0, 0.0)


def test_a_vmem_peak_needs_both_directions():
    for vmem in (VmemBandwidth(0.0, 2e12, "half"), VmemBandwidth(1e12, 0.0, "half")):
        device = DeviceInfo(Platform.TPU, "t", CHIP, 1e14, 1e12, PeaksSource.TRACE, 1, 4, vmem=vmem)
        table = aggregate_ops(_host([("fusion.5", "loop fusion", [(0, 2, 2)], 1e6, 0.0, 0.0,
                                      VMEM_TEXT.format("fusion.5"))], device))
        op = _row(table, "fusion.5")
        assert np.isnan(op["vmem_utilization"]) and np.isnan(op["vmem_intensity"])
        assert op["bound_by"] == BoundBy.COMPUTE.value


def test_an_event_without_a_module_still_counts():
    # a kernel launched outside XLA records no module: the table counts it as any other, and keeps
    # the ops in order of first appearance (fusion.2, my_kernel, fusion.1)
    host = _host([("fusion.2", "loop fusion", [(0, 10, 10), (50, 10, 10)], 1e6, 1e7, 1e7, ""),
                  ("my_kernel", NON_XLA_KERNEL, [(20, 2, 2), (30, 4, 3)], 0.0, 0.0, 0.0, ""),
                  ("fusion.1", "convolution fusion", [(40, 5, 5)], 5e8, 1e6, 1e6, "")])
    module = host.events["module"].astype(object)
    module[host.events["name"].astype(str) == "my_kernel"] = None
    host.events["module"] = pd.Categorical(module)
    table = aggregate_ops(host)
    assert table["name"].astype(str).tolist() == ["fusion.2", "my_kernel", "fusion.1"]
    assert table[["occurrences", "total_time_ps", "self_time_ps"]].to_numpy().tolist() == [
        [2, 20 * US, 20 * US], [2, 6 * US, 5 * US], [1, 5 * US, 5 * US]]
    assert _row(table, "fusion.2")["module"] == "jit_step"
    assert _row(table, "fusion.2")["hbm_bw"] == pytest.approx(2e7 / 2e-5)


HOST_COPY = "%copy-start.3 = (f32[1024]{0:S(5)}, f32[1024]{0}, u32[]) copy-start(f32[1024]{0} %p)"


def test_an_async_copy_to_host_memory_is_bound_by_the_host_link_start_and_done():
    # copy-start.3 moves 4 KiB from HBM to host memory (S(5)); its done shares its pair key, a device
    # copy (copy-start.4, HBM to VMEM) does not
    host = _host([("copy-start.3", "copy-start", [(0, 1, 1)], 0.0, 8192.0, 8192.0, HOST_COPY),
                  ("copy-done.3", "copy-done", [(10, 1, 1)], 0.0, 0.0, 0.0, ""),
                  ("copy-start.4", "copy-start", [(20, 1, 1)], 0.0, 8192.0, 8192.0,
                   "%copy-start.4 = (f32[1024]{0:S(1)}, f32[1024]{0}, u32[]) copy-start(f32[1024]{0} %p)"),
                  ("copy-done.4", "copy-done", [(30, 1, 1)], 0.0, 0.0, 0.0, "")])
    table = aggregate_ops(host)
    assert _row(table, "copy-start.3")["moves"] == "hbm->host"
    assert _row(table, "copy-start.3")["host_write_bytes"] == 4096
    for name in ("copy-start.3", "copy-done.3"):
        assert (_row(table, name)["bound_by"], _row(table, name)["bound_basis"]) == (BoundBy.HOST_LINK.value,
                                                                                     BoundBasis.MEMORY_SPACE.value)
    assert _row(table, "copy-start.4")["moves"] == "hbm->vmem"
    assert _row(table, "copy-start.4")["bound_by"] != BoundBy.HOST_LINK.value
    assert _row(table, "copy-done.4")["bound_by"] != BoundBy.HOST_LINK.value


def test_bytes_by_space_are_totals_over_occurrences():
    vmem = VmemBandwidth(1e12, 2e12, "test")
    device = DeviceInfo(Platform.TPU, "t", CHIP, 1e14, 1e12, PeaksSource.TRACE, 1, 4, vmem=vmem)
    table = aggregate_ops(_host([("fusion.5", "loop fusion", [(0, 2, 2), (10, 2, 2), (20, 2, 2)], 1e6, 0.0, 0.0,
                                  VMEM_TEXT.format("fusion.5"))], device))
    five = _row(table, "fusion.5")
    assert (five["vmem_read_bytes"], five["vmem_write_bytes"]) == (3 * 2**20, 3 * 2**20)
    assert five["vmem_utilization"] == pytest.approx(3 * 2**20 / 6e-6 / 1e12)
    assert (five["hbm_read_bytes"], five["host_read_bytes"], five["moves"]) == (0.0, 0.0, "")


def _all_reduce(name: str, elements: int) -> str:
    return (f"%{name} = f32[{elements}]{{0}} all-reduce(f32[{elements}]{{0}} %p), replica_groups={{{{0,1,2,3}}}}, "
            "to_apply=%add")


def test_latency_bound_is_judged_per_occurrence():
    # all-reduce over 4: 1.5 x payload per device; ICI peak 1e11 B/s, so at peak a byte takes 10 ps;
    # latency-bound: under 2 µs at peak and under a tenth of the time. Per occurrence:
    #   ar.1: 2 x (100,000 B payload -> 150,000 B, 20 µs): 1.5 µs at peak, < 2 µs and < 2 µs: bound
    #   ar.2: 2 x (150,000 B, 10 µs): 1.5 µs at peak, not under a tenth of 10 µs: not bound
    #   ar.3: 1 x (200,000 B payload -> 300,000 B, 100 µs): 3 µs at peak, over the 2 µs: not bound
    table = aggregate_ops(_host([
        ("ar.1", "all-reduce", [(0, 20, 20), (100, 20, 20)], 0.0, 0.0, 0.0, _all_reduce("ar.1", 25000)),
        ("ar.2", "all-reduce", [(200, 10, 10), (300, 10, 10)], 0.0, 0.0, 0.0, _all_reduce("ar.2", 25000)),
        ("ar.3", "all-reduce", [(400, 100, 100)], 0.0, 0.0, 0.0, _all_reduce("ar.3", 50000))]))
    assert _row(table, "ar.1")["ici_bytes"] == 300_000 and _row(table, "ar.3")["ici_bytes"] == 300_000
    assert [bool(_row(table, n)["ici_latency_bound"]) for n in ("ar.1", "ar.2", "ar.3")] == [True, False, False]


def test_a_collective_without_hlo_text_takes_its_result_shape_and_every_chip():
    host = _host([("all-reduce.1", "all-reduce", [(0, 10, 10)], 0.0, 0.0, 0.0, "")])
    host.op_metadata["shape_with_layout"] = pd.array(["f32[1024]{0}"], dtype="string")
    op = _row(aggregate_ops(host), "all-reduce.1")
    assert (op["group_size"], op["group_source"], op["ici_bytes"]) == (4, "assumed", 6144)


def test_a_done_whose_start_is_not_in_the_capture_keeps_its_own_figures():
    host = _host([("all-gather-done.1", "all-gather", [(0, 1, 1)], 0.0, 0.0, 0.0, "")])
    host.op_metadata["shape_with_layout"] = pd.array(["f32[1024]{0}"], dtype="string")
    op = _row(aggregate_ops(host), "all-gather-done.1")
    assert (op["group_size"], op["group_source"], op["ici_bytes"]) == (4, "assumed", 3072)


def test_a_collective_of_no_time_has_no_rate():
    device = DeviceInfo(Platform.TPU, "t", None, 1e14, 1e12, PeaksSource.TRACE, 1, 4)
    table = aggregate_ops(_host([("all-reduce.1", "all-reduce", [(0, 0, 0)], 0.0, 0.0, 0.0, AR_TEXT)], device))
    assert np.isnan(_row(table, "all-reduce.1")["ici_bw"])


COPY_START = "%copy-start.1 = (f32[262144]{0:S(1)}, f32[262144]{0}, u32[]) copy-start(f32[262144]{0} %p)"
COPY_DONE = ("%copy-done.1 = f32[262144]{0:S(1)} copy-done((f32[262144]{0:S(1)}, f32[262144]{0}, u32[]) "
             "%copy-start.1)")
FED = "%fusion.7 = f32[262144]{0} fusion(f32[262144]{0:S(1)} %copy-done.1), kind=kLoop, calls=%f"


def test_an_op_fed_by_an_async_copy_counts_the_copied_bytes_on_its_hbm_roof():
    # fusion.7 reads 1 MiB that copy-start.1 brought into VMEM from HBM and writes 1 MiB to HBM, in 4 µs,
    # with 1.6e8 FLOP: FLOPs at 0.4 of the peak; its own 1 MiB at 0.262 of HBM's, with the copied MiB
    # 0.524: the HBM roof binds once the copy's bytes count (the `*` of the tables)
    table = aggregate_ops(_host([
        ("copy-start.1", "copy-start", [(0, 1, 1)], 0.0, 2**21, 2**21, COPY_START),
        ("copy-done.1", "copy-done", [(5, 1, 1)], 0.0, 0.0, 0.0, COPY_DONE),
        ("fusion.7", "loop fusion", [(10, 4, 4)], 1.6e8, 2**20, 2**20, FED)]))
    op = _row(table, "fusion.7")
    assert op["copied_hbm_bytes"] == 2**20
    assert op["flop_utilization"] == pytest.approx(0.4) and op["hbm_utilization"] == pytest.approx(2**20 / 4e-6 / 1e12)
    assert op["hbm_intensity"] == pytest.approx(1.6e8 / 2**21)
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.HBM.value, BoundBasis.COPIED_BYTES.value)
    start = _row(table, "copy-start.1")  # the copy itself moves its bytes over its window: not judged so
    assert start["moves"] == "hbm->vmem" and start["bound_basis"] != BoundBasis.COPIED_BYTES.value
    # without an HBM peak nothing is judged by copied bytes
    device = DeviceInfo(Platform.TPU, "t", CHIP, 1e14, None, PeaksSource.TRACE, 1, 4)
    plain = aggregate_ops(_host([("copy-done.1", "copy-done", [(5, 1, 1)], 0.0, 0.0, 0.0, COPY_DONE),
                                 ("fusion.7", "loop fusion", [(10, 4, 4)], 1.6e8, 2**20, 2**20, FED)], device))
    assert (_row(plain, "fusion.7")["bound_by"], _row(plain, "fusion.7")["bound_basis"]) == (
        BoundBy.COMPUTE.value, BoundBasis.UTILIZATION.value)


def test_a_few_copied_bytes_leave_a_compute_bound_op_compute_bound():
    # fusion.8 reads 4 KiB its copy brought, writes 4 KiB, in 4 µs with 1.6e8 FLOP (0.4 of the peak):
    # with the copied bytes its HBM roof is at 8 KiB / 4 µs, 0.2 % of HBM's: compute binds, and the
    # basis says the copied bytes were counted
    start = "%copy-start.2 = (f32[1024]{0:S(1)}, f32[1024]{0}, u32[]) copy-start(f32[1024]{0} %p)"
    done = "%copy-done.2 = f32[1024]{0:S(1)} copy-done((f32[1024]{0:S(1)}, f32[1024]{0}, u32[]) %copy-start.2)"
    fed = "%fusion.8 = f32[1024]{0} fusion(f32[1024]{0:S(1)} %copy-done.2), kind=kLoop, calls=%f"
    table = aggregate_ops(_host([("copy-start.2", "copy-start", [(0, 1, 1)], 0.0, 8192.0, 8192.0, start),
                                 ("copy-done.2", "copy-done", [(5, 1, 1)], 0.0, 0.0, 0.0, done),
                                 ("fusion.8", "loop fusion", [(10, 4, 4)], 1.6e8, 4096.0, 4096.0, fed)]))
    op = _row(table, "fusion.8")
    assert op["copied_hbm_bytes"] == 4096
    assert (op["bound_by"], op["bound_basis"]) == (BoundBy.COMPUTE.value, BoundBasis.COPIED_BYTES.value)


def test_a_collective_known_by_its_name_alone():
    table = aggregate_ops(_host([("all-reduce.7", "custom-call", [(0, 10, 10)], 0.0, 0.0, 0.0, AR_TEXT)]))
    assert (_row(table, "all-reduce.7")["family"], _row(table, "all-reduce.7")["bound_by"]) == ("all-reduce",
                                                                                                "collective")
