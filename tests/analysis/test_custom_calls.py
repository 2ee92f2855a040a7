"""FLOPs and bytes for custom calls: from a declared cost_estimate, else from matmul shapes, else none."""

from __future__ import annotations

from tpudiag.analysis.custom_calls import matmul_cost
from tpudiag.model.matmuls import cost_estimate


def test_cost_estimate_from_the_backend_config():
    text = ('%custom-call.3 = f32[8,128]{1,0} custom-call(f32[8,128]{1,0} %a), custom_call_target="tpu_custom_call", '
            'backend_config={"custom_call_config": {"body": "TUxJUgA=", "cost_estimate": {"flops": 1048576, '
            '"transcendentals": 0, "bytes_accessed": 8192, "remote_bytes_transferred": 0}}}')
    assert cost_estimate(text) == (1048576.0, 8192.0)
    assert cost_estimate(text.replace('"cost_estimate"', '"other"')) is None


def test_matmul_shapes_plain_and_transposed():
    plain = ("%c = bf16[128,512]{1,0} custom-call(bf16[128,256]{1,0} %a, bf16[256,512]{1,0} %b), "
             'custom_call_target="x"')
    assert matmul_cost(plain) == (2.0 * 128 * 512 * 256, float((128 * 512 + 128 * 256 + 256 * 512) * 2))
    transposed = "%c = f32[128,512]{1,0} custom-call(f32[256,128]{1,0} %a, f32[512,256]{1,0} %b)"
    assert matmul_cost(transposed)[0] == 2.0 * 128 * 512 * 256


def test_shapes_that_do_not_compose_are_not_a_matmul():
    assert matmul_cost("%c = f32[128,512]{1,0} custom-call(f32[128,300]{1,0} %a, f32[256,512]{1,0} %b)") is None
    assert matmul_cost("%c = f32[128]{0} custom-call(f32[128]{0} %a)") is None  # elementwise kernel
    assert matmul_cost("%c = f32[8,8]{1,0} fusion(f32[8,8]{1,0} %a, f32[8,8]{1,0} %b)") is None


def test_matmul_shapes_behind_tiled_layouts():
    # TPU long names carry tiled layouts whose parentheses must not end the operand list.
    tiled = ("%shard_map.19 = bf16[2048,2048]{1,0:T(8,128)(2,1)} custom-call(bf16[2048,2048]{1,0:T(8,128)(2,1)} "
             "%param.2, bf16[2048,2048]{1,0:T(8,128)(2,1)} %param.3), custom_call_target=\"tpu_custom_call\"")
    assert matmul_cost(tiled)[0] == 2.0 * 2048 ** 3


def test_a_modelled_pallas_matmul_gets_its_flops_from_the_operand_shapes(tmp_path):
    """simulate prints operand shapes in long names, as a real trace does, so the kernel's FLOPs are derived."""
    import pytest

    from tpudiag.parsers.compile_output import load_compile_output
    from tpudiag.compiler.simulate import simulate
    from tpudiag.examples_data import EXAMPLE_DUMPS
    from tpudiag.pipeline import diagnose

    dumps = EXAMPLE_DUMPS.parent / "pallas_matmul_v5e"
    if not dumps.is_dir():
        pytest.skip(f"no Pallas example dumps at {dumps}: only a checkout has them")
    simulate(load_compile_output(dumps), tmp_path / "logdir")
    ops = diagnose(str(tmp_path / "logdir")).analysis.ops
    kernel = ops[ops["category"] == "custom-call"].iloc[0]
    assert kernel["flops"] == 2.0 * 2048 ** 3 * kernel["occurrences"]
    assert 0.5 < kernel["flop_utilization"] <= 1.0  # a healthy tiled bf16 matmul, near the roofline
