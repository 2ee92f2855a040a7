"""Ring collectives with remote DMAs, against jax.lax collectives in the TPU-semantics interpreter.

Runs in a subprocess: the simulated devices come from `--xla_force_host_platform_device_count`,
which must be set before jax initialises (the test process may already have a 1-device CPU). The
interpreter runs with its default `dma_execution_mode="on_wait"` (a DMA moves its data only when
its semaphore is waited on), the strict mode that exposes a wait satisfied by the wrong DMA.
Shards stay small: larger rings were seen to hang the interpreter on a 2-core machine
(`tpudiag.kernels_lab.spec.CPU_COLLECTIVE_BUFFER_BYTES`).
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
cases, shared = json.loads(sys.argv[1]), sys.argv[2] == "shared"
if shared:  # the regression: one semaphore for every step, as the first version had
    orig = col._remote
    col._remote = lambda src, dst, s, r, index, to: orig(src, dst, s, r, (index[0], 0), to)
out = []
for case in cases:
    blocks = col.BlockSizes(**case.pop("blocks"))
    p = col.Problem(**case)
    blocks.validate(p, 16 << 20)
    x, = col.make_inputs(p, 1)
    got = jax.jit(lambda a: col.pallas(a, p=p, blocks=blocks, interpret=True))(x)
    want = jax.jit(lambda a: col.reference(p, a))(x)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    ok_shape = got.shape == want.shape
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want))) if ok_shape else float("inf")
    out.append(dict(case, blocks=blocks.label(), shape=list(got.shape), err=err,
                    nan_rows=int(np.isnan(got).any(axis=1).sum())))
print(json.dumps(out))
"""


def _run(cases: list[dict], semaphores: str = "per-step") -> list[dict]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(cases), semaphores], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ring_collectives_agree_with_jax_lax_on_simulated_devices():
    # odd shard shapes near the tiling limits (9 rows: one past a sublane tile; 130 lanes), both
    # directions, bidirectional, chunked, 4, 3 (an odd ring) and 2 devices, f32, bf16 and int8
    cases = [dict(kind="all-gather", devices=4, rows=9, cols=130, dtype="float32", blocks=dict(direction=1)),
             dict(kind="all-gather", devices=3, rows=8, cols=128, dtype="bfloat16", blocks=dict(direction=-1)),
             dict(kind="all-gather", devices=4, rows=17, cols=130, dtype="int8",
                  blocks=dict(chunks=2, bidirectional=True)),
             dict(kind="reduce-scatter", devices=4, rows=9, cols=130, dtype="float32", blocks=dict(chunks=2)),
             dict(kind="reduce-scatter", devices=3, rows=16, cols=128, dtype="float32",
                  blocks=dict(direction=-1, bidirectional=True)),
             dict(kind="all-reduce", devices=4, rows=8, cols=136, dtype="float32", blocks=dict(direction=-1)),
             dict(kind="all-reduce", devices=3, rows=24, cols=128, dtype="bfloat16",
                  blocks=dict(chunks=4, bidirectional=True)),
             dict(kind="all-reduce", devices=2, rows=9, cols=128, dtype="bfloat16", blocks=dict(direction=1))]
    for r in _run(cases):
        tol = {"bfloat16": 1.6e-2, "float32": 1e-5, "int8": 0.0}[r["dtype"]]
        assert r["err"] <= tol, r


def test_regression_one_semaphore_for_all_steps_forwards_slots_not_yet_received():
    """The first version shared one DMA semaphore across steps: a neighbour's step s+1 DMA could
    satisfy the wait for step s, and the slot forwarded next had not arrived (NaN under on_wait)."""
    (r,) = _run([dict(kind="all-gather", devices=4, rows=9, cols=130, dtype="float32", blocks={})], "shared")
    assert r["nan_rows"] > 0 and r["err"] != 0.0


def test_problem_and_blocks_validate_themselves():
    from tpudiag.kernels_lab import collective as col
    from tpudiag.kernels_lab.tiling import BlockSizeError

    with pytest.raises(BlockSizeError, match="at least 2 devices"):
        col.Problem(kind="all-gather", devices=1, rows=8, cols=128)
    with pytest.raises(BlockSizeError, match="must name 2 devices"):
        col.Problem(kind="all-gather", devices=2, rows=8, cols=128, group=[0, 1, 2])
    p = col.Problem(kind="all-reduce", devices=4, rows=8, cols=128)
    with pytest.raises(BlockSizeError, match="direction must be 1 or -1"):
        col.BlockSizes(0).validate(p, 16 << 20)
    with pytest.raises(BlockSizeError, match="chunks 5 exceed the 4 rows"):
        col.BlockSizes(1, 5, True).validate(p, 16 << 20)
    assert p.ici_bytes_per_device == 2 * 3 * 8 * 128 * 4
    # bidirectional halves the modelled ICI time: two links instead of one
    assert col.ici_seconds(p, col.BlockSizes(1, 1, True), 45e9) == col.ici_seconds(p, col.BlockSizes(), 45e9) / 2


@pytest.mark.parametrize(("rows", "chunks", "bidirectional"), [(9, 1, False), (9, 2, True), (64, 4, False),
                                                               (17, 4, True), (3, 3, False)])
def test_streams_cover_every_row_once(rows, chunks, bidirectional):
    from tpudiag.kernels_lab import collective as col

    p = col.Problem(kind="all-gather", devices=2, rows=rows, cols=128)
    b = col.fit(p, 1, chunks, bidirectional)
    covered = sorted(r for _, first, count in b.streams(p) for r in range(first, first + count))
    assert covered == list(range(rows))
    assert {d for d, _, _ in b.streams(p)} == ({1, -1} if bidirectional else {1})
    # sublane-aligned windows whenever each piece can hold 8 rows
    if rows >= 8 * chunks * (2 if bidirectional else 1):
        assert all(first % 8 == 0 for _, first, _ in b.streams(p)[:chunks])


def test_candidates_sweep_direction_and_chunks():
    from tpudiag.kernels_lab import collective as col

    labels = [b.label() for b in col.candidates(col.Problem(kind="all-reduce", devices=4, rows=64, cols=128))]
    assert labels[:2] == ["ring +1, 1 chunk", "ring -1, 1 chunk"]
    assert "bidirectional ring, 4 chunks" in labels and len(labels) == len(set(labels)) == 9
    # a 1-row shard cannot be split: only the two plain directions remain
    assert len(col.candidates(col.Problem(kind="all-gather", devices=2, rows=1, cols=128))) == 2
    # near miss: 9 rows split in two give windows off the row tile, which Mosaic refuses: not offered
    assert [b.label() for b in col.candidates(col.Problem(kind="all-gather", devices=2, rows=9, cols=128))] == [
        "ring +1, 1 chunk", "ring -1, 1 chunk"]
