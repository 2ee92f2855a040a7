"""`repro.py` for a captured Pallas kernel (`kernels_lab.pallas_repro`): what cannot be rebuilt
faithfully is said, not guessed, and names from the trace reach the code only escaped."""

from __future__ import annotations

import ast

from tpudiag.kernels_lab.pallas_repro import render_pallas
from tpudiag.kernels_lab.problems import pallas
from tpudiag.model.kernels import KernelBlock, MosaicKernel


def _kernel(**kw) -> MosaicKernel:
    blocks = kw.pop("blocks", (
        KernelBlock("input", 0, (256, 128), "f32", "vmem", True, ("g0", "0")),
        KernelBlock("output", 0, (256, 128), "f32", "vmem", True, ("g0", "0"))))
    return MosaicKernel(**{"name": "body", "grid": (4,), "dimension_semantics": ("parallel",), "blocks": blocks,
                           "source_file": "/src/k.py", "first_line": 3, "last_line": 9, **kw})


def _render(kernel, operands=("f32[1024,128]",), outputs=("f32[1024,128]",)):
    problem = pallas.Problem(kernel=kernel, operands=operands, outputs=outputs)
    return render_pallas(op_name="op'\"\n.1", header="# h", problem=problem, topology="v5e:1x1",
                         source_file=kernel.source_file)


def _literal(text: str, name: str):
    """The value assigned to `name` at the top level of `text`."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return ast.literal_eval(node.value)
    raise AssertionError(name)


def test_a_plain_kernel_is_rebuilt_with_its_index_maps_and_constants():
    made = _render(_kernel())
    assert made.unsupported == ()
    assert "pl.BlockSpec((256, 128), lambda g0: (g0, 0))" in made.text
    assert _literal(made.text, "OPERANDS") == [((1024, 128), "float32")]
    assert _literal(made.text, "OP_NAME") == "op'\"\n.1"  # the op name only as a literal


def test_a_computed_index_map_is_stated_not_guessed():
    blocks = (KernelBlock("input", 0, (256, 128), "f32", "vmem", True, None,
                          "its index map `transform_0` returns a block index computed by `muli`, not a grid index "
                          "or a constant"),
              KernelBlock("output", 0, (256, 128), "f32", "vmem", True, ("g0", "0")))
    made = _render(_kernel(blocks=blocks))
    (why,) = made.unsupported
    assert "input 0 (block 256x128)" in why and "computed by `muli`" in why
    assert _literal(made.text, "UNSUPPORTED") == (why,)
    assert "in_specs=[None]" in made.text  # nothing invented in its place; build() raises with the reason


def test_hostile_names_from_the_trace_never_become_code():
    path = "/x'); import os; os.system('boom'); ('.py"
    made = _render(_kernel(name="body; import os", source_file=path,
                           dimension_semantics=("parallel); os.system('x'",)))
    ast.parse(made.text)  # still valid Python
    assert "import os;" not in made.text.replace(repr(path), "")
    assert _literal(made.text, "SOURCE_FILE") == path and _literal(made.text, "KERNEL_NAME") == "_kernel"
    assert any("not a Python identifier" in p for p in made.unsupported)
    assert any("dimension semantics" in p for p in made.unsupported)


def test_scalar_prefetch_and_semaphores_are_stated():
    blocks = (KernelBlock("input", 0, (8, 128), "f32", "vmem", True, ("g0", "0")),
              KernelBlock("output", 0, (8, 128), "f32", "vmem", True, ("g0", "0")),
              KernelBlock("scratch", 0, (2,), "semaphore", "semaphore_mem", False))
    made = _render(_kernel(blocks=blocks, scalar_prefetch=1), operands=("s32[4]", "f32[32,128]"),
                   outputs=("f32[32,128]",))
    assert any("scalar-prefetch" in p for p in made.unsupported)
    assert any("semaphores are not reproduced" in p for p in made.unsupported)


def test_the_kernels_source_is_shown_where_this_checkout_has_it(tmp_path):
    from tpudiag.parsers.mosaic import local_source

    (tmp_path / "examples" / "models").mkdir(parents=True)
    (tmp_path / "examples" / "models" / "k.py").write_text("")
    # compiled in another checkout: the trailing path that names a file here, relative
    assert local_source("/elsewhere/repo/examples/models/k.py", tmp_path) == "examples/models/k.py"
    assert local_source(f"{tmp_path}/examples/models/k.py", tmp_path) == "examples/models/k.py"
    # nothing here: as recorded; a file name alone is not enough; no `..` escapes
    assert local_source("/elsewhere/other/z.py", tmp_path) == "/elsewhere/other/z.py"
    (tmp_path / "k.py").write_text("")
    assert local_source("/elsewhere/k.py", tmp_path) == "/elsewhere/k.py"
    assert local_source("/a/../examples/models/k.py", tmp_path) == "/a/../examples/models/k.py"
    assert local_source("rel/k.py", tmp_path) == "rel/k.py"
