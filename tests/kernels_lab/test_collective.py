"""Ring collectives with remote DMAs, against jax.lax collectives in the TPU-semantics interpreter.

Runs in a subprocess: the simulated devices come from `--xla_force_host_platform_device_count`,
which must be set before jax initialises (the test process may already have a 1-device CPU).
DMAs execute eagerly in the interpreter: under the default "on_wait" mode some slots stay NaN
(see the module docstring, Known problem).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

_RUN = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import tpu as pltpu
from tpudiag.kernels_lab import collective as col
out = []
for case in json.loads(sys.argv[1]):
    direction = case.pop("direction")
    p = col.Problem(**case)
    mesh = jax.make_mesh((p.devices,), (col.AXIS,), devices=jax.devices()[:p.devices])
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(col.AXIS))
    x = jax.random.normal(jax.random.PRNGKey(1), col.global_shape(p), jnp.float32).astype(p.dtype)
    x = jax.device_put(x, sharding)
    got = jax.jit(lambda a: col.pallas(a, p=p, blocks=col.BlockSizes(direction), mesh=mesh,
                                       interpret=pltpu.InterpretParams(dma_execution_mode="eager")))(x)
    want = jax.jit(lambda a: col.reference(a, p=p, mesh=mesh))(x)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want))) if got.shape == want.shape else float("inf")
    out.append(dict(case, direction=direction, shape=list(got.shape), err=err))
print(json.dumps(out))
"""


def _run(cases: list[dict]) -> list[dict]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ring_collectives_agree_with_jax_lax_on_simulated_devices():
    # odd shard shapes near the tiling limits (9 rows: one past a sublane tile; 130 lanes), both
    # directions, 4 and 3 devices (an odd ring), f32 and bf16
    cases = [dict(kind="all-gather", devices=4, rows=9, cols=130, dtype="float32", direction=1),
             dict(kind="all-gather", devices=3, rows=8, cols=128, dtype="bfloat16", direction=-1),
             dict(kind="reduce-scatter", devices=4, rows=9, cols=130, dtype="float32", direction=1),
             dict(kind="reduce-scatter", devices=3, rows=16, cols=128, dtype="float32", direction=-1),
             dict(kind="all-reduce", devices=4, rows=8, cols=136, dtype="float32", direction=-1),
             dict(kind="all-reduce", devices=2, rows=9, cols=128, dtype="bfloat16", direction=1)]
    for r in _run(cases):
        tol = 1.6e-2 if r["dtype"] == "bfloat16" else 1e-5
        assert r["err"] <= tol, r


def test_problem_validates_itself():
    from tpudiag.kernels_lab import collective as col
    from tpudiag.kernels_lab.tiling import BlockSizeError

    with pytest.raises(BlockSizeError, match="at least 2 devices"):
        col.Problem(kind="all-gather", devices=1, rows=8, cols=128)
    p = col.Problem(kind="all-reduce", devices=4, rows=8, cols=128)
    with pytest.raises(BlockSizeError, match="direction must be 1 or -1"):
        col.BlockSizes(0).validate(p, 16 << 20)
    assert p.ici_bytes_per_device == 2 * 3 * 8 * 128 * 4
    assert [b.direction for b in col.candidates(p)] == [1, -1]
