"""Concatenate, pad and reductions over non-minor dims: inference from HLO text built in code, and
each kernel against its plain-JAX reference in interpret mode (both interpreters), odd shapes near
the tiling limits (9 rows, 130 / 1 lanes, partial last blocks)."""

from __future__ import annotations

import pytest

from tpudiag.kernels_lab.spec import NotReproducible, infer

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")


def _infer(**kw):
    args = dict(name="fusion.7", category="loop fusion", shape_with_layout="", hlo_text="", tf_op="", flops=0.0,
                bytes_accessed=0.0, body="")
    args.update(kw)
    return infer(**args)


BIAS_GRAD = ("%fused_computation.9 (param_0.1: f32[8,128,256]) -> f32[256] {\n"
             "  %param_0.1 = f32[8,128,256]{2,1,0:T(8,128)} parameter(0)\n"
             "  %c = f32[] constant(0)\n"
             "  ROOT %reduce.43 = f32[256]{0:T(256)} reduce(%param_0.1, %c), dimensions={0,1}, to_apply=%add\n}")


def test_a_reduce_over_leading_dims_is_a_colsum():
    family, problem, basis = _infer(shape_with_layout="f32[256]{0:T(256)}", body=BIAS_GRAD)
    assert family == "reduction"
    assert problem == dict(rows=1024, cols=256, op="colsum", dtype="float32", out_dtype="float32", outer=1)
    assert "not its minor dim" in basis[0]


def test_a_reduce_over_a_middle_dim_keeps_the_outer_dims():
    body = BIAS_GRAD.replace("dimensions={0,1}", "dimensions={1}").replace("f32[256]{0:T(256)} reduce",
                                                                           "f32[8,256]{1,0} reduce")
    _, problem, _ = _infer(shape_with_layout="f32[8,256]{1,0}", body=body)
    assert (problem["outer"], problem["rows"], problem["cols"]) == (8, 128, 256)


def test_near_miss_a_minor_or_non_contiguous_reduce_is_not_a_colsum():
    minor = BIAS_GRAD.replace("dimensions={0,1}", "dimensions={2}").replace("f32[256]{0:T(256)} reduce",
                                                                            "f32[8,128]{1,0} reduce")
    family, problem, _ = _infer(shape_with_layout="f32[8,128]{1,0}", body=minor)
    assert (family, problem["op"]) == ("reduction", "sum")
    split = BIAS_GRAD.replace("dimensions={0,1}", "dimensions={0,2}").replace("f32[256]{0:T(256)} reduce",
                                                                              "f32[128]{0} reduce")
    family, problem, _ = _infer(shape_with_layout="f32[128]{0}", body=split)
    assert problem.get("op") != "colsum"


@pytest.mark.parametrize("tpu_interpret", [False, True])
@pytest.mark.parametrize(("kw", "block_rows"), [
    (dict(rows=37, cols=130, outer=3, dtype="float32", out_dtype="float32"), 8),  # partial last block, 130 lanes
    (dict(rows=9, cols=1, outer=2, dtype="bfloat16", out_dtype="bfloat16"), 9),  # 1 lane; 9 rows -> blocks of 8
    (dict(rows=64, cols=256, outer=1, dtype="bfloat16", out_dtype="float32"), 16),
])
def test_colsum_agrees_with_the_reference(kw, block_rows, tpu_interpret):
    from jax.experimental.pallas import tpu as pltpu

    from tpudiag.kernels_lab import reduction as r
    from tpudiag.kernels_lab.harness import numerics_check, tolerance_for

    p = r.Problem(op="colsum", **kw)
    b = r.fit(p, block_rows).validate(p, 16 << 20)
    result = numerics_check(r, p, b, interpret=pltpu.InterpretParams() if tpu_interpret else True)
    assert result["ok"], result
    assert result["max_rel_err"] <= tolerance_for(p)[0]


def test_colsum_problem_validates_itself():
    from tpudiag.kernels_lab import reduction as r
    from tpudiag.kernels_lab.tiling import BlockSizeError

    with pytest.raises(BlockSizeError, match="outer applies to colsum only"):
        r.Problem(rows=8, cols=128, op="softmax", outer=2)
    with pytest.raises(BlockSizeError, match="multiple of 8"):
        r.BlockSizes(9).validate(r.Problem(rows=64, cols=128, op="colsum"), 16 << 20)


def test_unknown_reduce_still_says_why():
    with pytest.raises(NotReproducible):
        _infer(shape_with_layout="f32[]{:T(128)}", body=BIAS_GRAD)


@pytest.mark.parametrize(("kw", "problem"), [
    (dict(name="concatenate.3", category="concatenate", shape_with_layout="bf16[9,390]{1,0}",
          hlo_text="%concatenate.3 = bf16[9,390]{1,0} concatenate(bf16[9,130]{1,0} %a, bf16[9,260]{1,0} %b), "
                   "dimensions={1}"),
     dict(op="concatenate", in_dims=[9, 390], out_dims=[9, 390], dtype="bfloat16", parts=[130, 260], axis=1)),
    (dict(name="pad.1", category="pad", shape_with_layout="f32[12,131]{1,0}",
          hlo_text="%pad.1 = f32[12,131]{1,0} pad(f32[9,130]{1,0} %x, f32[] %c), padding=1_2x0_1"),
     dict(op="pad", in_dims=[9, 130], out_dims=[12, 131], dtype="float32", pad_low=[1, 0], pad_high=[2, 1])),
])
def test_concatenate_and_pad_are_datamove(kw, problem):
    family, got, basis = _infer(**kw)
    assert (family, got) == ("datamove", problem)


@pytest.mark.parametrize(("kw", "reason"), [
    # near misses: what the kernels do not do, or what the text does not say
    (dict(name="pad.2", category="pad", shape_with_layout="f32[17,128]{1,0}",
          hlo_text="%pad.2 = f32[17,128]{1,0} pad(f32[9,128]{1,0} %x, f32[] %c), padding=0_0_1x0_0"),
     "interior or negative padding"),
    (dict(name="pad.3", category="pad", shape_with_layout="f32[7,128]{1,0}",
          hlo_text="%pad.3 = f32[7,128]{1,0} pad(f32[9,128]{1,0} %x, f32[] %c), padding=0_-2x0_0"),
     "interior or negative padding"),
    (dict(name="concatenate.4", category="concatenate", shape_with_layout="f32[9,390]{1,0}"),
     "inputs or axis are not in the HLO text"),
])
def test_concatenate_and_pad_near_misses_say_why(kw, reason):
    with pytest.raises(NotReproducible) as exc:
        _infer(**kw)
    assert reason in exc.value.one_line()


@pytest.mark.parametrize("tpu_interpret", [False, True])
@pytest.mark.parametrize("kw", [
    dict(op="concatenate", in_dims=(9, 390), out_dims=(9, 390), parts=(130, 128, 132), axis=1, dtype="float32"),
    dict(op="concatenate", in_dims=(17, 128), out_dims=(17, 128), parts=(8, 9), axis=0, dtype="bfloat16"),
    dict(op="pad", in_dims=(9, 130), out_dims=(12, 131), pad_low=(1, 0), pad_high=(2, 1), dtype="bfloat16"),
    dict(op="pad", in_dims=(8, 3, 2, 128), out_dims=(8, 3, 4, 128), pad_low=(0, 0, 1, 0), pad_high=(0, 0, 1, 0),
         dtype="int32"),
])
def test_concatenate_and_pad_agree_with_the_reference(kw, tpu_interpret):
    from jax.experimental.pallas import tpu as pltpu

    from tpudiag.kernels_lab import datamove as dm
    from tpudiag.kernels_lab.harness import numerics_check

    p = dm.Problem(**kw)
    result = numerics_check(dm, p, dm.BlockSizes(1).validate(p, 16 << 20),
                            interpret=pltpu.InterpretParams() if tpu_interpret else True)
    assert result["ok"] and result["max_rel_err"] == 0.0, result


def test_concatenate_and_pad_problems_validate_themselves():
    from tpudiag.kernels_lab import datamove as dm
    from tpudiag.kernels_lab.tiling import BlockSizeError

    with pytest.raises(BlockSizeError, match="sum to the output's dim"):
        dm.Problem(op="concatenate", in_dims=(9, 390), out_dims=(9, 390), parts=(130, 128), axis=1)
    with pytest.raises(BlockSizeError, match="must give"):
        dm.Problem(op="pad", in_dims=(9, 130), out_dims=(12, 130), pad_low=(1, 0), pad_high=(1, 0))


def test_scaled_down_concatenate_and_pad_stay_consistent():
    from tpudiag.kernels_lab import datamove as dm

    pad = dict(op="pad", in_dims=[1024, 1024], out_dims=[1026, 1024], dtype="float32", pad_low=[1, 0],
               pad_high=[1, 0])
    cat = dict(op="concatenate", in_dims=[512, 768], out_dims=[512, 768], dtype="float32", parts=[512, 256],
               axis=1)
    for p in (pad, cat):
        small = dm.Problem(**p).scaled(4)  # validates
        assert small.out_dims[small.axis] == sum(small.parts) if small.op == "concatenate" else small.in_dims[0] == 256


def test_near_miss_a_fusion_that_only_contains_a_pad_is_not_a_pad():
    """`pad_maximum_fusion` (v5e example) takes the max of three pads: not a pad of one input."""
    body = ("%fused_computation.5 (p0: bf16[8,1,128], p1: bf16[8,1,128]) -> bf16[8,3,128] {\n"
            "  %pad.1 = bf16[8,3,128]{2,1,0} pad(%p0, %c), padding=0_0x0_2x0_0\n"
            "  %pad.2 = bf16[8,3,128]{2,1,0} pad(%p1, %c), padding=0_0x2_0x0_0\n"
            "  ROOT %maximum.1 = bf16[8,3,128]{2,1,0} maximum(%pad.1, %pad.2)\n}")
    family, problem, _ = _infer(name="pad_maximum_fusion", shape_with_layout="bf16[8,3,128]{2,1,0}", body=body,
                                hlo_text="%pad_maximum_fusion = bf16[8,3,128]{2,1,0} fusion(%a, %b), kind=kLoop")
    assert problem.get("op") != "pad"
    family, problem, _ = _infer(name="pad_fusion", shape_with_layout="bf16[8,3,128]{2,1,0}",
                                body=body.replace("ROOT %maximum.1 = bf16[8,3,128]{2,1,0} maximum(%pad.1, %pad.2)",
                                                  "ROOT %pad.3 = bf16[8,3,128]{2,1,0} pad(%p0, %c), padding=0_0x1_1x0_0"),
                                hlo_text="%pad_fusion = bf16[8,3,128]{2,1,0} fusion(%a), kind=kLoop")
    assert (family, problem["op"]) == ("datamove", "pad")
    assert (problem["pad_low"], problem["pad_high"]) == ([0, 1, 0], [0, 1, 0])  # the ROOT's padding
