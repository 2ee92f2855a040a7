"""FLOPs and bytes for custom calls: from a declared cost_estimate, else from matmul shapes, else none."""

from __future__ import annotations

from tpudiag.analysis.custom_calls import cost_estimate, matmul_cost


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
