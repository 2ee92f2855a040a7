"""The cost model counts HBM traffic only for arrays that live in HBM: an array in VMEM (`S(1)`) or
in host memory (`S(5)`) is no HBM read or write, however large."""

from __future__ import annotations

from tpudiag.analysis.cost_model import CostModel, op_estimates
from tpudiag.model.hardware import chip_for
from tpudiag.parsers.hlo_text import parse_hlo_text

# Three fusions of the same f32[1024,1024] (4 MiB) arrays, which differ only in where the arrays live:
# all in HBM; output in VMEM; operand in host memory. A 1024 x 1024 f32 array with the (8,128) tile
# needs no padding, so its padded size is exactly 4 MiB.
HLO = """HloModule spaces, entry_computation_layout={(f32[1024,1024]{1,0:T(8,128)})->f32[1024,1024]{1,0:T(8,128)}}

%fused_hbm (p0: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[1024,1024]{1,0:T(8,128)} parameter(0)
  ROOT %neg = f32[1024,1024]{1,0:T(8,128)} negate(f32[1024,1024]{1,0:T(8,128)} %p0)
}

ENTRY %main (a: f32[1024,1024], h: f32[1024,1024]) -> f32[1024,1024] {
  %a = f32[1024,1024]{1,0:T(8,128)} parameter(0)
  %h = f32[1024,1024]{1,0:T(8,128)S(5)} parameter(1)
  %all_hbm = f32[1024,1024]{1,0:T(8,128)} fusion(f32[1024,1024]{1,0:T(8,128)} %a), kind=kLoop, calls=%fused_hbm
  %to_vmem = f32[1024,1024]{1,0:T(8,128)S(1)} fusion(f32[1024,1024]{1,0:T(8,128)} %a), kind=kLoop, calls=%fused_hbm
  ROOT %from_host = f32[1024,1024]{1,0:T(8,128)} fusion(f32[1024,1024]{1,0:T(8,128)S(5)} %h), kind=kLoop, calls=%fused_hbm
}
"""
MIB4 = 4 << 20


def test_only_arrays_in_hbm_count_as_hbm_traffic():
    program = parse_hlo_text(HLO)
    ops = op_estimates(program, CostModel.for_chip(chip_for("v5e")), 1, {}, None, {}).set_index("name")
    assert ops.loc["all_hbm", "hbm_bytes"] == 2 * MIB4  # read a, write the result
    assert ops.loc["to_vmem", "hbm_bytes"] == MIB4  # read a; the result stays in VMEM
    assert ops.loc["from_host", "hbm_bytes"] == MIB4  # write the result; the operand is in host memory
