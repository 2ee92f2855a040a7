"""Data-movement family: prefetch copies, relayouts, dynamic-slice / dynamic-update-slice."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tpudiag.kernels_lab.spec import infer  # noqa: E402

# Odd shapes near the (8,128) tiling limits: one row past a tile, 130 lanes, windows off tile edges.
CASES = [
    dict(op="copy", in_dims=(17, 130), out_dims=(17, 130), dtype="bfloat16"),
    dict(op="relayout", in_dims=(8, 16, 24), out_dims=(8, 16, 3, 8), dtype="bfloat16", perm=(0, 2, 3, 1)),
    dict(op="relayout", in_dims=(9, 136), out_dims=(9, 136), dtype="float32", perm=(1, 0)),
    dict(op="dynamic_slice", in_dims=(40, 257), out_dims=(9, 130), dtype="float32"),
    dict(op="dynamic_slice", in_dims=(8,), out_dims=(1,), dtype="uint32"),
    dict(op="dynamic_update_slice", in_dims=(33, 256), out_dims=(33, 256), dtype="int32", update_dims=(7, 129)),
]


@pytest.mark.parametrize("interpret", ["plain", "tpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['op']}-{'x'.join(map(str, c['out_dims']))}")
def test_agrees_with_the_xla_reference_in_interpret_mode(case, interpret):
    from jax.experimental.pallas import tpu as pltpu

    from tpudiag.kernels_lab import datamove as dm
    from tpudiag.kernels_lab.harness import numerics_check

    p = dm.Problem(**case)
    mode = pltpu.InterpretParams() if interpret == "tpu" else True
    result = numerics_check(dm, p, dm.default_blocks(p, None).validate(p, 16 << 20), interpret=mode)
    assert result["ok"] and result["tolerance"] in (0.0, 1e-4, 1.6e-2), result


def test_a_wrong_clamp_is_caught():
    """Near miss: a reference that does not clamp past-the-end starts disagrees with the kernel."""
    import jax.numpy as jnp

    from tpudiag.kernels_lab import datamove as dm
    from tpudiag.kernels_lab.harness import numerics_check

    p = dm.Problem(op="dynamic_slice", in_dims=(64, 128), out_dims=(8, 128), dtype="float32")

    class Unclamped:
        def __getattr__(self, name):
            return getattr(dm, name)

        @staticmethod
        def reference(q, x, idx):
            return jnp.roll(x, -idx[0] - 1, axis=0)[:8]  # off by one row

    assert not numerics_check(Unclamped(), p, dm.BlockSizes(1), interpret=True)["ok"]


@pytest.mark.parametrize(("kw", "op", "expect"), [
    (dict(category="copy-done", shape_with_layout="bf16[4,1024]{1,0:T(4,128)(2,1)S(1)}"), "copy",
     dict(in_dims=[4, 1024], out_dims=[4, 1024])),
    (dict(category="reshape", shape_with_layout="bf16[8,128,3,4,128]{4,3,2,1,0:T(4,128)(2,1)S(1)}",
          hlo_text="%reshape.74 = bf16[8,128,3,4,128] reshape(bf16[8,128,1536]{2,1,0} %all-gather.45)"),
     "relayout", dict(in_dims=[8, 128, 1536], perm=[0, 1, 2, 3, 4])),
    (dict(category="copy", shape_with_layout="bf16[8,128,3,4,128]{1,4,3,2,0:T(8,128)(2,1)S(1)}"), "relayout",
     dict(perm=[0, 2, 3, 4, 1])),
    (dict(category="dynamic-slice", shape_with_layout="u32[1]{0:T(128)}"), "dynamic_slice",
     dict(in_dims=[2], dtype="uint32")),
])
def test_spec_routes_data_movement(kw, op, expect):
    args = dict(name="x.1", hlo_text="", tf_op="", flops=0.0, bytes_accessed=0.0)
    args.update(kw)
    family, problem, basis = infer(**args)
    assert family == "datamove" and problem["op"] == op
    assert {k: problem[k] for k in expect} == expect
    assert basis[0].startswith(f"family datamove ({op})")


def test_near_miss_pred_is_refused():
    from tpudiag.kernels_lab.spec import NotReproducible

    with pytest.raises(NotReproducible, match="moves dtype pred"):
        infer(name="dynamic-slice.3", category="dynamic-slice", shape_with_layout="pred[8,128]{1,0}", hlo_text="",
              tf_op="", flops=0.0, bytes_accessed=0.0)


_COMPILE = r"""
import json, os, sys
import jax, numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tpudiag.kernels_lab import datamove as dm
from tpudiag.kernels_lab.sweep import compile_error_reason
out = []
for topo in ("v5e:2x2", "v6e:2x2"):
    dev = topologies.get_topology_desc(platform="tpu", topology_name=topo).devices[0]
    sh = NamedSharding(Mesh(np.array([dev]), ("x",)), PartitionSpec())
    for case in json.loads(sys.argv[1]):
        p = dm.Problem(**case)
        specs = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in dm.input_structs(p)]
        try:
            jax.jit(lambda *a: dm.pallas(*a, p=p, blocks=dm.BlockSizes(1))).lower(*specs).compile()
            out.append([topo, case["op"], "ok", ""])
        except Exception as exc:
            out.append([topo, case["op"], "refused", compile_error_reason(str(exc))])
print(json.dumps(out))
"""
# What the compiler may legitimately refuse, by what it says: VMEM, or a Mosaic limitation
# (dynamic offsets on tiled dims must be provably tile-aligned).
KNOWN_REFUSALS = ("VMEM OOM", "Mosaic failed to compile TPU kernel")


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(rows=st.integers(1, 40), cols=st.sampled_from([1, 127, 128, 130, 256]),
       dtype=st.sampled_from(["bfloat16", "float32", "int32"]))
def test_every_reproduction_compiles_deviceless_or_says_why(rows, cols, dtype):
    cases = [dict(op="copy", in_dims=(rows, cols), out_dims=(rows, cols), dtype=dtype),
             dict(op="relayout", in_dims=(rows, cols), out_dims=(rows, cols), dtype=dtype, perm=(1, 0)),
             dict(op="dynamic_slice", in_dims=(rows + 8, cols), out_dims=(rows, cols), dtype=dtype),
             dict(op="dynamic_update_slice", in_dims=(rows + 8, cols), out_dims=(rows + 8, cols), dtype=dtype,
                  update_dims=(rows, cols))]
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="")
    proc = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0 and "libtpu" in proc.stderr and "not" in proc.stderr.lower():
        pytest.skip("libtpu is not installed: no deviceless compile")
    assert proc.returncode == 0, proc.stderr[-1500:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(cases)
    for topo, op, status, reason in results:
        assert status == "ok" or any(k in reason for k in KNOWN_REFUSALS), (topo, op, reason)
        assert "\n" not in reason
