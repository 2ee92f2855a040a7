"""`analysis.cost_model.estimate_program`: a compile output's per-op estimates for its target chip,
with the CLI's overrides (GHz, GB/s, µs) and its replica groups, spills, matmul FLOPs and device
count each reaching the estimate. Every number worked by hand from the module's model and v5e's
public figures (197 TFLOP/s bf16, 819 GB/s HBM, 1.5 GHz, 45 GB/s per ICI link, one core a chip)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tpudiag.analysis.cost_model import CostModel, IciModel, estimate_program
from tpudiag.model.compile_output import CompileOutput
from tpudiag.model.hardware import chip_for
from tpudiag.parsers.hlo_text import parse_hlo_text

HLO = """HloModule wiring

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused_dot (p0: bf16[128,128], p1: bf16[128,128]) -> bf16[128,128] {
  %p0 = bf16[128,128]{1,0} parameter(0)
  %p1 = bf16[128,128]{1,0} parameter(1)
  ROOT %d = bf16[128,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[128,128], v: f32[1024]) -> f32[1024] {
  %a = bf16[128,128]{1,0} parameter(0)
  %v = f32[1024]{0} parameter(1)
  %conv = bf16[128,128]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot, backend_config={"bundle_analysis_data":{"estimated_cycles":"1000"}}
  %ar1 = f32[1024]{0} all-reduce(%v), replica_groups={{0,1}}, to_apply=%add
  ROOT %ar2 = f32[1024]{0} all-reduce(%ar1), replica_groups={}, to_apply=%add
}
"""


def _output(**facts) -> CompileOutput:
    # ar1's group of 2 is stated; ar2 states none, so it spans the compile's devices
    return CompileOutput(path=Path("/runs/out"), facts={"generation": "v5e", **facts},
                         program=parse_hlo_text(HLO), group_sizes={"ar1": 2},
                         spills=pd.DataFrame({"hlo": ["conv"], "spill_stores": [3], "spill_fills": [4]}),
                         matmul_flops={("fused_dot", "d"): 2 * 128**3}, hlo_proto=None)


def _rows(est) -> dict[str, dict]:
    return est.ops.set_index("name").to_dict("index")


def test_the_overrides_the_groups_the_spills_and_the_flops_reach_each_op():
    est = estimate_program(_output(n_devices=4), clock_ghz=2.0, ici_gbps=100.0, ici_latency_us=1.0)
    assert est.chip is chip_for("v5e") and est.n_devices == 4
    # 2 GHz, 100 GB/s, 1 µs = 1,000,000 ps; HBM and peak are v5e's (one core a chip)
    assert est.model == CostModel(clock_hz=2e9, clock_given=True, hbm_bytes_per_s=819e9,
                                  ici=IciModel(bytes_per_s=1e11, latency_ps=1_000_000), peak_flops_per_s=197e12)
    rows = _rows(est)
    assert list(rows) == ["conv", "ar1", "ar2"]
    conv, ar1, ar2 = rows["conv"], rows["ar1"], rows["ar2"]
    # 1000 cycles at 2 GHz = 500 ns; 2 x 128^3 FLOPs / 197e12 per s = 21,290.9 ps
    assert conv["compute_ps"] == 500_000 and conv["flops"] == 4_194_304.0 and conv["flops_ps"] == 21_290
    assert (conv["spill_stores"], conv["spill_fills"]) == (3, 4) and conv["duration_ps"] == 500_000
    # 4 KiB all-reduced over 2: factor 2 x 1/2 = 1, 4096 B / 1e11 B/s = 40,960 ps, plus 1 µs
    assert (ar1["group_size"], ar1["payload_bytes"], ar1["ici_ps"]) == (2, 4096, 1_040_960)
    # over the 4 devices: factor 2 x 3/4 = 1.5
    assert (ar2["group_size"], ar2["ici_ps"]) == (4, 1_061_440)


def test_without_overrides_the_chips_figures_and_one_device():
    est = estimate_program(_output())
    assert est.n_devices == 1
    # v5e's 1.5 GHz; ICI both directions of a 45 GB/s link; the default latency 2 µs
    assert est.model == CostModel(clock_hz=1.5e9, clock_given=False, hbm_bytes_per_s=819e9,
                                  ici=IciModel(bytes_per_s=90e9, latency_ps=2_000_000), peak_flops_per_s=197e12)
    rows = _rows(est)
    # 1000 cycles at 1.5 GHz = 666,666 ps; a group of 1 moves nothing: the latency alone
    assert rows["conv"]["compute_ps"] == 666_666
    assert (rows["ar2"]["group_size"], rows["ar2"]["ici_ps"]) == (1, 2_000_000)
