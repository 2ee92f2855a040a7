"""The per-op static estimates (`analysis.cost_model.op_estimates`) of a hand-written program, each
number worked out by hand from the module's stated model: compute = cycles / clock; FLOPs floor =
FLOPs / peak; HBM = bytes in HBM / bandwidth; ICI = latency + ring factor x payload / bandwidth; an
op's time the largest, at least `min_op_ps`; an async start's transfer in `window_ps`.

Model: 1 GHz, 1 TB/s HBM (1 B per ps), 1 TFLOP/s (1 FLOP per ps), ICI 100 GB/s with 1 ns latency.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from tpudiag.analysis.cost_model import CostModel, IciModel, op_estimates, xprof_category
from tpudiag.model.hardware import chip_for
from tpudiag.parsers.hlo_text import parse_hlo_text

MODEL = CostModel(clock_hz=1e9, hbm_bytes_per_s=1e12, ici=IciModel(bytes_per_s=1e11, latency_ps=1000),
                  peak_flops_per_s=1e12)

HLO = """HloModule est

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

%fused_loop (q: f32[1024]) -> f32[1024] {
  %q = f32[1024]{0} parameter(0)
  ROOT %n = f32[1024]{0} negate(%q)
}

%fused_reduce (r: f32[1024]) -> f32[] {
  %r = f32[1024]{0} parameter(0)
  %z = f32[] constant(0)
  ROOT %red = f32[] reduce(%r, %z), dimensions={0}, to_apply=%add
}

%wrapped_ar (w: f32[1024]) -> f32[1024] {
  %w = f32[1024]{0} parameter(0)
  ROOT %inner_ar = f32[1024]{0} all-reduce(%w), replica_groups={{0,1}}, to_apply=%add
}

ENTRY %main (a: bf16[128,128], v: f32[1024]) -> f32[1024] {
  %a = bf16[128,128]{1,0} parameter(0)
  %v = f32[1024]{0} parameter(1)
  %conv = bf16[128,128]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot, backend_config={"bundle_analysis_data":{"estimated_cycles":"1000"}}
  %loop = f32[1024]{0} fusion(%v), kind=kLoop, calls=%fused_loop
  %rfus = f32[] fusion(%v), kind=kInput, calls=%fused_reduce
  %inp = f32[1024]{0} fusion(%v), kind=kInput, calls=%fused_loop
  %out = f32[1024]{0} fusion(%v), kind=kOutput, calls=%fused_loop
  %cus = f32[1024]{0} fusion(%v), kind=kCustom, calls=%fused_loop
  %dot = bf16[128,128]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %cs = (f32[1024]{0}, f32[1024]{0:S(1)}, u32[]) copy-start(%v)
  %cd = f32[1024]{0:S(1)} copy-done(%cs)
  %arf = f32[1024]{0} fusion(%v), kind=kCustom, calls=%wrapped_ar
  %neg = f32[1024]{0} negate(%v)
  ROOT %ar = f32[1024]{0} all-reduce(%v), replica_groups={{0,1}}, to_apply=%add
}
"""
DOT_FLOPS = 2 * 128**3  # 4,194,304


@pytest.fixture  # per test, not per module: mutmut maps a test to the functions it calls itself
def ops() -> pd.DataFrame:
    matmul = {("fused_dot", "d"): float(DOT_FLOPS), ("main", "dot"): 1e6}
    spills = pd.DataFrame({"hlo": ["conv", "conv", "loop"], "spill_stores": [3, 1, pd.NA],
                           "spill_fills": [4, pd.NA, pd.NA]})
    return op_estimates(parse_hlo_text(HLO), MODEL, 4, {"ar": 2}, spills, matmul).set_index("name")


def test_each_working_entry_op_has_a_row_in_schedule_order(ops):
    assert ops.index.tolist() == ["conv", "loop", "rfus", "inp", "out", "cus", "dot", "cs", "cd", "arf", "neg", "ar"]
    assert ops["position"].is_monotonic_increasing


def test_categories_in_xprofs_words(ops):
    assert ops["category"].tolist() == ["convolution fusion", "loop fusion", "reduction fusion", "input fusion",
                                        "output fusion", "custom fusion", "convolution", "copy-start", "copy-done",
                                        "all-reduce fusion", "negate", "all-reduce"]


def test_a_matmul_fusion_takes_the_largest_of_its_times(ops):
    conv = ops.loc["conv"]
    # 1000 cycles at 1 GHz: 1 µs; 2 x 128^3 FLOPs at 1 FLOP/ps: 4,194,304 ps; 3 x 32 KiB at 1 B/ps: 98,304 ps
    assert (conv["estimated_cycles"], conv["cycles_source"], conv["compute_ps"]) == (1000, "bundle_analysis_data",
                                                                                   1_000_000)
    assert (conv["flops"], conv["flops_ps"]) == (DOT_FLOPS, DOT_FLOPS)
    assert (conv["logical_bytes"], conv["padded_bytes"], conv["hbm_bytes"], conv["hbm_ps"]) == (98304,) * 4
    assert conv["duration_ps"] == DOT_FLOPS
    assert (conv["payload_bytes"], conv["group_size"], conv["ici_ps"], conv["window_ps"]) == (0, 0, 0, 0)
    assert (conv["family"], conv["async_role"], conv["partner"], conv["pair_kind"]) == ("", "", "", "")


def test_a_small_op_takes_at_least_the_minimum(ops):
    loop = ops.loc["loop"]
    assert (loop["hbm_bytes"], loop["hbm_ps"], loop["duration_ps"]) == (8192, 8192, MODEL.min_op_ps)
    assert pd.isna(loop["estimated_cycles"]) and pd.isna(loop["compute_ps"]) and loop["cycles_source"] == ""
    assert ops.loc["rfus", "hbm_bytes"] == 4096 + 4  # the vector read, the scalar written
    assert ops.loc["dot", "flops"] == 1e6 and ops.loc["dot", "duration_ps"] == 1_000_000


def test_an_async_copy_moves_its_done_over_hbm_in_its_window(ops):
    cs, cd = ops.loc["cs"], ops.loc["cd"]
    assert (cs["async_role"], cs["partner"], cs["pair_kind"]) == ("start", "cd", "copy")
    assert (cd["async_role"], cd["partner"], cd["pair_kind"]) == ("done", "cs", "copy")
    assert cs["window_ps"] == 4096 and cd["window_ps"] == 0  # the 4 KiB result crosses HBM once
    assert cs["duration_ps"] == cd["duration_ps"] == MODEL.min_op_ps


def test_a_collective_takes_latency_plus_its_ring_traffic(ops):
    ar = ops.loc["ar"]
    # group 2 (as stated), all-reduce 2 x 1/2 x 4096 B at 0.1 B/ps: 40,960 ps, plus 1,000 ps of latency
    assert (ar["family"], ar["payload_bytes"], ar["group_size"], ar["ici_ps"]) == ("all-reduce", 4096, 2, 41960)
    assert ar["duration_ps"] == 41960 and ar["window_ps"] == 0
    arf = ops.loc["arf"]  # a wrapper: its inner all-reduce, over every device of 4 (no group stated for it)
    assert (arf["family"], arf["payload_bytes"], arf["group_size"]) == ("all-reduce", 4096, 4)
    assert arf["ici_ps"] == 1000 + int(2 * 3 / 4 * 4096 * 10)


def test_spills_sum_per_entry_op_and_unknown_stays_unknown(ops):
    assert (ops.loc["conv", "spill_stores"], ops.loc["conv", "spill_fills"]) == (4, 4)
    assert pd.isna(ops.loc["loop", "spill_stores"]) and pd.isna(ops.loc["loop", "spill_fills"])
    assert pd.isna(ops.loc["neg", "spill_stores"])


def test_without_a_clock_or_peak_there_is_no_compute_time_or_floor():
    model = CostModel(clock_hz=None, hbm_bytes_per_s=1e12, ici=IciModel(bytes_per_s=1e11, latency_ps=1000))
    ops = op_estimates(parse_hlo_text(HLO), model, 4, None, None, {("fused_dot", "d"): float(DOT_FLOPS)})
    conv = ops.set_index("name").loc["conv"]
    assert conv["estimated_cycles"] == 1000 and pd.isna(conv["compute_ps"])
    assert conv["flops_ps"] == 0 and conv["duration_ps"] == 98304


def test_the_model_for_a_chip_is_per_core_with_both_link_directions():
    chip = replace(chip_for("v5p"), tensorcores_per_chip=2)  # two cores share the chip's peaks
    model = CostModel.for_chip(chip)
    assert model.clock_hz == chip.clock_hz and not model.clock_given
    assert model.hbm_bytes_per_s == chip.hbm_bytes_per_s / 2
    assert model.peak_flops_per_s == chip.peak_bf16_flops_per_s / 2
    assert model.ici.bytes_per_s == 2 * chip.ici_bytes_per_s_per_link and model.ici.latency_ps == 2_000_000
    given = CostModel.for_flags(chip, 1.5, 50.0, 3.0)
    assert (given.clock_hz, given.clock_given, given.ici.bytes_per_s, given.ici.latency_ps) == (1.5e9, True, 5e10,
                                                                                                3_000_000)
    kept = CostModel.for_flags(chip, None, None, None)
    assert kept == model
    assert CostModel.for_flags(chip, None, None, 0.0).ici.latency_ps == 0


def test_ici_model_arithmetic():
    ici = IciModel(bytes_per_s=1e11, latency_ps=500)
    # all-gather over 8: 7/8 x 8000 B = 7000 B at 0.1 B/ps = 70,000 ps
    assert ici.collective_ps("all-gather", 8000, 8) == 70_500
    assert ici.collective_ps("collective-permute", 8000, 8) == 80_500
    assert IciModel.factor("all-reduce", 4) == 1.5


def test_a_reduce_scatter_fusion_is_xprofs_all_reduce_scatter_fusion():
    program = parse_hlo_text("""HloModule rs

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%wrapped (p: f32[1024]) -> f32[256] {
  %p = f32[1024]{0} parameter(0)
  ROOT %r = f32[256]{0} reduce-scatter(%p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}

ENTRY %main (a: f32[1024]) -> f32[256] {
  %a = f32[1024]{0} parameter(0)
  ROOT %rsf = f32[256]{0} fusion(%a), kind=kCustom, calls=%wrapped
}
""")
    assert xprof_category(program, program.find("rsf")) == "all-reduce-scatter fusion"


def test_compiler_cycles_decide_when_they_are_the_longest_and_a_done_waits_no_transfer():
    # loop: 50,000 cycles at 1 GHz = 50 µs, longer than its 8 KiB of HBM (8,192 ps): its time.
    # cs/cd copy 1 MiB into VMEM: the done's operand tuple holds 1 MiB in HBM (1,048,580 ps at 1 B/ps),
    # but a pair's done excludes the transfer (the start's window holds it): the minimum op time.
    program = parse_hlo_text("""HloModule big

%fused_loop (q: f32[1024]) -> f32[1024] {
  %q = f32[1024]{0} parameter(0)
  ROOT %n = f32[1024]{0} negate(%q)
}

ENTRY %main (v: f32[1024], w: f32[262144]) -> f32[262144] {
  %v = f32[1024]{0} parameter(0)
  %w = f32[262144]{0} parameter(1)
  %loop = f32[1024]{0} fusion(%v), kind=kLoop, calls=%fused_loop, backend_config={"bundle_analysis_data":{"estimated_cycles":"50000"}}
  %cs = (f32[262144]{0:S(1)}, f32[262144]{0}, u32[]) copy-start(%w)
  ROOT %cd = f32[262144]{0:S(1)} copy-done(%cs)
}
""")
    ops = op_estimates(program, MODEL, 1).set_index("name")
    assert (ops.loc["loop", "compute_ps"], ops.loc["loop", "duration_ps"]) == (50_000_000, 50_000_000)
    assert ops.loc["cd", "hbm_ps"] > MODEL.min_op_ps and ops.loc["cd", "duration_ps"] == MODEL.min_op_ps
    assert ops.loc["cs", "window_ps"] == 2**20 and ops.loc["cs", "duration_ps"] == MODEL.min_op_ps
