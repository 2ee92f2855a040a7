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


COLLECTIVES = """HloModule c

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%wrapped_rs (p: f32[1024]) -> f32[256] {
  %p = f32[1024]{0} parameter(0)
  ROOT %inner_rs = f32[256]{0} reduce-scatter(f32[1024]{0} %p), replica_groups={{0,1}}, dimensions={0}, to_apply=%add
}

ENTRY %main (a: f32[1024], b: f32[256]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %b = f32[256]{0} parameter(1)
  %rs = f32[256]{0} reduce-scatter(f32[1024]{0} %a), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %rsf = f32[256]{0} fusion(f32[1024]{0} %a), kind=kCustom, calls=%wrapped_rs
  %ags = (f32[256]{0}, f32[1024]{0}) all-gather-start(f32[256]{0} %b), replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %agd = f32[1024]{0} all-gather-done((f32[256]{0}, f32[1024]{0}) %ags)
}
"""


def test_collective_payload_group_and_ici_time():
    from tpudiag.analysis.cost_model import IciModel
    model = CostModel(clock_hz=None, hbm_bytes_per_s=1e12, ici=IciModel(bytes_per_s=1e11, latency_ps=1000))
    ops = op_estimates(parse_hlo_text(COLLECTIVES), model, 4, {"inner_rs": 2}).set_index("name")
    got = {n: tuple(ops.loc[n, ["payload_bytes", "group_size", "ici_ps"]]) for n in ("rs", "rsf", "ags", "agd")}
    # time = latency + ring factor x payload / bandwidth: 1,000 ps + (n-1)/n x 4096 B / 1e11 B/s.
    assert got == {
        "rs": (4096, 4, 1000 + 30720),    # the 4 KiB operand, not the 1 KiB result; every device of 4
        "rsf": (4096, 2, 1000 + 20480),   # a wrapper: its inner reduce-scatter's group (2) and payload
        "ags": (4096, 4, 1000 + 30720),   # an async start: the largest array of its tuple (the gathered 4 KiB)
        "agd": (0, 0, 0)}                 # the done carries nothing again
    assert ops.loc["ags", "window_ps"] == 31720 and ops.loc["ags", "duration_ps"] == model.min_op_ps


def test_a_profile_zero_falls_back_to_the_classic_cycle_estimate():
    import dataclasses
    from tpudiag.analysis.cost_model import op_cycles
    inst = parse_hlo_text(COLLECTIVES).find("rs")

    def cycles(estimated, config):
        return op_cycles(dataclasses.replace(inst, estimated_cycles=estimated, cycles_source="bundle_analysis_data",
                                             backend_config=config))
    classic = '{"window_config": {"estimated_cycles": "1234"}}'
    assert cycles(0, classic) == (1234, "window_config")
    assert cycles(500, classic) == (500, "bundle_analysis_data")  # a profile figure stands
    for broken in ('{"window_config": {}}', "not json window_config", "{}"):
        assert cycles(0, broken) == (0, "bundle_analysis_data")


FLOPS = """HloModule f

%inner (q: f32[8,8]) -> f32[8,8] {
  %q = f32[8,8]{1,0} parameter(0)
  ROOT %d3 = f32[8,8]{1,0} dot(%q, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  %d1 = f32[8,8]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %d2 = f32[8,8]{1,0} dot(%d1, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = f32[8,8]{1,0} fusion(%d2), kind=kOutput, calls=%inner
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %outer = f32[8,8]{1,0} fusion(%a), kind=kOutput, calls=%body
  ROOT %alone = f32[8,8]{1,0} fusion(%outer), kind=kOutput, calls=%inner
}
"""


def test_an_ops_flops_sum_every_matmul_it_calls_down_the_levels():
    from tpudiag.analysis.cost_model import IciModel
    model = CostModel(clock_hz=None, hbm_bytes_per_s=1e12, ici=IciModel(bytes_per_s=1e11, latency_ps=1000))
    matmul = {("body", "d1"): 100.0, ("body", "d2"): 30.0, ("inner", "d3"): 7.0}  # as the caller states them
    ops = op_estimates(parse_hlo_text(FLOPS), model, 1, {}, None, matmul).set_index("name")
    assert ops.loc["outer", "flops"] == 137.0
    assert ops.loc["alone", "flops"] == 7.0  # another op calling only the inner computation


def test_a_wrappers_group_size_may_be_keyed_by_the_computation_it_calls():
    from tpudiag.analysis.cost_model import IciModel
    model = CostModel(clock_hz=None, hbm_bytes_per_s=1e12, ici=IciModel(bytes_per_s=1e11, latency_ps=1000))
    ops = op_estimates(parse_hlo_text(COLLECTIVES), model, 4, {"computation:wrapped_rs": 2}).set_index("name")
    assert (ops.loc["rsf", "group_size"], ops.loc["rs", "group_size"]) == (2, 4)
