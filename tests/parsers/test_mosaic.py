"""Pallas kernels read from their serialised Mosaic body (`parsers.mosaic`), on the committed example.

The expected grid, blocks and semantics are read from `examples/models/pallas_matmul.py`'s own text
(its constants and its `dimension_semantics=`), not written here, so a change to the example that the
reader missed fails. Reading a body needs jaxlib's MLIR bindings (the tpu extra), not libtpu.
"""

from __future__ import annotations

import ast
import base64
import json
import re
import sys

import pytest

from tests.conftest import REPO
from tpudiag.parsers import mosaic

MODELS = REPO / "examples" / "models"
SOURCE = MODELS / "pallas_matmul.py"
DUMP = MODELS / "dumps" / "pallas_matmul_v5e"
CAPTURE = MODELS / "captures" / "pallas_matmul_v5e"


def _example_constants() -> dict[str, int]:
    """`ROWS_PER_DEVICE = K = N = 2048`, `BM = BK = BN = 512` as the example assigns them."""
    out: dict[str, int] = {}
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            out.update((t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name))
    return out


def _example_semantics() -> tuple[str, ...]:
    found = re.search(r"dimension_semantics=\(([^)]*)\)", SOURCE.read_text())
    return tuple(s.strip().strip("\"'") for s in found.group(1).split(","))


def _dumped_call() -> tuple[str, int]:
    """The XLA dump's `shard_map.19` line: its backend_config text and operand count."""
    text = next(DUMP.glob("xla/*after_optimizations.txt")).read_text()
    line = next(ln for ln in text.splitlines() if 'custom_call_target="tpu_custom_call"' in ln)
    return line.split("backend_config=", 1)[1], line.split("custom-call(", 1)[1].split(")", 1)[0].count("%")


def test_body_survives_in_the_xla_dump_not_in_the_compiled_text():
    # The runtime's program (compiled.hlo.txt, module.pb) lost the body in the backend; the dump kept it.
    assert "custom_call_config" not in (DUMP / "compiled.hlo.txt").read_text()
    config, _ = _dumped_call()
    assert mosaic.body_of(config) is not None


def test_the_committed_dump_kernel_is_what_the_example_wrote():
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    c = _example_constants()
    config, n_operands = _dumped_call()
    kernel = mosaic.read_kernel(mosaic.body_of(config), n_operands)
    assert kernel.grid == (c["ROWS_PER_DEVICE"] // c["BM"], c["N"] // c["BN"], c["K"] // c["BK"]) == (4, 4, 4)
    assert kernel.dimension_semantics == _example_semantics() == ("parallel", "parallel", "arbitrary")
    assert [b.shape for b in kernel.of("input")] == [(c["BM"], c["BK"]), (c["BK"], c["BN"])]
    assert [b.shape for b in kernel.of("output")] == [(c["BM"], c["BN"])]
    assert [(b.shape, b.dtype, b.memory_space) for b in kernel.of("scratch")] == [((c["BM"], c["BN"]), "f32", "vmem")]
    assert all(b.windowed for b in kernel.blocks if b.role != "scratch")
    assert kernel.matmul_blocks == (c["BM"], c["BK"], c["BN"])
    assert kernel.name == "_kernel" and kernel.scalar_prefetch == 0
    # The body's source lines span `_kernel`'s body in the example.
    lines = SOURCE.read_text().splitlines()
    dot = next(i for i, ln in enumerate(lines, 1) if "jnp.dot(a_ref" in ln)
    assert kernel.source_file.endswith("pallas_matmul.py") and kernel.first_line <= dot <= kernel.last_line
    assert lines[kernel.first_line - 2].startswith("def _kernel(")  # the line above the body's first is its def


def test_the_modelled_capture_carries_the_kernel():
    """`simulate` embedded the body the compile output's XLA dump kept (the runtime's proto had none)."""
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    import tpudiag

    program = tpudiag.diagnose(CAPTURE).compiled.programs[0]
    assert program.kernels["shard_map.19"].grid == (4, 4, 4)
    inst = program.find("shard_map.19")
    # the compiled config's own facts are kept beside the body
    assert json.loads(inst.backend_config)["used_scoped_memory_configs"][0]["size"] == "4550656"


def test_a_truncated_body_is_a_named_problem_not_a_crash():
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    config, n = _dumped_call()
    body = mosaic.body_of(config)
    with pytest.raises(mosaic.KernelUnreadable, match="does not parse as MLIR"):
        mosaic.read_kernel(body[:40], n)


def test_without_jaxlib_the_kernels_are_left_out_with_one_warning(monkeypatch):
    from tpudiag.parsers.hlo_text import load_hlo_text

    monkeypatch.setitem(sys.modules, "jaxlib.mlir", None)  # `import jaxlib.mlir` now raises ImportError
    mosaic._context.cache_clear()
    try:
        program = load_hlo_text(next(DUMP.glob("xla/*after_optimizations.txt")))
    finally:
        mosaic._context.cache_clear()
    assert program.kernels == {}
    assert program.warnings.count(mosaic.MLIR_MISSING) == 1


def test_merged_config_keeps_the_compiled_facts_and_adds_the_body():
    compiled = json.dumps({"used_scoped_memory_configs": [{"size": "8"}]})
    before = json.dumps({"custom_call_config": {"body": base64.b64encode(b"x").decode()}, "used_scoped_memory_configs": []})
    merged = json.loads(mosaic.merged_config(compiled, before))
    assert merged["used_scoped_memory_configs"] == [{"size": "8"}] and merged["custom_call_config"]["body"] == "eA=="
    assert mosaic.merged_config(compiled, "{}") == compiled
    assert mosaic.merged_config(compiled, "not json") == compiled


def test_without_jaxlib_lab_ops_says_what_is_missing(monkeypatch):
    import tpudiag
    from tpudiag.kernels_lab.spec import survey

    monkeypatch.setitem(sys.modules, "jaxlib.mlir", None)
    mosaic._context.cache_clear()
    try:
        (row,) = survey(tpudiag.diagnose(CAPTURE))
    finally:
        mosaic._context.cache_clear()
    assert row.family == "" and "needs jaxlib's MLIR bindings" in row.reason
