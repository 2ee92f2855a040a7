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


def test_the_body_gives_each_windows_index_map(rows):
    # the example's BlockSpecs: A (i, kk), B (kk, j), C (i, j) over the grid (i, j, kk); the body's
    # `transform_0..2` return exactly those grid indices
    k = rows[0].problem.kernel
    assert [b.index_map for b in k.blocks] == [("g0", "g2"), ("g2", "g1"), ("g0", "g1"), None]
    assert all(b.index_map_note == "" for b in k.blocks)


# Lowers repro.py's call deviceless for the capture's topology and reads the kernel body it makes
# back with tpudiag's own Mosaic reader; then compiles it. Runs in a child: libtpu's environment.
_CHILD = """
import json, re, sys
sys.argv = ["repro.py"]
import importlib.util
spec = importlib.util.spec_from_file_location("repro", {repro!r})
repro = importlib.util.module_from_spec(spec); spec.loader.exec_module(repro)
lowered, kind = repro.lower_deviceless()
text = lowered.as_text(dialect="hlo")
config = re.search(r'custom_call_target="tpu_custom_call".*?backend_config=(\\{{.*?\\}})(?:, [a-z_]+=|$)', text, re.M | re.S)
from tpudiag.parsers import mosaic
k = mosaic.read_kernel(mosaic.body_of(config.group(1)), 2)
lowered.compile()
print(json.dumps({{"grid": k.grid, "mm": k.matmul_blocks, "semantics": k.dimension_semantics, "kind": kind,
                  "blocks": [[b.role, b.shape, b.dtype, b.index_map] for b in k.blocks]}}))
"""


def test_extract_writes_a_repro_that_calls_the_users_kernel_as_captured(capsys, tmp_path, rows):
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("libtpu", reason="compiling for a TPU topology without a TPU needs libtpu (tpu extra)")
    out = tmp_path / "x"
    code, text, err = run_cli(capsys, "lab", "extract", str(CAPTURE), "--op", "shard_map.19", "-o", str(out))
    assert code == 0, err
    assert "warning" not in err and "left out:" in text and "python " in text
    repro = (out / "repro.py").read_text()
    assert "UNSUPPORTED = ()" in repro and "KERNEL_NAME = '_kernel'" in repro
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               PYTHONPATH=str(REPO))
    child = subprocess.run([sys.executable, "-c", _CHILD.format(repro=str(out / "repro.py"))], capture_output=True,
                           text=True, env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    captured = rows[0].problem.kernel
    assert got["kind"] == "TPU v5 lite"  # one device of the capture's v5e:2x2
    assert tuple(got["grid"]) == captured.grid == (4, 4, 4)
    assert tuple(got["mm"]) == captured.matmul_blocks == (512, 512, 512)
    assert tuple(got["semantics"]) == captured.dimension_semantics
    assert [[r, tuple(s), d, tuple(m) if m else None] for r, s, d, m in got["blocks"]] == \
        [[b.role, b.shape, b.dtype, b.index_map] for b in captured.blocks]


def test_check_and_tune_on_the_kernels_reproduction_say_what_to_run_instead(capsys, tmp_path):
    out = tmp_path / "x"
    assert run_cli(capsys, "lab", "extract", str(CAPTURE), "--op", "shard_map.19", "-o", str(out))[0] == 0
    code, _, err = run_cli(capsys, "lab", "check", str(out))
    assert code == 2 and "no reference to check it against" in " ".join(err.split()) and "--interpret" in err
    code, _, err = run_cli(capsys, "lab", "tune", str(out))
    assert code == 2 and "tpudiag lab tune examples/models/pallas_matmul.py:tiled_matmul --param bn=256,512" in " ".join(err.split())


def test_lab_ops_lists_what_the_kernels_reproduction_leaves_out(capsys):
    code, out, _ = run_cli(capsys, "lab", "ops", str(CAPTURE))
    flat = " ".join(out.split())
    assert code == 0 and "`shard_map.19`'s reproduction leaves out: the code around the kernel in your function" in flat


def test_extract_says_scale_down_does_not_apply_to_the_users_kernel(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "lab", "extract", str(CAPTURE), "--op", "shard_map.19", "-o", str(tmp_path / "x"),
                           "--scale-down", "4")
    assert code == 0 and "--scale-down 4 is not applied" in " ".join(out.split())
    assert "GRID = (4, 4, 4)" in (tmp_path / "x" / "repro.py").read_text()


_NUMERICS = """
import importlib.util, json
import jax.numpy as jnp
spec = importlib.util.spec_from_file_location("repro", {repro!r})
repro = importlib.util.module_from_spec(spec); spec.loader.exec_module(repro)
a, b = repro.make_inputs()
(c,) = repro.build(repro.load_kernel(), interpret=True)(a, b)
ref = jnp.dot(a, b, preferred_element_type=jnp.float32)
err = float(jnp.max(jnp.abs(c.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
print(json.dumps({{"err": err, "shape": list(c.shape), "dtype": str(c.dtype)}}))
"""


def test_the_repros_call_computes_the_users_matmul(tmp_path, capsys):
    """The rebuilt call, run in interpret mode on the CPU, is A @ B: a wrong index map (A's block
    taken at (k, i) say) would still compile with the captured grid and blocks, but not agree."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "x"
    assert run_cli(capsys, "lab", "extract", str(CAPTURE), "--op", "shard_map.19", "-o", str(out))[0] == 0
    child = subprocess.run([sys.executable, "-c", _NUMERICS.format(repro=str(out / "repro.py"))], capture_output=True,
                           text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert got["shape"] == [2048, 2048] and got["dtype"] == "bfloat16"
    assert got["err"] < 1.6e-2  # bf16 output rounding (the lab's bf16 tolerance)
