"""Multi-output fusions: one Pallas kernel with a tuple out_shape, each output checked on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

from tpudiag.kernels_lab.spec import NotReproducible, infer  # noqa: E402

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "models" / "captures" / "transformer_train_v5e"

# The shape of the bundled v5e step's `fusion.198`: an async collective fusion whose output 0 is a
# matmul and whose other outputs are the all-gather's buffers (aliased) and its sync flags.
ASYNC_FUSION = ("(bf16[512,256]{1,0:T(8,128)(2,1)}, bf16[8,128,3,2,128]{4,1,3,0,2:T(8,128)(2,1)S(1)}, "
                "s32[2]{0:S(4)}, u32[]{:S(2)}, u32[]{:S(2)})")
ASYNC_LINE = (f"%fusion.198 = {ASYNC_FUSION} fusion(%a, %b, %c, %d, %e), kind=kOutput, "
              "output_to_operand_aliasing={{1}: (0, {}), {2}: (1, {}), {3}: (2, {}), {4}: (3, {})}, "
              "calls=%async_collective_fusion.198")


def test_async_collective_fusion_becomes_a_matmul_with_carried_buffers():
    family, p, basis = infer(name="fusion.198", category="convolution fusion", shape_with_layout=ASYNC_FUSION,
                             hlo_text=ASYNC_LINE, tf_op="dot_general", flops=2.0 * 512 * 256 * 1024,
                             bytes_accessed=0.0)
    assert family == "multi_output" and p["kind"] == "matmul" and (p["m"], p["n"], p["k"]) == (512, 256, 1024)
    assert p["extras"] == [[6144, 128, "bfloat16", "carried"]]
    assert any("3 state outputs not reproduced" in b for b in basis)


def test_near_miss_tuple_of_state_only_is_refused_with_the_reason():
    with pytest.raises(NotReproducible, match="no bf16/f32 output that is not aliased"):
        infer(name="fusion.9", category="loop fusion", shape_with_layout="(s32[2]{0}, u32[]{:S(2)})",
              hlo_text="", tf_op="", flops=0.0, bytes_accessed=0.0)


def test_matmul_tuple_without_a_whole_k_says_why():
    with pytest.raises(NotReproducible, match="contracting dim is unknown"):
        infer(name="fusion.5", category="convolution fusion", shape_with_layout="(bf16[8,128]{1,0}, f32[8]{0})",
              hlo_text="", tf_op="", flops=0.0, bytes_accessed=0.0)


@pytest.mark.parametrize("interpret", ["plain", "tpu"])
@pytest.mark.parametrize("problem, blocks", [
    # ragged M (136 = 17 rows of 8) and a partial N block, one carried and one computed extra
    (dict(kind="matmul", m=136, n=384, k=256, extras=((24, 256, "bfloat16", "carried"),
                                                      (8, 128, "float32", "computed"))), (64, 128, 256)),
    # elementwise primary with odd dims (13 x 200: below one (8,128) tile on both sides of the edge)
    (dict(kind="elementwise", m=13, n=200, n_inputs=3, in_dtype="float32", out_dtype="float32",
          extras=((1, 256, "float32", "computed"), (5, 7, "float32", "carried"))), (8, 1, 128)),
])
def test_every_output_agrees_with_the_reference_in_interpret_mode(problem, blocks, interpret):
    from jax.experimental.pallas import tpu as pltpu

    from tpudiag.kernels_lab import multi_output as mo
    from tpudiag.kernels_lab.harness import numerics_check

    p = mo.Problem(**problem)
    b = mo.fit(p, *blocks).validate(p, 16 << 20)
    mode = pltpu.InterpretParams() if interpret == "tpu" else True
    result = numerics_check(mo, p, b, interpret=mode)
    assert result["ok"] and len(result["output_errors"]) == 1 + len(p.extras), result


def test_a_broken_extra_output_is_caught_per_output(monkeypatch):
    from tpudiag.kernels_lab import multi_output as mo
    from tpudiag.kernels_lab.harness import numerics_check

    p = mo.Problem(kind="elementwise", m=16, n=128, in_dtype="float32", out_dtype="float32",
                   extras=((8, 128, "float32", "computed"),))
    real = mo.reference
    monkeypatch.setattr(mo, "reference", lambda q, *a: (real(q, *a)[0], 3.0 * a[-1]))
    result = numerics_check(mo, p, mo.fit(p, 8, 1, 128), interpret=True)
    assert not result["ok"] and result["output_errors"][0] == 0.0 and result["output_errors"][1] > 0.1


@pytest.mark.skipif(not BUNDLED.exists(), reason="the bundled example is not in this checkout")
def test_bundled_async_fusions_are_reproducible(tmp_path):
    from tpudiag.kernels_lab.spec import survey
    from tpudiag.pipeline import diagnose

    rows = {r.op_name: r for r in survey(diagnose(BUNDLED))}
    for op in ("fusion.198", "fusion.203", "fusion.210", "fusion.215"):
        assert rows[op].family == "multi_output" and rows[op].problem.kind == "matmul", rows[op].reason
