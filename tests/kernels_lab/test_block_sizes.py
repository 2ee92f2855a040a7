"""BlockSizes validation: the (8,128) rule, K divisibility and the VMEM budget, with expected vs actual."""

from __future__ import annotations

import pytest

pytest.importorskip("jax", reason="the kernel families import jax")

from tpudiag.kernels_lab import elementwise, matmul, reduction  # noqa: E402
from tpudiag.kernels_lab.tiling import BlockSizeError, scale_dim  # noqa: E402
from tpudiag.model.hardware import chip_for  # noqa: E402

V5E_VMEM = chip_for("v5e").vmem_bytes
V4_VMEM = chip_for("v4").vmem_bytes  # 16 MiB


@pytest.mark.parametrize(("blocks", "message"), [
    ((100, 128, 128), "x block (block_m, block_k): block second-minor dim must be a multiple of 8 or the full "
                      "dim 256, got 100"),
    ((128, 128, 200), "w block (block_k, block_n): block minor dim must be a multiple of 128 or the full dim "
                      "384, got 200"),
    ((128, 192, 128), "x block (block_m, block_k): block minor dim must be a multiple of 128 or the full dim "
                      "512, got 192"),
    ((512, 128, 128), "block rows 512 exceeds the array dim 256; expected at most 256"),
    ((128, 384, 128), "block_k: block 384 must divide the dim 512"),
])
def test_matmul_block_errors_show_expected_and_actual(blocks, message):
    p = matmul.Problem(256, 512, 384)
    with pytest.raises(BlockSizeError) as exc:
        matmul.BlockSizes(*blocks).validate(p, V5E_VMEM)
    assert message in str(exc.value)


def test_vmem_budget_counts_double_buffering():
    p = matmul.Problem(4096, 4096, 4096, "float32", "float32")
    b = matmul.BlockSizes(1024, 1024, 1024)
    # 2 x (x + w + out) blocks of 4 MiB each + a 4 MiB f32 accumulator = 28 MiB
    assert b.vmem_bytes(p) == 28 << 20
    b.validate(p, V5E_VMEM)  # fits v5e's 128 MiB
    with pytest.raises(BlockSizeError, match=r"blocks need 28\.00 MiB of VMEM \(2 buffers per blocked operand, "
                                             r"plus scratch\); expected at most 16\.00 MiB"):
        b.validate(p, V4_VMEM)


@pytest.mark.parametrize(("fam", "problem", "blocks"), [
    # near misses that are legal: full unaligned dims, 8-row bf16 blocks, a partial M block
    (matmul, matmul.Problem(200, 256, 300), matmul.BlockSizes(200, 256, 300)),
    (matmul, matmul.Problem(200, 256, 300, "bfloat16"), matmul.BlockSizes(8, 128, 128)),
    (reduction, reduction.Problem(100, 200), reduction.BlockSizes(16)),
    (elementwise, elementwise.Problem(96, 300), elementwise.BlockSizes(96, 300)),
])
def test_near_misses_are_accepted(fam, problem, blocks):
    assert blocks.validate(problem, V5E_VMEM) is blocks


def test_reduction_and_elementwise_errors():
    with pytest.raises(BlockSizeError, match="block second-minor dim must be a multiple of 8 or the full dim 100, "
                                             "got 12"):
        reduction.BlockSizes(12).validate(reduction.Problem(100, 256), V5E_VMEM)
    with pytest.raises(BlockSizeError, match="block minor dim must be a multiple of 128 or the full dim 300, got 64"):
        elementwise.BlockSizes(8, 64).validate(elementwise.Problem(96, 300), V5E_VMEM)
    with pytest.raises(BlockSizeError, match="expected at most 16.00 MiB"):
        reduction.BlockSizes(4096).validate(reduction.Problem(8192, 4096, "softmax", "float32", "float32"), V4_VMEM)


def test_problem_rejects_unknown_variants():
    with pytest.raises(BlockSizeError, match="activation must be one of"):
        matmul.Problem(8, 128, 128, activation="tanh")
    with pytest.raises(BlockSizeError, match="reduction op must be one of"):
        reduction.Problem(8, 128, op="max")


def test_fit_and_scale_keep_blocks_legal():
    p = matmul.Problem(8192, 4096, 50257)
    assert matmul.fit(p, 1024, 1536, 1024) == matmul.BlockSizes(1024, 1024, 1024)  # K block divides K
    assert scale_dim(4096, 16) == 256 and scale_dim(50257, 16) == 3142 and scale_dim(8192, 100) == 128
    assert scale_dim(24, 2) == 8 and scale_dim(50257, 1) == 50257


def test_transpose_blocks_obey_the_rule_in_both_roles():
    from tpudiag.kernels_lab import transpose

    # 8 rows is fine for the input block but becomes the output block's minor dim
    with pytest.raises(BlockSizeError, match=r"output block \(block_cols, block_rows\): block minor dim must be a "
                                             r"multiple of 128 or the full dim 256, got 8"):
        transpose.BlockSizes(8, 128).validate(transpose.Problem(256, 384), V5E_VMEM)
    transpose.BlockSizes(128, 128).validate(transpose.Problem(256, 384), V5E_VMEM)


@pytest.mark.parametrize("generation", ["v5e", "v6e", "v5p", None])
def test_tuned_defaults_fit_the_scoped_vmem_limit(generation):
    """Defaults stay within the compiler's default scoped VMEM limit (16 MiB v5e, 32 MiB v6e; the
    unmeasured generations get the safe budget), so an extracted repro compiles as written."""
    from tpudiag.kernels_lab import transpose

    limit = {"v6e": 32 << 20}.get(generation, 16 << 20)
    problems = [(reduction, reduction.Problem(8192, 4096, "softmax")),
                (reduction, reduction.Problem(8192, 4096, "layernorm", "float32", "float32")),
                (reduction, reduction.Problem(8192, 50257, "softmax")),
                (elementwise, elementwise.Problem(4096, 4096, 2, "float32", "float32")),
                (elementwise, elementwise.Problem(8192, 50257, 8)),
                (transpose, transpose.Problem(8192, 4096, "float32")),
                (matmul, matmul.Problem(8192, 4096, 12288))]
    for fam, p in problems:
        b = fam.default_blocks(p, generation).validate(p, V5E_VMEM)
        assert b.vmem_bytes(p) < limit, (fam.FAMILY, p, b)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_DIM = st.integers(1, 70_000)
_BLOCK = st.sampled_from([1, 8, 16, 100, 128, 256, 300, 512, 1024, 2048, 4096])


@settings(max_examples=300, deadline=None)
@given(m=_DIM, k=_DIM, n=_DIM, bm=_BLOCK, bk=_BLOCK, bn=_BLOCK, rows=_DIM, cols=_DIM)
def test_fit_always_obeys_the_tiling_rule(m, k, n, bm, bk, bn, rows, cols):
    """Whatever the dims and requested blocks, `fit` returns blocks the (8,128) rule accepts (VMEM aside)."""
    from tpudiag.kernels_lab import transpose

    unlimited = 1 << 62
    matmul.fit(matmul.Problem(m, k, n), bm, bk, bn).validate(matmul.Problem(m, k, n), unlimited)
    reduction.fit(reduction.Problem(rows, cols), bm).validate(reduction.Problem(rows, cols), unlimited)
    elementwise.fit(elementwise.Problem(rows, cols), bm, bn).validate(elementwise.Problem(rows, cols), unlimited)
    transpose.fit(transpose.Problem(rows, cols), bm, bn).validate(transpose.Problem(rows, cols), unlimited)
