"""FLOPs and bytes for custom calls: from a declared cost_estimate, else from matmul shapes, else none;
and filled into the op metadata only where the trace gave none (values worked by hand from the shapes)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.analysis.custom_calls import derive_costs, is_custom_call, matmul_cost, with_derived_costs
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


# ---------------------------------------------------------------------------------------------
# Which ops count as custom calls, and derived costs filled into the op metadata (hand-made rows)

_ESTIMATE = ('%k = f32[8,128]{1,0} custom-call(f32[8,128]{1,0} %a), custom_call_target="tpu_custom_call", '
             'backend_config={"custom_call_config": {"cost_estimate": {"flops": 5000, "bytes_accessed": 640}}}')
_MATMUL = "%m = bf16[128,512]{1,0} custom-call(bf16[128,256]{1,0} %a, bf16[256,512]{1,0} %b)"
_MATMUL_FLOPS = 2.0 * 128 * 512 * 256
_MATMUL_BYTES = float((128 * 512 + 128 * 256 + 256 * 512) * 2)


def test_custom_calls_by_category_or_by_text():
    assert is_custom_call("custom-call", "")
    assert is_custom_call("Custom-Call fusion", "")  # any case
    assert is_custom_call("other", "%k = f32[8]{0} custom-call(f32[8]{0} %a)")
    assert not is_custom_call("loop fusion", "%k = f32[8]{0} fusion(f32[8]{0} %a), calls=%custom-call.1")
    assert not is_custom_call("loop fusion", "%k = f32[8]{0} my_custom-call(f32[8]{0} %a)")


def test_a_batched_matmul_custom_call_counts_every_batch():
    batched = "%m = f32[4,128,512]{2,1,0} custom-call(f32[4,128,256]{2,1,0} %a, f32[4,256,512]{2,1,0} %b)"
    flops, size = matmul_cost(batched)
    assert flops == 2.0 * 4 * 128 * 512 * 256
    assert size == float(4 * (128 * 512 + 128 * 256 + 256 * 512) * 4)  # result + operands, f32
    assert matmul_cost("") is None
    assert matmul_cost("%m = f32[128,512]{1,0} dot(f32[128,256]{1,0} %a, f32[256,512]{1,0} %b)") is None
    # a tuple result of two arrays is not one matmul result
    assert matmul_cost("%m = (f32[128,512]{1,0}, f32[8]{0}) custom-call(f32[128,256]{1,0} %a, "
                       "f32[256,512]{1,0} %b)") is None
    # three operands are not a matmul
    assert matmul_cost("%m = f32[128,512]{1,0} custom-call(f32[128,256]{1,0} %a, f32[256,512]{1,0} %b, "
                       "f32[8]{0} %c)") is None


def _meta(rows: list[tuple[str, str, float, str]], bytes_accessed: list[float] | None = None) -> pd.DataFrame:
    n = len(rows)
    return pd.DataFrame({"name": [r[0] for r in rows], "category": [r[1] for r in rows],
                         "flops": np.array([r[2] for r in rows], dtype=np.float64),
                         "model_flops": np.zeros(n), "hlo_text": [r[3] for r in rows],
                         "bytes_accessed": np.array(bytes_accessed or [0.0] * n, dtype=np.float64),
                         "hbm_bytes": np.array(bytes_accessed or [0.0] * n, dtype=np.float64)},
                        index=pd.RangeIndex(10, 10 + n))


def test_derived_costs_from_the_estimate_first_then_the_shapes():
    both = _ESTIMATE.replace("custom-call(f32[8,128]{1,0} %a)",
                             "custom-call(bf16[128,256]{1,0} %a, bf16[256,512]{1,0} %b)").replace(
        "f32[8,128]{1,0} custom", "bf16[128,512]{1,0} custom")
    meta = _meta([("k.1", "custom-call", 0.0, _ESTIMATE),  # declares 5000 FLOPs, 640 bytes
                  ("m.1", "custom-call", 0.0, _MATMUL),  # no estimate: a matmul by its shapes
                  ("b.1", "custom-call", 0.0, both),  # both: the estimate wins
                  ("z.1", "custom-call", 0.0, _ESTIMATE.replace('"flops": 5000', '"flops": 0')),  # 0: the shapes
                  ("had.1", "custom-call", 7.0, _MATMUL),  # the trace gave FLOPs: kept
                  ("f.1", "loop fusion", 0.0, _MATMUL.replace("custom-call(", "fusion(")),  # not a custom call
                  ("e.1", "custom-call", 0.0, "%e = f32[8]{0} custom-call(f32[8]{0} %a)")])  # neither source
    d = derive_costs(meta)
    assert list(d.columns) == ["name", "flops", "bytes_accessed", "source"]
    assert list(d.itertuples(index=False, name=None)) == [
        ("k.1", 5000.0, 640.0, "cost_estimate"), ("m.1", _MATMUL_FLOPS, _MATMUL_BYTES, "matmul shapes"),
        ("b.1", 5000.0, 640.0, "cost_estimate")]


def test_derived_costs_at_one_flop_and_one_byte():
    # A kernel the trace gave 1 FLOP is kept as it is; one declaring 1 FLOP and 1 byte is taken at its word,
    # ahead of its matmul shapes. Rows the scan passes over do not end it.
    one = _ESTIMATE.replace('"flops": 5000', '"flops": 1').replace('"bytes_accessed": 640', '"bytes_accessed": 1')
    one_with_shapes = one.replace("custom-call(f32[8,128]{1,0} %a)",
                                  "custom-call(bf16[128,256]{1,0} %a, bf16[256,512]{1,0} %b)").replace(
        "f32[8,128]{1,0} custom", "bf16[128,512]{1,0} custom")
    meta = _meta([("had.1", "custom-call", 1.0, _MATMUL), ("f.1", "loop fusion", 0.0, ""),
                  ("one.1", "custom-call", 0.0, one_with_shapes)])
    assert list(derive_costs(meta).itertuples(index=False, name=None)) == [("one.1", 1.0, 1.0, "cost_estimate")]
    out, _ = with_derived_costs(meta)
    assert list(out["bytes_accessed"]) == [0.0, 0.0, 1.0]
    # existing bytes of exactly 1 are the trace's: kept
    out, _ = with_derived_costs(_meta([("one.1", "custom-call", 0.0, one_with_shapes)], bytes_accessed=[1.0]))
    assert out["bytes_accessed"].iloc[0] == 1.0 and out["flops"].iloc[0] == 1.0
    kept, _ = with_derived_costs(_meta([("k.1", "custom-call", 0.0, _ESTIMATE)], bytes_accessed=[1.0]))
    assert kept["bytes_accessed"].iloc[0] == 1.0 and kept["flops"].iloc[0] == 5000.0


def test_derived_costs_of_no_custom_call_are_an_empty_table():
    d = derive_costs(_meta([("f.1", "loop fusion", 0.0, "")]))
    assert d.empty and list(d.columns) == ["name", "flops", "bytes_accessed", "source"]


def test_with_derived_costs_fills_flops_and_bytes_only_where_the_trace_had_none():
    meta = _meta([("k.1", "custom-call", 0.0, _ESTIMATE), ("m.1", "custom-call", 0.0, _MATMUL),
                  ("k.1", "custom-call", 0.0, _ESTIMATE), ("f.1", "loop fusion", 3.0, "")],
                 bytes_accessed=[0.0, 999.0, 0.0, 10.0])
    out, derived = with_derived_costs(meta)
    assert list(derived["name"]) == ["k.1", "m.1", "k.1"]
    # every row of a derived op gets its FLOPs as the trace's and the model's
    assert list(out["flops"]) == [5000.0, _MATMUL_FLOPS, 5000.0, 3.0]
    assert list(out["model_flops"]) == [5000.0, _MATMUL_FLOPS, 5000.0, 0.0]
    # bytes only where the trace had none: m.1 keeps its 999
    assert list(out["bytes_accessed"]) == [640.0, 999.0, 640.0, 10.0]
    assert list(out["hbm_bytes"]) == [640.0, 999.0, 640.0, 10.0]
    assert list(meta["flops"]) == [0.0, 0.0, 0.0, 3.0]  # the input is not written into
    assert list(out.index) == list(meta.index)


def test_with_derived_costs_keeps_zero_bytes_when_the_estimate_declares_none():
    no_bytes = _ESTIMATE.replace(', "bytes_accessed": 640', "")
    out, _ = with_derived_costs(_meta([("k.1", "custom-call", 0.0, no_bytes)]))
    assert (out["flops"].iloc[0], out["bytes_accessed"].iloc[0], out["hbm_bytes"].iloc[0]) == (5000.0, 0.0, 0.0)


def test_with_derived_costs_without_a_custom_call_returns_the_table_itself():
    meta = _meta([("f.1", "loop fusion", 3.0, "")])
    out, derived = with_derived_costs(meta)
    assert out is meta and derived.empty
