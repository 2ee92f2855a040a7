"""The lab on a Pallas kernel (`tpu_custom_call`): the user's own kernel, with the grid and blocks its
serialised body states (`kernels_lab.problems.pallas`), on the committed modelled capture."""

from __future__ import annotations

import pytest

from tests.cli.test_emit import run_cli
from tests.conftest import REPO

pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")

CAPTURE = REPO / "examples" / "models" / "captures" / "pallas_matmul_v5e"


@pytest.fixture(scope="module")
def rows():
    import tpudiag
    from tpudiag.kernels_lab.spec import survey

    return survey(tpudiag.diagnose(CAPTURE))


def test_the_kernel_is_reproducible_with_its_grid_and_blocks(rows):
    from tpudiag.kernels_lab.problems import pallas
    from tpudiag.kernels_lab.spec import coverage

    (row,) = rows
    assert row.op_name == "shard_map.19" and row.family == "pallas" and row.reason == ""
    assert isinstance(row.problem, pallas.Problem)
    k = row.problem.kernel
    assert k.grid == (4, 4, 4) and k.matmul_blocks == (512, 512, 512)
    assert k.dimension_semantics == ("parallel", "parallel", "arbitrary")
    # the operands and outputs as the capture states them: one device's 2048x2048 slices
    assert row.problem.operands == ("bf16[2048,2048]", "bf16[2048,2048]") and row.problem.outputs == ("bf16[2048,2048]",)
    # the kernel declares its cost (`pl.CostEstimate(flops=2 * m * k * n, ...)`)
    assert row.problem.flops == 2 * 2048 ** 3
    assert coverage(rows).compute_share == 1.0


def test_spec_json_round_trips_the_kernel(rows):
    from tpudiag.kernels_lab.problems import problem_fields, problem_from_fields

    problem = rows[0].problem
    assert problem_from_fields("pallas", problem_fields(problem)) == problem


def test_lab_ops_shows_grid_and_blocks(capsys):
    code, out, _ = run_cli(capsys, "lab", "ops", str(CAPTURE))
    assert code == 0
    assert "is a custom call" not in out and "reproducible: 100.0 % of compute time" in out
    flat = " ".join(out.split())
    assert "grid (4,4,4) parallel,parallel,arbitrary" in flat and "bm x bk x bn 512x512x512" in flat
    assert "pallas_matmul.py:27-35" in flat


def test_extract_on_the_kernel_points_to_tuning_the_users_function(capsys, tmp_path):
    code, _, err = run_cli(capsys, "lab", "extract", str(CAPTURE), "--op", "shard_map.19", "-o", str(tmp_path / "x"))
    assert code == 2 and "Pallas kernel of your own" in err and "lab tune MODULE:FN" in err
