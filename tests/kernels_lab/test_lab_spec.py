"""Family and shape inference for ops: the bundled example, HLO texts built in code, a dump directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpudiag.errors import UsageError
from tpudiag.kernels_lab import op_text
from tpudiag.kernels_lab.problems import PROBLEMS
from tpudiag.kernels_lab.spec import NotReproducible, infer, spec_from_diagnosis
from tpudiag.model.hlo_shapes import operand_shapes, parse_array
from tpudiag.parsers.hlo_text import load_hlo_text, parse_hlo_text
from tpudiag.pipeline import diagnose

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "captures" / "train_v6e_4chip"
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def extract_spec(capture: Path, op: str, dump: Path | None = None, **kw):
    """The op's spec as `tpudiag lab extract` makes it: the capture and its dump through `diagnose`."""
    return spec_from_diagnosis(diagnose(capture, dumps=(dump,) if dump is not None else ()), op, **kw)


def _no_shape(_name: str) -> str:
    return ""


def _infer(**kw):
    args = dict(name="fusion.7", category="loop fusion", shape_with_layout="", hlo_text="", tf_op="", flops=0.0,
                bytes_accessed=0.0, body="")
    args.update(kw)
    return infer(**args)


@pytest.mark.parametrize(("op", "family", "problem"), [
    # convolution fusion, no operands in the capture's HLO text: K from flops / (2*M*N)
    ("fusion.2", "matmul", dict(m=8192, k=4096, n=12288, in_dtype="bfloat16", out_dtype="bfloat16", bias=False,
                                activation="none")),
    ("fusion.8", "matmul", dict(m=8192, k=4096, n=50257, in_dtype="bfloat16", out_dtype="bfloat16", bias=False,
                                activation="none")),  # vocabulary not a multiple of 128
    # loop fusions named by their framework op
    ("fusion.1", "reduction", dict(rows=8192, cols=4096, op="layernorm", dtype="bfloat16", out_dtype="bfloat16")),
    ("fusion.4", "reduction", dict(rows=8192, cols=4096, op="softmax", dtype="bfloat16", out_dtype="bfloat16")),
    # adam update: bytes accessed = 3 x output bytes -> 2 inputs
    ("fusion.12", "elementwise", dict(rows=4096, cols=4096, n_inputs=2, dtype="float32", out_dtype="float32",
                                      activation="none")),
    # a copy into layout {0,1}: physically a transpose
    ("copy.1", "transpose", dict(rows=8192, cols=4096, dtype="bfloat16")),
])
def test_example_ops_infer_family_and_problem(op, family, problem):
    spec = extract_spec(EXAMPLE, op)
    assert (spec.family, spec.problem) == (family, PROBLEMS[family](**problem))
    assert spec.topology == "v6e:2x2" and spec.generation == "v6e" and spec.clock_hz is None
    assert spec.measured_time_ps > 0 and spec.occurrences > 0
    assert spec.run_problem == spec.problem  # no --scale-down


@pytest.mark.parametrize(("op", "problem"), [
    # no replica_groups in the capture: the ring is the capture's 4 chips (the basis says so)
    ("all-reduce.3", dict(kind="all-reduce", devices=4, rows=1024, cols=4096, dtype="float32", group=[0, 1, 2, 3])),
    ("all-gather-start.1", dict(kind="all-gather", devices=4, rows=1024, cols=12288, dtype="bfloat16",
                                group=[0, 1, 2, 3])),
    ("all-reduce-scatter.4", dict(kind="reduce-scatter", devices=4, rows=1024, cols=16384, dtype="float32",
                                  group=[0, 1, 2, 3])),
])
def test_example_collectives_map_to_the_collective_family(op, problem):
    spec = extract_spec(EXAMPLE, op)
    assert (spec.family, spec.problem) == ("collective", PROBLEMS["collective"](**problem))
    assert any("ring of 4 devices assumed" in b for b in spec.basis)
    # the CPU run is capped (the interpreter hangs on big rings on a small machine) and says so
    assert spec.run_problem.rows * spec.run_problem.cols * 4 * 4 <= 32 << 10
    assert any("capped" in n for n in spec.notes)


def test_unknown_op_is_a_usage_error_with_a_hint():
    with pytest.raises(UsageError) as exc:
        extract_spec(EXAMPLE, "fusion.99")
    assert "op `fusion.99` is not in the capture" in exc.value.one_line()
    assert "`fusion.1`" in exc.value.hint


def test_an_op_a_cpu_capture_lacks_names_the_ops_it_has():
    """The CPU capture's XLA CPU ops are its device ops (issue 29): an op it lacks is named, with the
    ops it has, instead of the old "no device ops"."""
    cpu = EXAMPLE.parent / "cpu_jax_profiler"
    with pytest.raises(UsageError) as exc:
        extract_spec(cpu, "dot.1")
    assert "`dot.1` is not in the capture" in str(exc.value) and "ynn_fusion" in exc.value.hint


def test_scale_down_keeps_alignment_classes():
    spec = extract_spec(EXAMPLE, "fusion.8", scale_down=16)
    assert spec.run_problem.m == 512 and spec.run_problem.k == 256
    assert spec.run_problem.n == 3142 and spec.run_problem.n % 128  # still ragged
    assert spec.problem.n == 50257


def test_dot_with_operands_gives_k_and_input_dtype():
    family, p, basis = _infer(category="convolution fusion", shape_with_layout="f32[512,1024]{1,0:T(8,128)}",
                              hlo_text="%fusion.3 = f32[512,1024]{1,0:T(8,128)} "
                                       "fusion(bf16[512,768]{1,0:T(8,128)(2,1)} "
                                       "%p0, bf16[768,1024]{1,0:T(8,128)(2,1)} %p1), kind=kOutput")
    assert family == "matmul" and (p["m"], p["k"], p["n"]) == (512, 768, 1024)
    assert (p["in_dtype"], p["out_dtype"]) == ("bfloat16", "float32")
    assert any("K=768 from the first operand" in b for b in basis)


def test_matmul_without_operands_or_whole_k_is_not_reproducible():
    with pytest.raises(NotReproducible, match="contracting dim is unknown"):
        _infer(category="convolution fusion", shape_with_layout="bf16[512,1024]", flops=2 * 512 * 1024 * 10.5)


def test_reduce_in_hlo_text_is_a_row_sum():
    family, p, _ = _infer(shape_with_layout="f32[4096]{0}",
                          hlo_text="%fusion.5 = f32[4096]{0} fusion(f32[4096,1000]{1,0} %p), kind=kInput",
                          body="%r = f32[4096]{0} reduce(f32[4096,1000]{1,0} %x, f32[] %c), dimensions={1}")
    assert family == "reduction" and p == dict(rows=4096, cols=1000, op="sum", dtype="float32", out_dtype="float32")


@pytest.mark.parametrize(("kw", "reason"), [
    (dict(name="while.1", category="while"), "`while.1` is a while loop"),
    (dict(shape_with_layout="(s32[2]{0}, u32[]{:S(2)})"), "`fusion.7` returns a tuple of 2 arrays with no bf16/f32"),
    (dict(shape_with_layout="f32[]{:T(128)S(6)}"), "`fusion.7` returns a scalar (f32[]{:T(128)S(6)})"),
    (dict(shape_with_layout=""), "has no array output shape the lab can read (shape: none)"),
    (dict(shape_with_layout="s8[64,128]{1,0}"), "has output dtype s8; the lab's kernels take bf16 or f32 only"),
    (dict(category="custom-call", shape_with_layout="f32[8,128]"), "is a custom call"),
    (dict(category="sort", shape_with_layout="f32[8,128]"), "has category `sort`, which no kernel family covers"),
    (dict(shape_with_layout="f32[2,3,1000]{2,0,1:T(2,128)}"),
     "writes layout {2,0,1}; the lab reproduces row-major outputs and 2-D copies into {0,1} only"),
])
def test_unsupported_ops_get_one_line_reasons(kw, reason):
    with pytest.raises(NotReproducible) as exc:
        _infer(**kw)
    assert reason in exc.value.one_line()


def test_elementwise_inputs_from_operands_and_body_activation():
    family, p, _ = _infer(shape_with_layout="bf16[64,256]{1,0}",
                          hlo_text="%fusion.9 = bf16[64,256]{1,0} fusion(bf16[64,256]{1,0} %a, bf16[64,256]{1,0} %b, "
                                   "bf16[64,256]{1,0} %c), kind=kLoop",
                          body="%t = f32[64,256] tanh(f32[64,256] %x)")
    assert family == "elementwise" and p["n_inputs"] == 3 and p["activation"] == "gelu"


def test_program_supplies_operands_and_epilogue():
    """A dump's program gives the op's fused body (its epilogue) and its operands (K from them)."""
    program = parse_hlo_text(
        "HloModule jit_step\n\n"
        "%fused_computation.2 (p0: bf16[64,128], p1: bf16[128,256], p2: bf16[256]) -> bf16[64,256] {\n"
        "  %p0 = bf16[64,128]{1,0} parameter(0)\n"
        "  %p1 = bf16[128,256]{1,0} parameter(1)\n"
        "  %p2 = bf16[256]{0} parameter(2)\n"
        "  %dot.1 = f32[64,256]{1,0} dot(bf16[64,128]{1,0} %p0, bf16[128,256]{1,0} %p1), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        "  %c = f32[256]{0} convert(bf16[256]{0} %p2)\n"
        "  %broadcast.1 = f32[64,256]{1,0} broadcast(f32[256]{0} %c), dimensions={1}\n"
        "  %add.1 = f32[64,256]{1,0} add(f32[64,256]{1,0} %dot.1, f32[64,256]{1,0} %broadcast.1)\n"
        "  %logistic.1 = f32[64,256]{1,0} logistic(f32[64,256]{1,0} %add.1)\n"
        "  ROOT %convert.1 = bf16[64,256]{1,0} convert(f32[64,256]{1,0} %logistic.1)\n"
        "}\n\n"
        "ENTRY %main (a: bf16[64,128], b: bf16[128,256], c: bf16[256]) -> bf16[64,256] {\n"
        "  %a = bf16[64,128]{1,0} parameter(0)\n"
        "  %b = bf16[128,256]{1,0} parameter(1)\n"
        "  %c = bf16[256]{0} parameter(2)\n"
        "  ROOT %fusion.2 = bf16[64,256]{1,0:T(8,128)(2,1)} fusion(bf16[64,128]{1,0} %a, bf16[128,256]{1,0} %b, "
        "bf16[256]{0} %c), kind=kOutput, calls=%fused_computation.2, metadata={op_name=\"x\"}\n"
        "}\n")
    text = op_text.from_program(program, "fusion.2", _no_shape)
    assert text.line == ("ROOT %fusion.2 = bf16[64,256]{1,0:T(8,128)(2,1)} fusion(%a, %b, %c), kind=kOutput, "
                         "calls=%fused_computation.2")  # metadata is not printed back
    assert "logistic(%add.1)" in text.body and text.operands_from == "the fused computation's parameters"
    assert [str(a) for a in text.operands] == ["bf16[64,128]", "bf16[128,256]", "bf16[256]"]
    family, p, basis = _infer(name="fusion.2", category="convolution fusion", shape_with_layout="bf16[64,256]{1,0}",
                              hlo_text=text.line, body=text.body, operands=list(text.operands),
                              operands_from=text.operands_from)
    assert family == "matmul" and p["k"] == 128 and p["bias"] and p["activation"] == "silu"
    assert op_text.from_program(program, "fusion.3", _no_shape) is None


def test_parse_array():
    a = parse_array("bf16[8192,4096]{1,0:T(8,128)(2,1)}")
    assert (a.dtype, a.dims, a.minor_to_major, a.row_major) == ("bf16", (8192, 4096), (1, 0), True)
    assert not parse_array("bf16[8192,4096]{0,1:T(8,128)(2,1)}").row_major
    assert parse_array("(f32[2], f32[3])") is None


def test_real_v5e_dump_fusion_is_a_matmul_with_k_from_flops():
    """`fusion.1` of the committed v5e MLP dump: operands by name only, a transposed convolution
    (dim_labels=fb_io->bf) in its body. K comes from the FLOP count, not from the first parameter
    (bf16[1024,512], the weight being updated), and the body's parameter shapes give the dtype."""
    dump = Path(__file__).resolve().parents[1] / "fixtures" / "dumps" / "v5e_mlp_train"
    program = load_hlo_text(next(dump.glob("*after_optimizations.txt")))
    text = op_text.from_program(program, "fusion.1", _no_shape)
    assert text.line.startswith("%fusion.1 = bf16[1024,512]") and "convolution(" in text.body
    assert [a.text for a in text.operands] == ["bf16[1024,512]", "bf16[256,1024]"]
    family, p, basis = _infer(name="fusion.1", category="convolution fusion",
                              shape_with_layout="bf16[1024,512]{1,0:T(8,128)(2,1)}", hlo_text=text.line,
                              flops=2.0 * 1024 * 512 * 256, body=text.body, operands=list(text.operands),
                              operands_from=text.operands_from)
    assert family == "matmul" and (p["m"], p["k"], p["n"]) == (1024, 256, 512)
    assert "family matmul: a dot/convolution in the HLO text" in basis


MODELLED_V5E = MODELS / "captures" / "transformer_train_v5e"
V5E_DUMP = MODELS / "dumps" / "transformer_train_v5e"


def test_extract_with_a_dump_reads_the_joined_program():
    """`--dump`: the op's text and fused body come from the dump program the join matched, as the
    report reads it: `fusion.31` has a reduce in its body (a row sum over 256), which the capture's
    text alone does not show (an elementwise stand-in)."""
    spec = extract_spec(MODELLED_V5E, "fusion.31", dump=V5E_DUMP)
    assert (spec.family, spec.problem.op, spec.problem.cols) == ("reduction", "sum", 256)
    assert any(n.startswith(f"HLO text and fusion body from the dump `{V5E_DUMP / 'xla'}`") for n in spec.notes)
    assert spec.operands == ("bf16[8,128,256]", "f32[8,128]", "f32[8,128]")
    assert "metadata=" not in spec.hlo_text and spec.hlo_text.startswith("%fusion.31 = f32[8,128]")
    assert extract_spec(MODELLED_V5E, "fusion.31").family == "elementwise"


def test_a_dump_the_join_refuses_is_not_read(tmp_path):
    """A dump of another program (one instruction under the capture's module name) does not join,
    so the lab does not take its text either: it says so and uses the capture's."""
    (tmp_path / "module_0007.jit_train_step.after_optimizations.txt").write_text(
        "HloModule jit_train_step\n\n"
        "ENTRY %main (p0: bf16[8192,4096]) -> bf16[8192,4096] {\n"
        "  %p0 = bf16[8192,4096]{1,0} parameter(0)\n"
        "  ROOT %fusion.2 = bf16[8192,4096]{1,0} tanh(%p0)\n"
        "}\n")
    spec = extract_spec(EXAMPLE, "fusion.2", dump=tmp_path)
    assert spec.family == "matmul" and spec.problem.activation == "none"
    assert any("is not in a dump joined to its program" in n for n in spec.notes)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SHAPE_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(lambda dt, dims, layout: f"{dt}[{','.join(map(str, dims))}]{layout}",
              st.sampled_from(["bf16", "f32", "s8", "pred", "f16", "u4"]),
              st.lists(st.integers(0, 70000), max_size=4),
              st.sampled_from(["", "{1,0}", "{0,1}", "{1,0:T(8,128)(2,1)}", "{2,0,1}", "{0}", "{:T(256)}", "{"])),
)


@settings(max_examples=200, deadline=None)
@given(shape=_SHAPE_TEXT, category=st.sampled_from(["loop fusion", "convolution fusion", "copy", "while", "sort",
                                                    "all-reduce", "custom-call", ""]),
       flops=st.floats(0, 1e15), nbytes=st.floats(0, 1e12), tf_op=st.sampled_from(["", "x/softmax", "ln/layer_norm"]))
def test_inference_never_fails_other_than_with_a_reason(shape, category, flops, nbytes, tf_op):
    """Random shapes and categories: a family with positive dims, or NotReproducible; nothing else."""
    try:
        family, problem, basis = _infer(category=category, shape_with_layout=shape, tf_op=tf_op, flops=flops,
                                        bytes_accessed=nbytes)
    except NotReproducible as exc:
        assert exc.one_line() and "\n" not in exc.one_line()
        return
    assert family in ("matmul", "reduction", "elementwise", "transpose", "datamove", "multi_output",
                      "collective") and basis
    if family == "collective":
        assert problem["devices"] >= 2 and len(problem["group"]) == problem["devices"]
    dims = [v for k, v in problem.items() if k in ("m", "k", "n", "rows", "cols", "n_inputs")]
    assert all(isinstance(d, int) and d >= 1 for d in dims), problem


def test_modelled_v5e_capture_ops():
    """The bundled modelled capture of a compiled transformer step (real HLO names and layouts, S(1)
    memory spaces, async collective fusions returning tuples)."""
    spec = extract_spec(MODELLED_V5E, "fusion.103")
    assert spec.family == "matmul" and (spec.problem.m, spec.problem.k, spec.problem.n) == (1024, 256, 768)
    assert spec.topology == "v5e:2x2" and spec.clock_hz == 1.5e9
    # its tuple of 11 (matmul + the all-gather's carried buffers and sync flags) is the multi_output family
    tupled = extract_spec(MODELLED_V5E, "fusion.198")
    assert tupled.family == "multi_output" and tupled.problem.kind == "matmul"


def test_operand_shapes_read_past_tiled_layouts():
    """A TPU trace prints operands with tiled layouts; `T(32,128)` must not end the operand list."""
    text = ("%fusion.138 = bf16[512,256]{1,0:T(8,128)(2,1)S(1)} fusion(pred[8,128,512]{2,1,0:T(32,128)(4,1)S(1)} "
            "%mask, bf16[8,128,256]{2,1,0:T(8,128)(2,1)S(1)} %x, f32[256]{0:T(256)S(1)} %scale)")
    assert [(a.dtype, a.dims, a.minor_to_major) for a in operand_shapes(text)] == [
        ("pred", (8, 128, 512), (2, 1, 0)), ("bf16", (8, 128, 256), (2, 1, 0)), ("f32", (256,), (0,))]


def test_a_batched_matmul_is_the_primary_with_its_batch_folded_into_m():
    """Regression: `fusion.57` (v5e transformer) is an attention matmul of batch 16 (8 x 2 heads)
    returning a tuple with a row statistic. Once the op math counted the batch apart, the lab took
    the f32[8,2,128] statistic as the primary and claimed K = flops / (2*16*128) = 16384. The
    matmul's own output is the primary, K = 128 from the compiled HLO, the batch folded into M, and
    its input dtype is the matmul's."""
    spec = extract_spec(MODELLED_V5E, "fusion.57")
    assert spec.family == "multi_output" and (spec.problem.m, spec.problem.k, spec.problem.n) == (2048, 128, 128)
    assert spec.problem.flops == spec.flops  # the whole op's FLOPs: nothing invented
    assert spec.problem.in_dtype == "bfloat16"  # the matmul's operands (bf16 x bf16), not the fusion's first
    assert any("batch of 16 is folded into M" in b for b in spec.basis)
