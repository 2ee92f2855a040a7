"""Every kernel family against its plain-JAX reference in Pallas interpret mode on CPU.

Small shapes keep it fast; each product covers both dtypes, a block that divides the problem, and
one that leaves a partial edge block (never written out of range) or uses a full, unaligned dim.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

from tpudiag.kernels_lab import elementwise, harness, matmul, reduction, transpose  # noqa: E402
from tpudiag.kernels_lab.problems import matmul as matmul_problem  # noqa: E402
from tpudiag.kernels_lab.problems import reduction as reduction_problem  # noqa: E402

VMEM = 128 << 20


def _check(fam, problem, blocks):
    blocks.validate(problem, VMEM)
    result = harness.numerics_check(fam, problem, blocks, interpret=True)
    assert result["ok"], result
    return result


@pytest.mark.parametrize(("shape", "dtype", "blocks"), [
    *itertools.product([(256, 256, 384)], ["float32", "bfloat16"], [(128, 128, 128), (256, 256, 384)]),
    # M and N not multiples of their blocks: partial edge blocks; K split in two
    *itertools.product([(200, 256, 300)], ["float32", "bfloat16"], [(64, 128, 128)]),
])
def test_matmul_matches_reference(shape, dtype, blocks):
    p = matmul.Problem(*shape, in_dtype=dtype, out_dtype=dtype)
    result = _check(matmul, p, matmul.BlockSizes(*blocks))
    assert result["grid"] == list(matmul.BlockSizes(*blocks).grid(p))


@pytest.mark.parametrize(("activation", "bias"), list(itertools.product(matmul_problem.ACTIVATIONS, [False, True])))
def test_matmul_epilogues_match_reference(activation, bias):
    # bf16 in, f32 out: the epilogue's convert is part of what is checked
    p = matmul.Problem(128, 256, 256, "bfloat16", "float32", bias=bias, activation=activation)
    _check(matmul, p, matmul.BlockSizes(64, 128, 128))


@pytest.mark.parametrize(("op", "dtype", "block_rows"),
                         list(itertools.product(reduction_problem.OPS, ["float32", "bfloat16"], [16, 40])))
def test_reduction_matches_reference(op, dtype, block_rows):
    # 100 rows: 16-row blocks leave a partial last block; cols 200 is a full, unaligned minor dim
    p = reduction.Problem(100, 200, op=op, dtype=dtype, out_dtype=dtype)
    _check(reduction, p, reduction.BlockSizes(block_rows))


@pytest.mark.parametrize(("n_inputs", "dtype", "activation", "blocks"), [
    (1, "float32", "none", (64, 128)),  # a copy
    (2, "bfloat16", "none", (64, 256)),
    (3, "float32", "gelu", (40, 128)),
    (2, "bfloat16", "silu", (96, 300)),  # full, unaligned minor dim
    (4, "float32", "relu", (96, 128)),
])
def test_elementwise_matches_reference(n_inputs, dtype, activation, blocks):
    p = elementwise.Problem(96, 300, n_inputs=n_inputs, dtype=dtype, out_dtype=dtype, activation=activation)
    _check(elementwise, p, elementwise.BlockSizes(*blocks))


def test_numerics_check_reports_a_mismatch():
    """A kernel that computes the wrong thing fails the check (the check is not vacuous)."""

    class Broken:
        FAMILY = "elementwise"
        Problem, BlockSizes, make_inputs = elementwise.Problem, elementwise.BlockSizes, elementwise.make_inputs
        reference = staticmethod(elementwise.reference)

        @staticmethod
        def pallas(*xs, p, blocks, interpret):
            return elementwise.pallas(*xs, p=p, blocks=blocks, interpret=interpret) * 1.01

    p = elementwise.Problem(16, 128, n_inputs=1, dtype="float32", out_dtype="float32")
    result = harness.numerics_check(Broken, p, elementwise.BlockSizes(8, 128), interpret=True)
    assert not result["ok"]
    assert result["max_rel_err"] == pytest.approx(0.01, rel=1e-3)


def test_tolerance_is_the_looser_dtype():
    assert harness.tolerance_for(matmul.Problem(8, 128, 128, "bfloat16", "float32")) == (1.6e-2, "bfloat16")
    assert harness.tolerance_for(matmul.Problem(8, 128, 128, "float32", "float32")) == (1e-4, "float32")


@pytest.mark.parametrize("fam", [matmul, reduction, elementwise, transpose])
def test_candidates_and_defaults_are_legal_for_the_example_shapes(fam):
    problem = {"matmul": matmul.Problem(8192, 4096, 50257), "reduction": reduction.Problem(8192, 4096),
               "elementwise": elementwise.Problem(4096, 4096, 2, "float32", "float32"),
               "transpose": transpose.Problem(8192, 4096)}[fam.FAMILY]
    for gen in ("v5e", "v6e", None):
        fam.default_blocks(problem, gen).validate(problem, VMEM)
    legal = 0
    for b in fam.candidates(problem):
        try:
            b.validate(problem, VMEM)
            legal += 1
        except ValueError:
            pass
    assert legal >= 3


def test_matmul_hbm_bytes_match_the_reference_sweep():
    """§8.2: 512,2048,512 on 2048^3 bf16 moves 75.5 MB (92.1 us at 820 GB/s) when x is re-read per N
    block; with K in one block x's block index does not change along N, so it is read once."""
    p = matmul.Problem(2048, 2048, 2048)
    assert matmul.hbm_bytes(p, matmul.BlockSizes(512, 512, 512)) == 2048 * 2048 * 2 * (4 + 4 + 1)
    assert matmul.hbm_bytes(p, matmul.BlockSizes(512, 2048, 512)) == 2048 * 2048 * 2 * (1 + 4 + 1)
    assert np.isclose(p.min_hbm_bytes, 3 * 2048 * 2048 * 2)


@pytest.mark.parametrize(("shape", "dtype", "blocks"), [
    ((256, 384), "float32", (128, 128)),
    ((256, 384), "bfloat16", (128, 128)),
    ((300, 256), "bfloat16", (128, 256)),  # partial last row block
    ((256, 384), "float32", (256, 384)),  # one block, full dims
])
def test_transpose_matches_reference(shape, dtype, blocks):
    p = transpose.Problem(*shape, dtype=dtype)
    _check(transpose, p, transpose.BlockSizes(*blocks))


def test_tpu_semantics_interpreter_agrees_on_partial_blocks():
    """pltpu.InterpretParams simulates VMEM and the pipeline's DMAs: partial edge blocks and the fused
    epilogue still match the reference."""
    from jax.experimental.pallas import tpu as pltpu

    p = matmul.Problem(200, 256, 300, "bfloat16", "bfloat16", bias=True, activation="gelu")
    result = harness.numerics_check(matmul, p, matmul.BlockSizes(64, 128, 128), interpret=pltpu.InterpretParams())
    assert result["ok"] and result["interpret"] == "tpu"
