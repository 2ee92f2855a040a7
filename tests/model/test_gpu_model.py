"""GPUs named from their plane stats, and XLA's cost of GPU ops (`model.hardware`, `model.hlo_cost`).

The figures are worked by hand here; `tests/real/test_gpu_captures.py` checks the same code
against `xprof get_hlo_stats` on real captures where ../shared has them.
"""

from __future__ import annotations

import pytest

from tpudiag.model.compiled import ConvDims
from tpudiag.model.hardware import gpu_device
from tpudiag.model.hlo_cost import OpCost, convolution_flops, gpu_category, gpu_op_cost
from tpudiag.parsers.hlo_text import parse_hlo_text

MI300X = {"device_vendor": "AMD", "clock_rate": 2_100_000, "core_count": 304, "memory_bandwidth": 2_662_400_000_000,
          "memory_size": 206_141_652_992, "compute_cap_major": 9, "compute_cap_minor": 4}
V100 = {"clock_rate": 1_530_000, "core_count": 80, "memory_bandwidth": 898_048_000_000,
        "memory_size": 16_945_512_448, "compute_cap_major": 7, "compute_cap_minor": 0}


def test_an_mi300x_is_named_with_its_gfx_and_peak():
    gpu = gpu_device(MI300X)
    assert gpu.describe() == "AMD Instinct MI300 (gfx942), 304 CUs at 2.10 GHz, 192 GiB"
    assert gpu.peak_flops_per_s == pytest.approx(1307.44e12, rel=1e-5)  # xprof's get_device_information
    # ROCm's profiler writes 2 x 1,300 MHz x 8,192 bits / 8 = 2.66 TB/s; AMD's datasheet says 5.3 TB/s
    assert gpu.plane_hbm_bytes_per_s == 2.6624e12 and gpu.hbm_bytes_per_s == 5.3e12


def test_an_amd_part_not_in_the_datasheet_table_keeps_the_planes_bandwidth():
    gpu = gpu_device({**MI300X, "memory_size": 128 << 30})  # no gfx942 part with 128 GiB is listed
    assert gpu.hbm_bytes_per_s == 2.6624e12
    assert gpu_device(V100).hbm_bytes_per_s == 898_048_000_000  # NVIDIA's planes are right: kept


def test_a_v100_without_a_vendor_stat_is_nvidia_volta():
    gpu = gpu_device(V100)  # older CUPTI captures record no device_vendor
    assert gpu.describe().startswith("NVIDIA V100 (Volta, compute capability 7.0)")
    assert gpu.peak_flops_per_s == pytest.approx(125.3e12, rel=1e-3)  # 1,024 FLOPs/SM/cycle x 80 x 1.53 GHz


def test_an_unknown_generation_has_no_peak_and_says_what_it_is():
    gpu = gpu_device({"device_vendor": "Nvidia", "compute_cap_major": 6, "compute_cap_minor": 1, "core_count": 28})
    assert gpu.peak_flops_per_s is None  # never guessed
    assert gpu.describe().startswith("NVIDIA compute capability 6.1")
    assert gpu_device({"device_vendor": "AMD"}).peak_flops_per_s is None  # a plane without capabilities


def test_convolution_flops_leave_out_taps_on_padding():
    # The conv of jax-gpu-conv3d-8gpu: input [1,16,32,60,104] (b f 0 1 2), kernel [5120,16,1,2,2]
    # (o i 0 1 2), output [1,5120,34,31,53], pad 1_1 on every spatial dim, stride 1x2x2.
    # Valid (output, tap) pairs per dim: 32 (of 34 x 1), 60 (of 31 x 2), 104 (of 53 x 2).
    dims = ConvDims(input_batch=0, input_feature=1, input_spatial=(2, 3, 4), kernel_input_feature=1,
                    kernel_output_feature=0, kernel_spatial=(2, 3, 4), output_batch=0, output_feature=1,
                    output_spatial=(2, 3, 4), window=(1, 2, 2), stride=(1, 2, 2), padding=((1, 1), (1, 1), (1, 1)))
    from tpudiag.model.compiled import ArrayShape

    def arr(*d):
        return ArrayShape("bf16", d, None, 0, 0)
    flops = convolution_flops(dims, arr(1, 16, 32, 60, 104), arr(5120, 16, 1, 2, 2), arr(1, 5120, 34, 31, 53))
    assert flops == 2 * 16 * 5120 * 1 * (32 * 60 * 104)  # 32,716,554,240: xprof's per-kernel FLOPs


HLO = """\
HloModule m

%fused_dot (p0: f32[64,128], p1: f32[128,32]) -> f32[64,32] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[128,32]{1,0} parameter(1)
  ROOT %d = f32[64,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_exp (p: f32[64,32]) -> f32[64,32] {
  %p = f32[64,32]{1,0} parameter(0)
  ROOT %e = f32[64,32]{1,0} exponential(%p)
}

ENTRY %main (a: f32[64,128], b: f32[128,32]) -> f32[64,32] {
  %a = f32[64,128]{1,0} parameter(0)
  %b = f32[128,32]{1,0} parameter(1)
  %gemm = f32[64,32]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %lib = (f32[64,32]{1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm"
  ROOT %ex = f32[64,32]{1,0} fusion(%gemm), kind=kLoop, calls=%fused_exp
}
"""

def test_gpu_op_costs_as_xprof_charges_them():
    program = parse_hlo_text(HLO, "m.txt")
    gemm, lib, ex = (program.find(n) for n in ("gemm", "lib", "ex"))
    cost = gpu_op_cost(program, gemm)
    assert (cost.flops, cost.bytes_accessed, cost.category) == (2 * 64 * 128 * 32, 4 * (64 * 128 + 128 * 32 + 64 * 32),
                                                                  "custom fusion")
    assert gpu_op_cost(program, lib) == type(cost)(0.0, 0.0, "custom-call")  # a library call: no cost, as xprof
    # elementwise FLOPs are not counted (xprof's per-device op profiles); bytes are operands + result
    assert gpu_op_cost(program, ex) == type(cost)(0.0, 2 * 4 * 64 * 32, "loop fusion")
    assert gpu_category(ex) == "loop fusion"


def _conv1d(**window):
    # dim_labels bf0_oi0->bf0: input [B, C, W], kernel [O, I, K], output [B, O, W'].
    return ConvDims(input_batch=0, input_feature=1, input_spatial=(2,), kernel_input_feature=1,
                    kernel_output_feature=0, kernel_spatial=(2,), output_batch=0, output_feature=1,
                    output_spatial=(2,), **window)


@pytest.mark.parametrize(("window", "w", "k", "w_out", "pairs"), [
    # (output, tap) pairs that read a real input element, counted by hand, p = o*stride + t*rd - pad_low:
    ({}, 8, 3, 6, 18),                                    # no padding: every one of 6 x 3
    ({"stride": (2,)}, 8, 3, 3, 9),                       # outputs 0, 2, 4: 3 x 3
    ({"rhs_dilation": (2,)}, 8, 3, 4, 12),                # taps 0, 2, 4 apart: 4 x 3
    ({"lhs_dilation": (2,)}, 4, 3, 5, 8),                 # holes at odd p: 2+1+2+1+2
    ({"stride": (2,), "padding": ((2, 0),)}, 8, 3, 4, 10),  # output 0 reads -2, -1: 1+3+3+3
])
def test_convolution_flops_count_the_pairs_that_read_real_input(window, w, k, w_out, pairs):
    from tpudiag.model.compiled import ArrayShape
    b, c, o = 2, 6, 4
    flops = convolution_flops(_conv1d(**window), ArrayShape("f32", (b, c, w), None, 0, 0),
                              ArrayShape("f32", (o, c, k), None, 0, 0), ArrayShape("f32", (b, o, w_out), None, 0, 0))
    assert flops == 2 * c * o * b * pairs


def test_convolution_flops_divide_by_the_group_counts():
    from tpudiag.model.compiled import ArrayShape

    def flops(**groups):
        return convolution_flops(_conv1d(**groups), ArrayShape("f32", (2, 6, 8), None, 0, 0),
                                 ArrayShape("f32", (4, 6, 3), None, 0, 0), ArrayShape("f32", (2, 4, 6), None, 0, 0))
    assert flops() == 2 * 6 * 4 * 2 * 18
    assert flops(feature_group_count=2) == 2 * 3 * 4 * 2 * 18  # each output feature reads 6 / 2 inputs
    assert flops(batch_group_count=2) == 2 * 6 * 4 * 1 * 18


def test_a_spatial_dim_too_large_to_walk_counts_every_tap():
    # Past 2^22 (input x kernel) a dim's pairs are not walked: every tap counts, padding included.
    from tpudiag.model.compiled import ArrayShape

    def flops(width, w_out, big_first):
        big, small = (width, 1024, w_out), (3, 1, 3)
        (lw, kw, ow), (lw2, kw2, ow2) = (big, small) if big_first else (small, big)
        dims = ConvDims(input_batch=0, input_feature=1, input_spatial=(2, 3), kernel_input_feature=1,
                        kernel_output_feature=0, kernel_spatial=(2, 3), output_batch=0, output_feature=1,
                        output_spatial=(2, 3), padding=((1, 1), (0, 0)) if big_first else ((0, 0), (1, 1)))
        return convolution_flops(dims, ArrayShape("f32", (1, 1, lw, lw2), None, 0, 0),
                                 ArrayShape("f32", (1, 1, kw, kw2), None, 0, 0),
                                 ArrayShape("f32", (1, 1, ow, ow2), None, 0, 0))
    # 4096 x 1024 is exactly 2^22: walked. Of 3075 x 1024 pairs, two read the padding (-1 and 4096).
    assert flops(4096, 3075, big_first=True) == 2 * (3075 * 1024 - 2) * 3
    # 4097 x 1024 is past it: 3076 x 1024 pairs, padding counted; the other dim still multiplies.
    assert flops(4097, 3076, big_first=True) == 2 * 3076 * 1024 * 3
    assert flops(4097, 3076, big_first=False) == 2 * 3 * 3076 * 1024


NESTED_HLO = """\
HloModule m

%inner (q: f32[8,16], r: f32[16,4]) -> f32[8,4] {
  %q = f32[8,16]{1,0} parameter(0)
  %r = f32[16,4]{1,0} parameter(1)
  ROOT %d2 = f32[8,4]{1,0} dot(%q, %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%outer (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %f = f32[8,4]{1,0} fusion(%p0, %p1), kind=kOutput, calls=%inner
}

ENTRY %main (a: f32[8,16], b: f32[16,4], x: f32[2,6,8], w: f32[4,6,3]) -> f32[8,4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %x = f32[2,6,8]{2,1,0} parameter(2)
  %w = f32[4,6,3]{2,1,0} parameter(3)
  %nested = f32[8,4]{1,0} fusion(%a, %b), kind=kInput, calls=%outer
  %plain = f32[8,4]{1,0} fusion(%a, %b), calls=%outer
  %called = f32[8,4]{1,0} call(%a, %b), to_apply=%outer
  %conv = f32[2,4,6]{2,1,0} convolution(%x, %w), window={size=3}, dim_labels=bf0_oi0->bf0
  %top = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %sum = f32[8,4]{1,0} add(%nested, %plain)
}
"""


def test_gpu_op_costs_through_nested_fusions_calls_and_convolutions():
    program = parse_hlo_text(NESTED_HLO, "m.txt")
    cost = {n: gpu_op_cost(program, program.find(n)) for n in ("nested", "plain", "called", "conv", "top", "sum")}
    dot = 2 * 8 * 4 * 16  # the [8,16] x [16,4] dot two fusion levels down
    operands = 4 * (8 * 16 + 16 * 4)
    assert cost["nested"] == OpCost(dot, operands + 4 * 8 * 4, "input fusion")
    assert cost["plain"] == OpCost(dot, operands + 4 * 8 * 4, "fusion")  # no kind printed
    assert cost["called"] == OpCost(dot, operands + 4 * 8 * 4, "call")
    # the 1-D conv of test_convolution_flops_count_the_pairs_that_read_real_input: 6 x 3 pairs
    conv_flops = 2 * 6 * 4 * 2 * 18
    conv_bytes = 4 * (2 * 6 * 8 + 4 * 6 * 3) + 4 * 2 * 4 * 6
    assert cost["conv"] == OpCost(conv_flops, conv_bytes, "convolution")
    assert cost["top"] == OpCost(dot, operands + 4 * 8 * 4, "dot")  # a dot outside any fusion
    assert cost["sum"] == OpCost(0.0, 3 * 4 * 8 * 4, "add")
    assert gpu_category(program.find("f")) == "output fusion"
