"""The op math model (`tpudiag.model.matmuls`): the matmuls inside an op, read alike from HLO text and protos."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest

from tpudiag.model.matmuls import Matmul, OpMath, ProgramMath, matmul_from_shapes, op_math_from_text
from tpudiag.parsers.hlo_proto import parse_hlo_proto
from tpudiag.parsers.hlo_text import load_hlo_dump, parse_hlo_text

DUMPS = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps"


def _program(text: str):
    return ProgramMath(parse_hlo_text(text))


@pytest.mark.parametrize("example", sorted(p.name for p in DUMPS.iterdir()))
def test_text_and_proto_give_the_same_math_for_every_op(example):
    text = load_hlo_dump(DUMPS / example / "xla").programs[0]
    proto = parse_hlo_proto((DUMPS / example / "module.pb").read_bytes())
    by_text, by_proto = ProgramMath(text), ProgramMath(proto)
    names = [name for _, name in text.instructions]

    def undeclared(math):
        # A Pallas kernel's `pl.CostEstimate` is in its custom call's kernel config, which the backend
        # drops from the runtime's program (module.pb) and the XLA dump keeps: only the dump declares it.
        return dataclasses.replace(math, declared_flops=None, declared_bytes=None) if math is not None else None

    kernels = {n for n in names if "custom_call_config" in text.find(n).backend_config}
    assert not any("custom_call_config" in proto.find(n).backend_config for n in kernels)
    assert all(by_text.get(n).declared_flops > 0 for n in kernels)
    assert [undeclared(by_text.get(n)) if n in kernels else by_text.get(n) for n in names] == [
        by_proto.get(n) for n in names]
    assert any(by_text.get(n).matmuls for n in names)


def test_the_issue_s_fusion_198_is_its_convolution_with_k_from_the_window():
    """Issue 20: fusion.198's matmul is convolution.55, bf16 x bf16, M 512, N 256, K 8 x 128."""
    program = load_hlo_dump(DUMPS / "transformer_train_v5e" / "xla").programs[0]
    (mm,) = ProgramMath(program).get("fusion.198").matmuls
    assert (mm.instruction, mm.m, mm.n, mm.k, mm.batch) == ("convolution.55", 512, 256, 1024, 1)
    assert (mm.lhs_dtype, mm.rhs_dtype, mm.result_dtype) == ("bf16", "bf16", "bf16")
    assert mm.feeds == (0,)  # the updated weights, bf16[512,256]; not the all-gather buffers or flags


def test_decode_matmul_has_the_batch_as_m_and_feeds_both_outputs():
    program = load_hlo_dump(DUMPS / "llm_decode_v5e" / "xla").programs[0]
    (mm,) = ProgramMath(program).get("fusion.18").matmuls
    assert (mm.instruction, mm.m, mm.n, mm.k) == ("convolution.27", 4, 1024, 8192)
    assert mm.feeds == (0, 1)


BATCHED_DOT = """HloModule m, is_scheduled=true

%fused (p0: f32[2,8,32], p1: bf16[2,32,16]) -> (f32[2,8,16], f32[2,8,32]) {
  %p0 = f32[2,8,32]{2,1,0} parameter(0)
  %p1 = bf16[2,32,16]{2,1,0} parameter(1)
  %c = f32[2,32,16]{2,1,0} convert(%p1)
  %dot.1 = f32[2,8,16]{2,1,0} dot(%p0, %c), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %neg = f32[2,8,32]{2,1,0} negate(%p0)
  ROOT %t = (f32[2,8,16]{2,1,0}, f32[2,8,32]{2,1,0}) tuple(%dot.1, %neg)
}

%grouped (a: bf16[1,64,28,28], w: bf16[3,3,1,64]) -> bf16[1,64,28,28] {
  %a = bf16[1,64,28,28]{3,2,1,0} parameter(0)
  %w = bf16[3,3,1,64]{3,2,1,0} parameter(1)
  ROOT %convolution.3 = bf16[1,64,28,28]{3,2,1,0} convolution(%a, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=bf01_01io->bf01, feature_group_count=64
}

ENTRY %main (x: f32[2,8,32], y: bf16[2,32,16], img: bf16[1,64,28,28], k: bf16[3,3,1,64]) -> f32[2,8,16] {
  %x = f32[2,8,32]{2,1,0} parameter(0)
  %y = bf16[2,32,16]{2,1,0} parameter(1)
  %img = bf16[1,64,28,28]{3,2,1,0} parameter(2)
  %k = bf16[3,3,1,64]{3,2,1,0} parameter(3)
  %fusion.1 = (f32[2,8,16]{2,1,0}, f32[2,8,32]{2,1,0}) fusion(%x, %y), kind=kOutput, calls=%fused
  %fusion.2 = bf16[1,64,28,28]{3,2,1,0} fusion(%img, %k), kind=kOutput, calls=%grouped
  ROOT %gte = f32[2,8,16]{2,1,0} get-tuple-element(%fusion.1), index=0
}
"""


def test_a_batched_dot_names_its_own_operands_dtypes_and_the_output_it_feeds():
    (mm,) = _program(BATCHED_DOT).get("fusion.1").matmuls
    assert (mm.batch, mm.m, mm.n, mm.k) == (2, 8, 16, 32)
    # the rhs is the convert's f32, not the fusion parameter's bf16; the negate's output is not fed
    assert (mm.lhs_dtype, mm.rhs_dtype) == ("f32", "f32") and mm.feeds == (0,)
    assert mm.flops == 2 * 2 * 8 * 16 * 32


def test_a_depthwise_convolution_is_one_small_matmul_per_group():
    (mm,) = _program(BATCHED_DOT).get("fusion.2").matmuls
    # 64 groups of [784 positions, 9 taps] x [9, 1]
    assert (mm.batch, mm.m, mm.n, mm.k) == (64, 28 * 28, 1, 9)


def test_ops_without_matmuls_and_unknown_names():
    math = _program(BATCHED_DOT)
    assert math.get("gte").matmuls == () and math.get("nope") is None


def test_shapes_compose_as_a_matmul_only_when_they_do():
    assert matmul_from_shapes((8, 16), (8, 32), (32, 16)) == ((), 8, 16, 32)
    assert matmul_from_shapes((8, 16), (32, 8), (16, 32)) == ((), 8, 16, 32)  # both stored transposed
    assert matmul_from_shapes((4, 8, 16), (4, 8, 32), (4, 32, 16)) == ((4,), 8, 16, 32)
    assert matmul_from_shapes((8, 16), (8, 32), (31, 16)) is None
    assert matmul_from_shapes((8,), (8,), (8,)) is None


def test_a_trace_op_line_gives_math_only_when_it_shows_it():
    conv = op_math_from_text("convolution.27", "%convolution.27 = bf16[4,1024]{1,0} convolution(bf16[4,8192]{1,0} "
                             "%a, bf16[8192,1024]{1,0} %b), dim_labels=bf_io->bf")
    assert (conv.main.m, conv.main.n, conv.main.k, conv.main.basis) == (4, 1024, 8192, "dim_labels")
    fused = op_math_from_text("fusion.7", "%fusion.7 = bf16[8,1000]{1,0} fusion(bf16[8,4096]{1,0} %p0, "
                              "bf16[4096,1000]{1,0} %p1), kind=kOutput")
    assert (fused.main.m, fused.main.n, fused.main.k, fused.main.basis) == (8, 1000, 4096, "operand shapes")
    # the issue's fusion.198 as the trace prints it: a tuple result and three unrelated operands
    assert op_math_from_text("fusion.198", "%fusion.198 = (bf16[512,256]{1,0}, s32[2]{0}) fusion(bf16[8,128,3,2,128]"
                             "{4,1,3,0,2} %a, bf16[8,128,3,4,128]{4,1,3,0,2} %b, s32[2]{0} %c)") is None


def test_an_attention_dot_written_as_a_dilated_convolution_is_batched():
    """`bqhd,bkhd->bhqk` with b 8, h 2, q = k = d = 128: `window={size=8x2 lhs_dilate=8x2}` makes b and h
    batch dims (one tap each), not 16x more rows and a 16x longer contraction."""
    for program in (load_hlo_dump(DUMPS / "transformer_train_v5e" / "xla").programs[0],
                    parse_hlo_proto((DUMPS / "transformer_train_v5e" / "module.pb").read_bytes())):
        mm = next(m for m in ProgramMath(program).get("convolution-base-dilated.12").matmuls)
        assert (mm.batch_dims, mm.m, mm.n, mm.k) == ((8, 2), 128, 128, 128)
        assert mm.flops == 2 * 16 * 128 ** 3


def test_an_attention_gradient_with_padded_strided_windows_is_batched_not_4x_the_flops():
    """fusion.57's `convolution-base-dilated.10.clone.1` (`bhqk,bkhd->bqhd`'s transpose): `window={size=8x2 stride=8x2
    pad=7_7x1_1 lhs_dilate=7x1}` lets each of the 8 x 2 output positions read one real input element with
    its own tap; the rest fall on padding or dilation holes. Counting taps without the padding and stride
    made K 4x too long, and the modelled timeline ran fusion.57 at 292% of the v5e peak."""
    for program in (load_hlo_dump(DUMPS / "transformer_train_v5e" / "xla").programs[0],
                    parse_hlo_proto((DUMPS / "transformer_train_v5e" / "module.pb").read_bytes())):
        (mm,) = ProgramMath(program).get("fusion.57").matmuls
        assert mm.instruction == "convolution-base-dilated.10.clone.1"
        assert (mm.batch_dims, mm.m, mm.n, mm.k) == ((8, 2), 128, 128, 128)
        assert mm.flops == 2 * 8 * 2 * 128 ** 3


@pytest.mark.parametrize(("window", "m", "k"), [
    ("size=3x3 pad=1_1x1_1", 28 * 28, 9),  # edges read padding, but the middle positions see all 9 taps
    ("size=3x3 stride=2x2", 13 * 13, 9),
    ("size=3x3 rhs_dilate=2x2", 24 * 24, 9),
    ("size=3x3 lhs_dilate=2x2", 53 * 53, 4),  # at most 2 of 3 taps per dim land on a real element
])
def test_convolution_taps_count_only_real_input(window, m, k):
    """Near misses of the batched-dot form: ordinary convolutions keep their rows and real taps."""
    out = {"size=3x3 pad=1_1x1_1": 28, "size=3x3 stride=2x2": 13, "size=3x3 rhs_dilate=2x2": 24,
           "size=3x3 lhs_dilate=2x2": 53}[window]
    text = f"""HloModule m, entry_computation_layout={{(f32[1,16,28,28]{{3,2,1,0}}, f32[3,3,16,32]{{3,2,1,0}})->f32[1,32,{out},{out}]{{3,2,1,0}}}}

ENTRY %main (a: f32[1,16,28,28], w: f32[3,3,16,32]) -> f32[1,32,{out},{out}] {{
  %a = f32[1,16,28,28]{{3,2,1,0}} parameter(0)
  %w = f32[3,3,16,32]{{3,2,1,0}} parameter(1)
  ROOT %conv = f32[1,32,{out},{out}]{{3,2,1,0}} convolution(%a, %w), window={{{window}}}, dim_labels=bf01_01io->bf01
}}
"""
    (mm,) = _program(text).get("conv").matmuls
    assert (mm.batch, mm.m, mm.n, mm.k) == (1, m, 32, 16 * k)


def _text_matmul(name, opcode, m, n, k, batch, lhs, rhs, result, basis):
    return Matmul(instruction=name, computation="", opcode=opcode, m_dims=(m,), n_dims=(n,), k_dims=(k,),
                  batch_dims=batch, lhs_dtype=lhs, rhs_dtype=rhs, result_dtype=result, basis=basis)


def test_a_trace_op_line_reads_every_field_of_its_math():
    # Whole objects, each field read off the line by hand. Operands of different shapes and dtypes,
    # so a swapped operand or a dropped dtype shows.
    # dot: lhs [16,8] contracting dim 0 -> K 16, M 8; rhs [16,32] contracting dim 0 -> N 32.
    assert op_math_from_text("dot.4", "%dot.4 = f32[8,32]{1,0} dot(bf16[16,8]{1,0} %lhs, f32[16,32]{1,0} %rhs), "
                             "lhs_contracting_dims={0}, rhs_contracting_dims={0}") == OpMath(
        op="dot.4", opcode="dot",
        matmuls=(_text_matmul("dot.4", "dot", 8, 32, 16, (1,), "bf16", "f32", "f32", "dot_dimension_numbers"),))
    # A Pallas call: [4,128,512] x [4,512,256] -> [4,128,256] is 4 batched 128x512x256 products, and
    # its declared cost (2 x 4 x 128 x 256 x 512 = 536,870,912 FLOPs) is kept beside it.
    assert op_math_from_text("custom-call.3", '%custom-call.3 = f32[4,128,256]{2,1,0} custom-call(bf16[4,128,512]'
                             '{2,1,0} %a, s8[4,512,256]{2,1,0} %b), custom_call_target="tpu_custom_call", '
                             'backend_config="{\\"cost_estimate\\": {\\"flops\\": 536870912, '
                             '\\"bytes_accessed\\": 1310720}}"') == OpMath(
        op="custom-call.3", opcode="custom-call",
        matmuls=(_text_matmul("custom-call.3", "custom-call", 128, 256, 512, (4,), "bf16", "s8", "f32",
                              "operand shapes"),),
        declared_flops=536870912.0, declared_bytes=1310720.0)
    # One operand: no matmul, but the declared cost alone is still the op's math.
    assert op_math_from_text("custom-call.5", '%custom-call.5 = f32[8]{0} custom-call(f32[8]{0} %a), '
                             'backend_config="{\\"cost_estimate\\": {\\"flops\\": 64, \\"bytes_accessed\\": 32}}"'
                             ) == OpMath(op="custom-call.5", opcode="custom-call", matmuls=(), declared_flops=64.0,
                                         declared_bytes=32.0)
    # A fusion whose two operands compose as [8,16] x [16,32]: one unbatched product (batch 1).
    assert op_math_from_text("fusion.9", "%fusion.9 = f32[8,32]{1,0} fusion(bf16[8,16]{1,0} %lhs, f32[16,32]{1,0} "
                             "%rhs), kind=kOutput") == OpMath(
        op="fusion.9", opcode="fusion",
        matmuls=(_text_matmul("fusion.9", "fusion", 8, 32, 16, (1,), "bf16", "f32", "f32", "operand shapes"),))
    # Two contracting dims: [8,4,16] x [4,16,32] contracts 4 x 16.
    two = op_math_from_text("dot.6", "%dot.6 = f32[8,32]{1,0} dot(f32[8,4,16]{2,1,0} %a, f32[4,16,32]{2,1,0} %b), "
                            "lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}").main
    assert (two.m_dims, two.n_dims, two.k_dims) == ((8,), (32,), (4, 16))
    # An outer product contracts nothing: K is 1.
    outer = op_math_from_text("dot.5", "%dot.5 = f32[8,32]{1,0} dot(f32[8]{0} %a, f32[32]{0} %b)").main
    assert (outer.m_dims, outer.n_dims, outer.k_dims) == ((8,), (32,), (1,))
    # A multi-output fusion (a tuple result) shows no single matmul, whatever its operands.
    assert op_math_from_text("fusion.8", "%fusion.8 = (f32[8,32]{1,0}, f32[8]{0}) fusion(bf16[8,16]{1,0} %a, "
                             "bf16[16,32]{1,0} %b)") is None
    # A line with no '=' is no instruction.
    assert op_math_from_text("x", "fusion(f32[8]{0} %a)") is None
    assert op_math_from_text("x", "") is None


def test_a_dot_with_a_vector_operand_and_one_with_dims_past_its_rank():
    # Every dim of a vector operand is contracted: [16] . [16,32] is one row (M 1), and
    # [8,16] . [16] one column (N 1); still a matmul, not dropped.
    mv = op_math_from_text("dot.1", "%dot.1 = f32[32]{0} dot(f32[16]{0} %v, f32[16,32]{1,0} %w), "
                           "lhs_contracting_dims={0}, rhs_contracting_dims={0}").main
    assert (mv.m_dims, mv.n_dims, mv.k_dims) == ((1,), (32,), (16,))
    vm = op_math_from_text("dot.2", "%dot.2 = f32[8]{0} dot(f32[8,16]{1,0} %w, f32[16]{0} %v), "
                           "lhs_contracting_dims={1}, rhs_contracting_dims={0}").main
    assert (vm.m_dims, vm.n_dims, vm.k_dims) == ((8,), (1,), (16,))
    # A contracting dim the operand does not have (damaged text) is no matmul, on either side.
    for lhs_k, rhs_k in (("5", "0"), ("1", "5")):
        assert op_math_from_text("dot.3", f"%dot.3 = f32[8,32]{{1,0}} dot(f32[8,16]{{1,0}} %a, f32[16,32]{{1,0}} "
                                 f"%b), lhs_contracting_dims={{{lhs_k}}}, rhs_contracting_dims={{{rhs_k}}}") is None


CUSTOM_CALLS = """\
HloModule m

ENTRY %main (a: bf16[4,128,512], b: s8[4,512,256], c: f32[8]) -> f32[4,128,256] {
  %a = bf16[4,128,512]{2,1,0} parameter(0)
  %b = s8[4,512,256]{2,1,0} parameter(1)
  %c = f32[8]{0} parameter(2)
  %kernel = f32[4,128,256]{2,1,0} custom-call(%a, %b), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call"}
  %three = f32[4,128,256]{2,1,0} custom-call(%a, %b, %c), custom_call_target="tpu_custom_call"
  ROOT %tup = (f32[4,128,256]{2,1,0}, f32[8]{0}) custom-call(%a, %b), custom_call_target="tpu_custom_call"
}
"""


def test_a_matmul_shaped_custom_call_in_a_program_reads_every_field():
    from tpudiag.model.matmuls import instruction_matmul
    program = parse_hlo_text(CUSTOM_CALLS)
    # [4,128,512] x [4,512,256] -> [4,128,256]: 4 batched 128 x 512 x 256 products
    assert instruction_matmul(program, program.find("kernel")) == Matmul(
        instruction="kernel", computation="main", opcode="custom-call", m_dims=(128,), n_dims=(256,),
        k_dims=(512,), batch_dims=(4,), lhs_dtype="bf16", rhs_dtype="s8", result_dtype="f32",
        basis="operand shapes", op_name="jit(f)/pallas_call")
    # three operands, or a tuple result: the shapes tell no single matmul
    assert instruction_matmul(program, program.find("three")) is None
    assert instruction_matmul(program, program.find("tup")) is None


def test_a_declared_cost_estimate_as_jax_writes_it():
    from tpudiag.model.matmuls import cost_estimate
    assert cost_estimate('{"cost_estimate": {"flops": 2048, "bytes_accessed": 512}}') == (2048.0, 512.0)
    assert cost_estimate('{"cost_estimate": {"flops": 2048}}') == (2048.0, 0.0)  # no bytes declared
    assert cost_estimate('{"cost_estimate": {"bytes_accessed": 512}}') is None    # no FLOPs: nothing declared
    assert cost_estimate(None) is None and cost_estimate("") is None


def test_shapes_that_share_no_m_or_no_batch_are_no_matmul():
    assert matmul_from_shapes((8, 16), (4, 32), (4, 16)) is None          # lhs holds no M (8)
    assert matmul_from_shapes((4, 8, 16), (4, 8, 32), (2, 32, 16)) is None  # rhs batch 2, not 4
    assert matmul_from_shapes((4, 8, 16), (2, 8, 32), (4, 32, 16)) is None  # lhs batch 2, not 4


def test_a_matmul_in_words_and_its_flops():
    # The issue's fusion.198: K is 8 x 128 = 1024, one product (no batch shown)
    conv = Matmul(instruction="convolution.55", computation="c", opcode="convolution", m_dims=(512,),
                  n_dims=(256,), k_dims=(8, 128), batch_dims=(1,), lhs_dtype="bf16", rhs_dtype="bf16",
                  result_dtype="bf16", basis="dim_labels")
    assert conv.describe() == "convolution.55: bf16 x bf16 -> bf16, M 512, N 256, K 1024 (8x128)"
    assert conv.flops == 2 * 512 * 256 * 1024
    batched = dataclasses.replace(conv, instruction="dot.1", m_dims=(16, 8), n_dims=(256,), k_dims=(512,),
                                  batch_dims=(4, 2), lhs_dtype="f32", result_dtype="f32")
    assert batched.describe() == "dot.1: f32 x bf16 -> f32, batch 8 (4x2), M 128 (16x8), N 256, K 512"
    assert (batched.batch, batched.m, batched.n, batched.k) == (8, 128, 256, 512)
    assert batched.flops == 2 * 8 * 128 * 256 * 512
    assert dataclasses.replace(batched, batch_dims=(4,)).describe().startswith("dot.1: f32 x bf16 -> f32, batch 4, M")
    assert dataclasses.replace(batched, batch_dims=(2,)).describe().startswith("dot.1: f32 x bf16 -> f32, batch 2, M")


def test_an_ops_main_matmul_and_total():
    small = _text_matmul("a", "dot", 8, 8, 8, (1,), "f32", "f32", "f32", "x")  # 1,024 FLOPs
    big = _text_matmul("b", "dot", 8, 8, 16, (1,), "f32", "f32", "f32", "x")  # 2,048
    same = _text_matmul("c", "dot", 8, 16, 8, (1,), "f32", "f32", "f32", "x")  # 2,048, later
    math = OpMath(op="fusion.1", opcode="fusion", matmuls=(small, big, same))
    assert math.main is big and math.matmul_flops == 1024 + 2048 + 2048
    assert OpMath(op="f", opcode="fusion", matmuls=()).main is None
    assert OpMath(op="f", opcode="fusion", matmuls=()).matmul_flops == 0


def test_a_programs_math_is_found_by_name_once():
    program = ProgramMath(parse_hlo_text(CUSTOM_CALLS))
    assert "kernel" in program and "c" in program and "nope" not in program
    assert program.get("nope") is None
    first = program.get("kernel")
    assert first.matmuls[0].m == 128 and program.get("kernel") is first  # worked out once
    assert program.get("c") == OpMath(op="c", opcode="parameter", matmuls=())


def test_a_program_dot_carries_its_jax_op_name():
    from tpudiag.model.matmuls import instruction_matmul
    program = parse_hlo_text("""HloModule m

ENTRY %main (a: f32[8,16], b: f32[16,32]) -> f32[8,32] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,32]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general"}
}
""")
    mm = instruction_matmul(program, program.find("dot.1"))
    assert (mm.m, mm.n, mm.k, mm.op_name, mm.computation) == (8, 32, 16, "jit(f)/dot_general", "main")


def test_a_trace_convolution_line_reads_its_input_and_kernel_apart():
    # b01f input bf16[2,10,10,3], 01io kernel f32[3,3,3,16], output [2,8,8,16]: M = 2 x 8 x 8 = 128 rows,
    # N 16 features, K = 3 input features x 3 x 3 taps = 27; the dtypes are the input's and the kernel's.
    math = op_math_from_text("convolution.2", "%convolution.2 = f32[2,8,8,16]{3,2,1,0} convolution(bf16[2,10,10,3]"
                             "{3,2,1,0} %x, f32[3,3,3,16]{3,2,1,0} %w), window={size=3x3}, dim_labels=b01f_01io->b01f")
    assert math == OpMath(op="convolution.2", opcode="convolution", matmuls=(Matmul(
        instruction="convolution.2", computation="", opcode="convolution", m_dims=(2, 8, 8), n_dims=(16,),
        k_dims=(3, 3, 3), batch_dims=(1,), lhs_dtype="bf16", rhs_dtype="f32", result_dtype="f32",
        basis="dim_labels"),))
    assert math.main.describe() == "convolution.2: bf16 x f32 -> f32, M 128 (2x8x8), N 16, K 27 (3x3x3)"
    # A 1 x 1 convolution of one feature over one position: every dim 1, an M and K of 1
    one = _conv_1d("1,1,1", "1,1,4", "1,1,4", "size=1")
    assert (one.m_dims, one.n_dims, one.k_dims, one.batch_dims) == ((1,), (4,), (1,), (1,))


def _conv_1d(lhs: str, rhs: str, out: str, window: str):
    """A 1-D convolution's line as a trace's op metadata gives it (input b0f, kernel 0io, output b0f)."""
    return op_math_from_text("convolution.1", f"%convolution.1 = f32[{out}]{{2,1,0}} convolution(f32[{lhs}]{{2,1,0}} "
                             f"%x, f32[{rhs}]{{2,1,0}} %w), window={{{window}}}, dim_labels=b0f_0io->b0f").main


def test_a_window_is_enumerated_up_to_two_to_the_sixteen_cells():
    # 16,385 inputs dilated by 2 span 32,769 positions; a window of 2 gives 32,768 outputs, each of which
    # reads one real element (the other tap falls in a dilation hole): 32,768 x 2 = 2^16 cells, still
    # enumerated, so K is the 8 input features x 1 real tap.
    mm = _conv_1d("1,16385,8", "2,8,16", "1,32768,16", "size=2 lhs_dilate=2")
    assert (mm.batch, mm.m, mm.n, mm.k) == (1, 32768, 16, 8)
    # 40,000 inputs: 79,998 outputs x 2 taps is past 2^16: not enumerated, every tap counts (K 8 x 2),
    # and the outputs stay rows (M), never a batch
    mm = _conv_1d("1,40000,8", "2,8,16", "1,79998,16", "size=2 lhs_dilate=2")
    assert (mm.batch, mm.m, mm.n, mm.k) == (1, 79998, 16, 16)


def test_a_convolution_with_an_empty_output_does_no_work():
    mm = _conv_1d("1,0,8", "1,8,16", "1,0,16", "size=1")
    assert mm.m == 0 and mm.n == 16 and mm.flops == 0


CUSTOM_CALL_WITH_A_TUPLE = """\
HloModule m

ENTRY %main (a: bf16[128,512], b: bf16[512,256], t: (f32[8], f32[8])) -> f32[128,256] {
  %a = bf16[128,512]{1,0} parameter(0)
  %b = bf16[512,256]{1,0} parameter(1)
  %t = (f32[8]{0}, f32[8]{0}) parameter(2)
  %plain = f32[128,256]{1,0} custom-call(%a, %b), custom_call_target="tpu_custom_call"
  ROOT %kernel = f32[128,256]{1,0} custom-call(%a, %b, %t), custom_call_target="tpu_custom_call"
}
"""


def test_a_custom_call_with_a_third_operand_that_is_no_array_is_no_matmul():
    # Two of its three operands compose as [128,512] x [512,256], but the call takes a third (a tuple):
    # the shapes alone do not say it is that matmul.
    from tpudiag.model.matmuls import instruction_matmul
    program = parse_hlo_text(CUSTOM_CALL_WITH_A_TUPLE)
    assert instruction_matmul(program, program.find("kernel")) is None
    # The same two operands alone: one unbatched 128 x 512 x 256 product
    plain = instruction_matmul(program, program.find("plain"))
    assert (plain.batch_dims, plain.m, plain.n, plain.k) == ((1,), 128, 256, 512)


DOT_PLUS_A_SQUARE = """\
HloModule m

%fused (p0: f32[8,16], p1: f32[16,8]) -> f32[8,8] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,8]{1,0} parameter(1)
  %dot = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %slice = f32[8,8]{1,0} slice(%p0), slice={[0:8], [0:8]}
  %square = f32[8,8]{1,0} multiply(%slice, %slice)
  ROOT %sum = f32[8,8]{1,0} add(%dot, %square)
}

%fused_root (q0: f32[8,16], q1: f32[16,8]) -> f32[8,8] {
  %q0 = f32[8,16]{1,0} parameter(0)
  %q1 = f32[16,8]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,8]{1,0} dot(%q0, %q1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[8,16], b: f32[16,8]) -> (f32[8,8], f32[8,8]) {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,8]{1,0} parameter(1)
  %fusion.1 = f32[8,8]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused
  %fusion.2 = f32[8,8]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_root
  ROOT %t = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%fusion.1, %fusion.2)
}
"""


def test_a_fusions_matmul_feeds_its_one_output_however_the_graph_reaches_it():
    # fusion.1 returns dot + slice^2: the walk from the root meets `slice` twice before it reaches the
    # dot, which still feeds the output; fusion.2's root is the dot itself.
    program = ProgramMath(parse_hlo_text(DOT_PLUS_A_SQUARE))
    (mm,) = program.get("fusion.1").matmuls
    assert (mm.instruction, mm.feeds, mm.m, mm.k) == ("dot", (0,), 8, 16)
    (root,) = program.get("fusion.2").matmuls
    assert (root.instruction, root.feeds) == ("dot.2", (0,))


def _nested(levels: int) -> str:
    """A fusion whose computation holds a fusion, and so on `levels` computations deep; the last one a dot."""
    comps = []
    for i in range(levels, 0, -1):
        body = ("  ROOT %dot = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
                if i == levels else f"  ROOT %inner.{i} = f32[8,8]{{1,0}} fusion(%p0, %p1), kind=kOutput, calls=%c{i + 1}")
        comps.append(f"%c{i} (p0: f32[8,16], p1: f32[16,8]) -> f32[8,8] {{\n  %p0 = f32[8,16]{{1,0}} parameter(0)\n"
                     f"  %p1 = f32[16,8]{{1,0}} parameter(1)\n{body}\n}}\n")
    return ("HloModule m\n\n" + "\n".join(comps) + "\nENTRY %main (a: f32[8,16], b: f32[16,8]) -> f32[8,8] {\n"
            "  %a = f32[8,16]{1,0} parameter(0)\n  %b = f32[16,8]{1,0} parameter(1)\n"
            "  ROOT %fusion.1 = f32[8,8]{1,0} fusion(%a, %b), kind=kOutput, calls=%c1\n}\n")


def test_fusions_nested_eight_deep_are_followed_and_deeper_is_a_damaged_program():
    # fusion.1 calls c1; c1 holds a fusion calling c2, and so on: with 8 fusions nested inside fusion.1
    # (9 computations) the dot is found; one more is past `_MAX_DEPTH` and read as a damaged program.
    found = _program(_nested(9)).get("fusion.1").matmuls
    assert [(mm.instruction, mm.computation, mm.feeds) for mm in found] == [("dot", "c9", (0,))]
    assert _program(_nested(10)).get("fusion.1").matmuls == ()


def test_a_fusion_calling_a_computation_the_program_lacks_has_no_matmul():
    text = _nested(1).replace("calls=%c1", "calls=%missing")
    assert _program(text).get("fusion.1").matmuls == ()


def test_a_dot_whose_value_reaches_no_output_feeds_none():
    text = _nested(1).replace("  ROOT %dot =", "  %dead = f32[8,8]{1,0} negate(%p0)\n  %dot =").replace(
        "rhs_contracting_dims={0}\n}", "rhs_contracting_dims={0}\n  ROOT %out = f32[8,8]{1,0} negate(%dead)\n}", 1)
    assert [(mm.instruction, mm.feeds) for mm in _program(text).get("fusion.1").matmuls] == [("dot", ())]


def test_a_batch_grouped_convolution_is_one_matmul_per_group():
    # batch_group_count=2 (a weight gradient): input batch 4 in 2 groups gives output batch 2; each
    # group is M = 2 x 8 positions, N = 6 / 2 = 3 features, K = 8 input features x 3 taps.
    mm = op_math_from_text("convolution.3", "%convolution.3 = f32[2,6,8]{2,1,0} convolution(f32[4,8,10]{2,1,0} %x, "
                           "f32[3,8,6]{2,1,0} %w), window={size=3}, dim_labels=bf0_0io->bf0, batch_group_count=2").main
    assert (mm.batch_dims, mm.m_dims, mm.n_dims, mm.k_dims) == ((2,), (2, 8), (3,), (8, 3))


def test_a_full_convolution_sees_every_tap_in_the_middle():
    # 4 inputs, a window of 4 padded by 3 each side (stride 1): 4 + 6 - 4 + 1 = 7 outputs; output 3 reads
    # positions 0..3, all real, so K is 8 features x 4 taps (the edges see fewer).
    mm = _conv_1d("1,4,8", "4,8,16", "1,7,16", "size=4 pad=3_3")
    assert (mm.batch, mm.m, mm.n, mm.k) == (1, 7, 16, 32)


OPS_OF_A_PROGRAM = """\
HloModule m

%gather_and_dot (p0: f32[8,16], p1: f32[16,8]) -> (f32[16,16], f32[8,8]) {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,8]{1,0} parameter(1)
  %all-gather.1 = f32[16,16]{1,0} all-gather(%p0), dimensions={0}, replica_groups={{0,1}}
  %dot.3 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[16,16]{1,0}, f32[8,8]{1,0}) tuple(%all-gather.1, %dot.3)
}

ENTRY %main (a: f32[8,16], b: f32[16,8]) -> f32[8,8] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,8]{1,0} parameter(1)
  %fusion.1 = (f32[16,16]{1,0}, f32[8,8]{1,0}) fusion(%a, %b), kind=kOutput, calls=%gather_and_dot
  %kernel = f32[8,8]{1,0} custom-call(%a, %b), custom_call_target="tpu_custom_call", backend_config="{\\"cost_estimate\\": {\\"flops\\": 2048, \\"bytes_accessed\\": 1024}}"
  %sort.1 = f32[8,16]{1,0} custom-call(%a), custom_call_target="sort_kernel"
  ROOT %dot.2 = f32[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_each_ops_math_in_a_program():
    from tpudiag.model.matmuls import op_math
    program = parse_hlo_text(OPS_OF_A_PROGRAM)

    def math(name):
        return op_math(program, program.find(name))
    # A top-level dot: one 8 x 8 x 16 matmul feeding the op's own (only) output
    dot = math("dot.2")
    assert (dot.opcode, [(mm.instruction, mm.feeds, mm.m, mm.n, mm.k) for mm in dot.matmuls]) == (
        "dot", [("dot.2", (0,), 8, 8, 16)])
    assert (dot.declared_flops, dot.declared_bytes, dot.collectives) == (None, None, ())
    # A Pallas call: its shapes compose as [8,16] x [16,8], and it declares 2,048 FLOPs and 1,024 bytes
    kernel = math("kernel")
    assert [(mm.opcode, mm.feeds, mm.m, mm.n, mm.k) for mm in kernel.matmuls] == [("custom-call", (0,), 8, 8, 16)]
    assert (kernel.declared_flops, kernel.declared_bytes, kernel.collectives) == (2048.0, 1024.0, ())
    # A fusion carrying an all-gather beside its dot: the dot feeds output 1, the gather is named
    fusion = math("fusion.1")
    assert [(mm.instruction, mm.computation, mm.feeds) for mm in fusion.matmuls] == [("dot.3", "gather_and_dot", (1,))]
    assert (fusion.declared_flops, fusion.collectives) == (None, ("all-gather.1",))
    assert math("a") == OpMath(op="a", opcode="parameter", matmuls=())
    # A custom call of one operand that declares nothing: no matmul, no cost
    assert math("sort.1") == OpMath(op="sort.1", opcode="custom-call", matmuls=())


# ---- the survivors the third mutation run left open (docs/testing.md, lane mut-open) ------------

@pytest.mark.parametrize("pad, k", [("0_1", 3), ("1_0", 2)])
def test_a_convolution_counts_its_taps_from_the_low_pad_only(pad, k):
    # 3 inputs, a window of 3 at stride 3, one pad element on one side: (3 + 1 - 3) // 3 + 1 = 1
    # output. Its window starts at -pad_low: with pad 0_1 it reads positions 0, 1, 2 (3 real taps),
    # with pad 1_0 positions -1, 0, 1 (2 real taps). K is 1 feature x those taps.
    mm = _conv_1d("1,3,1", "3,1,1", "1,1,1", f"size=3 stride=3 pad={pad}")
    assert (mm.batch, mm.m, mm.n, mm.k) == (1, 1, 1, k)


def test_a_trace_convolution_line_reads_its_rhs_dilation():
    # 2 inputs, a window of 2 taps dilated by 2 (taps 2 apart), pad 1 each side: 2 + 2 - 3 + 1 = 2
    # outputs. Output 0 reads positions -1 and 1 (tap 1 real), output 1 reads 0 and 2 (tap 0 real):
    # one real input each, with a tap of its own, so the 2 outputs are a batch and K is the 4
    # features x 1 tap. Read without the dilation, output 1 would see 2 real taps (M 2, K 8).
    mm = _conv_1d("1,2,4", "2,4,8", "1,2,8", "size=2 pad=1_1 rhs_dilate=2")
    assert (mm.batch, mm.m, mm.n, mm.k) == (2, 1, 8, 4)


def test_a_program_convolution_carries_its_jax_op_name():
    from tpudiag.model.matmuls import instruction_matmul
    program = parse_hlo_text("""HloModule m

ENTRY %main (a: f32[1,3,4], w: f32[3,4,8]) -> f32[1,1,8] {
  %a = f32[1,3,4]{2,1,0} parameter(0)
  %w = f32[3,4,8]{2,1,0} parameter(1)
  ROOT %conv.1 = f32[1,1,8]{2,1,0} convolution(%a, %w), window={size=3}, dim_labels=b0f_0io->b0f, metadata={op_name="jit(f)/conv_general_dilated"}
}
""")
    mm = instruction_matmul(program, program.find("conv.1"))
    # one output position reading all 3 taps: M 1, N 8, K 4 features x 3 taps
    assert (mm.m, mm.n, mm.k, mm.op_name, mm.computation) == (1, 8, 12, "jit(f)/conv_general_dilated", "main")


CALLS_AND_LOOPS = """\
HloModule m

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%gather (p: f32[8,16]) -> f32[16,16] {
  %p = f32[8,16]{1,0} parameter(0)
  ROOT %all-gather.1 = f32[16,16]{1,0} all-gather(%p), dimensions={0}, replica_groups={{0,1}}
}

%reduce (q: f32[8,16]) -> f32[8,16] {
  %q = f32[8,16]{1,0} parameter(0)
  ROOT %all-reduce.2 = f32[8,16]{1,0} all-reduce(%q), replica_groups={{0,1}}, to_apply=%sum
}

%outer (o: f32[8,16]) -> (f32[16,16], f32[16,16], f32[8,16]) {
  %o = f32[8,16]{1,0} parameter(0)
  %c1 = f32[16,16]{1,0} call(%o), to_apply=%gather
  %c2 = f32[16,16]{1,0} call(%o), to_apply=%gather
  %c3 = f32[8,16]{1,0} call(%o), to_apply=%reduce
  ROOT %t = (f32[16,16]{1,0}, f32[16,16]{1,0}, f32[8,16]{1,0}) tuple(%c1, %c2, %c3)
}

%body (b: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %b = (s32[], f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %v = f32[8,16]{1,0} get-tuple-element(%b), index=1
  %all-reduce.3 = f32[8,16]{1,0} all-reduce(%v), replica_groups={{0,1}}, to_apply=%sum
  ROOT %r = (s32[], f32[8,16]{1,0}) tuple(%i, %all-reduce.3)
}

%cond (c: (s32[], f32[8,16])) -> pred[] {
  %c = (s32[], f32[8,16]{1,0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %lim = s32[] constant(3)
  ROOT %lt = pred[] compare(%n, %lim), direction=LT
}

%looping (l: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %l = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %while.2 = (s32[], f32[8,16]{1,0}) while(%l), condition=%cond, body=%body
}

%inner_dot (d0: f32[8,16], d1: f32[16,4]) -> f32[8,4] {
  %d0 = f32[8,16]{1,0} parameter(0)
  %d1 = f32[16,4]{1,0} parameter(1)
  ROOT %dot.9 = f32[8,4]{1,0} dot(%d0, %d1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[8,16], w: f32[16,8], u: f32[16,4]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %w = f32[16,8]{1,0} parameter(1)
  %u = f32[16,4]{1,0} parameter(2)
  %z = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}) tuple(%z, %a)
  %fusion.1 = (f32[16,16]{1,0}, f32[16,16]{1,0}, f32[8,16]{1,0}) fusion(%a), kind=kLoop, calls=%outer
  %while.1 = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body
  %call.1 = (s32[], f32[8,16]{1,0}) call(%init), to_apply=%looping
  %kernel.1 = f32[8,4]{1,0} custom-call(%a, %u), custom_call_target="tpu_custom_call", called_computations={%inner_dot}
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%while.1), index=1
}
"""


def test_collectives_inside_an_op_are_found_at_any_depth_once_and_never_inside_a_loop():
    from tpudiag.model.matmuls import op_math
    program = parse_hlo_text(CALLS_AND_LOOPS)

    def collectives(name):
        return op_math(program, program.find(name)).collectives
    # fusion.1 -> %outer, whose calls c1 and c2 both run %gather and c3 runs %reduce: the gather is
    # named once (its computation is walked once), and the walk goes on past the computation seen
    # twice to the all-reduce, two calls down
    assert collectives("fusion.1") == ("all-gather.1", "all-reduce.2")
    # a while loop's body runs as trace ops of its own: nothing inside the loop belongs to the op,
    # whether the loop is the op itself or sits inside the computation a `call` runs
    assert collectives("while.1") == ()
    assert collectives("call.1") == ()


def test_a_custom_call_that_calls_a_computation_has_that_computations_matmuls():
    from tpudiag.model.matmuls import op_math
    program = parse_hlo_text(CALLS_AND_LOOPS)
    # kernel.1's operands [8,16] x [16,4] -> [8,4] compose as a matmul, but it calls %inner_dot:
    # the matmul is that computation's dot.9, not one read from the custom call's shapes
    math = op_math(program, program.find("kernel.1"))
    assert [(mm.instruction, mm.computation, mm.opcode, mm.m, mm.n, mm.k, mm.feeds) for mm in math.matmuls] == [
        ("dot.9", "inner_dot", "dot", 8, 4, 16, (0,))]


NESTED_COLLECTIVE_FUSION = """\
HloModule m

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%all-reduce-scatter.2 (p: f32[8,16]) -> f32[4,16] {
  %p = f32[8,16]{1,0} parameter(0)
  %all-reduce.5 = f32[8,16]{1,0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%sum
  ROOT %slice = f32[4,16]{1,0} slice(%all-reduce.5), slice={[0:4], [0:16]}
}

%outer (a: f32[8,16], b: f32[16,16]) -> (f32[8,16], f32[4,16]) {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,16]{1,0} parameter(1)
  %dot.1 = f32[8,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %rs = f32[4,16]{1,0} fusion(%dot.1), kind=kOutput, calls=%all-reduce-scatter.2
  ROOT %t = (f32[8,16]{1,0}, f32[4,16]{1,0}) tuple(%dot.1, %rs)
}

ENTRY %main (a: f32[8,16], b: f32[16,16]) -> (f32[8,16], f32[4,16]) {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,16]{1,0} parameter(1)
  ROOT %fusion.1 = (f32[8,16]{1,0}, f32[4,16]{1,0}) fusion(%a, %b), kind=kOutput, calls=%outer
}
"""


def test_a_collective_fusion_inside_an_op_is_named_once_not_with_the_collective_it_wraps():
    from tpudiag.model.matmuls import op_math
    program = parse_hlo_text(NESTED_COLLECTIVE_FUSION)
    # %rs is a reduce-scatter fusion (it calls %all-reduce-scatter.2, whose all-reduce.5 is its
    # collective step): one collective, named by the op the trace shows, not also by its inner step
    assert program.find("rs").collective_family == "reduce-scatter"
    assert op_math(program, program.find("fusion.1")).collectives == ("rs",)
