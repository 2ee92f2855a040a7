"""TPU shapes with layouts: parsing, logical bytes and padded bytes.

The byte numbers come from `shared/reference/tpu-compiler-dumps.md` §9 (measured against the
compiler's own argument sizes) and from the real dumps under `tests/fixtures/dumps/`; the
`libtpu` test recompiles the odd-shape table live on several generations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpudiag.model.compiled import ArrayShape, TupleShape, leaf_arrays
from tpudiag.parsers.hlo_text import load_hlo_dump, parse_buffer_assignment, parse_hlo_text
from tpudiag.parsers.layout import DTYPE_BITS, ShapeSyntaxError, parse_shape, physical_dims, shape_text

DUMPS = Path(__file__).resolve().parents[1] / "fixtures" / "dumps"

# Every row of the §9 table: (shape with layout, logical bytes, padded bytes, factor as printed).
SECTION_9 = [
    ("f32[3,1000]{1,0:T(4,128)}", 12_000, 16_384, 1.37),
    ("bf16[7,300]{1,0:T(8,128)(2,1)}", 4_200, 6_144, 1.46),
    ("s8[5,129]{1,0:T(8,128)(4,1)}", 645, 2_048, 3.18),
    ("pred[9,129]{1,0:T(8,128)(4,1)}", 1_161, 4_096, 3.53),
    ("f32[2,3,1000]{2,0,1:T(2,128)}", 24_000, 24_576, 1.02),  # permuted to cut padding
    ("bf16[3,5,7]{2,0,1:T(4,128)(2,1)}", 210, 5_120, 24.4),
    ("f32[1,1]{1,0:T(1,128)}", 4, 512, 128),
    ("f32[1000]{0:T(1024)}", 4_000, 4_096, 1.02),
    ("bf16[1000]{0:T(1024)(128)(2,1)}", 2_000, 2_048, 1.02),
    ("f32[17,128]{1,0:T(8,128)}", 8_704, 12_288, 1.41),  # rows 17 -> 24
    ("bf16[17,128]{1,0:T(8,128)(2,1)}", 4_352, 6_144, 1.41),  # packed rows still pad to 8, not 16
    ("s8[17,128]{1,0:T(8,128)(4,1)}", 2_176, 3_072, 1.41),  # ... nor 32
    ("f8e4m3fn[40,200]{1,0:T(8,128)(4,1)}", 8_000, 10_240, 1.28),
    ("f32[128,1]{0,1:T(1,128)}", 512, 512, 1.0),  # transposed: no padding
    ("bf16[1024,8]{0,1:T(8,128)(2,1)}", 16_384, 16_384, 1.0),
]


@pytest.mark.parametrize(("text", "logical", "padded", "factor"), SECTION_9, ids=[r[0] for r in SECTION_9])
def test_section_9_padding_table(text, logical, padded, factor):
    shape = parse_shape(text)
    assert (shape.logical_bytes, shape.padded_bytes) == (logical, padded)
    digits = 1 if factor >= 10 else 2
    assert round(padded / logical, digits) == factor


@pytest.mark.parametrize(("text", "padded"), [
    ("f32[]{:T(128)}", 512),  # a scalar occupies one whole tile (v5e parameter, buffer assignment)
    ("bf16[]{:T(256)}", 512),
    ("s4[33,65]{1,0:T(8,128)(8,1)E(4)}", 2_560),  # E(4): two elements per byte
    ("c64[5,7]{1,0:T(8,128)}", 8_192),
    ("u8[6,1,130]{2,0,1:T(8,128)(4,1)}", 2_048),  # physical [1,6,130] -> [1,8,256]
    ("f16[4,2,3,129]{3,1,2,0:T(2,128)(2,1)}", 12_288),  # physical [4,3,2,129] -> [4,3,2,256]
    ("s32[5,3]{0,1:T(4,128)}", 2_048),
    ("u32[]{:S(2)}", 4),  # a sync flag in SMEM: no tile, no padding
])
def test_padding_of_real_parameter_and_buffer_layouts(text, padded):
    """Sizes the v5e compiler gave these layouts in its buffer assignment (fixture v5e_odd_params)."""
    assert parse_shape(text).padded_bytes == padded


@pytest.mark.parametrize(("dtype", "nbytes"), [
    ("pred", 10), ("s8", 10), ("u8", 10), ("s4", 5), ("u4", 5), ("s16", 20), ("u16", 20),
    ("f16", 20), ("bf16", 20), ("s32", 40), ("u32", 40), ("f32", 40), ("s64", 80), ("u64", 80),
    ("f64", 80), ("c64", 80), ("c128", 160), ("f8e4m3fn", 10), ("f8e5m2", 10), ("f4e2m1fn", 5),
])
def test_itemsize_per_dtype(dtype, nbytes):
    shape = parse_shape(f"{dtype}[10]")
    assert shape.logical_bytes == shape.padded_bytes == nbytes  # no layout: no padding


def test_every_known_dtype_parses():
    for dtype, bits in DTYPE_BITS.items():
        assert parse_shape(f"{dtype}[16]").logical_bytes == 16 * bits // 8, dtype


def test_sub_byte_sizes_round_up_to_whole_bytes():
    assert parse_shape("s4[3]").logical_bytes == 2


@pytest.mark.parametrize(("text", "space"), [
    ("bf16[512,4096]{1,0:T(8,128)(2,1)S(1)}", 1),  # VMEM
    ("u32[]{:S(2)}", 2),  # sync flag
    ("s32[2]{0:S(4)}", 4),
    ("f32[8]{0:T(256)S(5)}", 5),
    ("bf16[]{:T(256)S(7)}", 7),  # TPU7x SparseCore scalars
    ("f32[8,128]{1,0:T(8,128)}", 0),
])
def test_memory_space(text, space):
    shape = parse_shape(text)
    assert isinstance(shape, ArrayShape) and shape.memory_space == space


def test_layout_fields():
    shape = parse_shape("s4[33,65]{1,0:T(8,128)(8,1)E(4)S(1)}")
    assert shape.layout.minor_to_major == (1, 0)
    assert shape.layout.tiles == ((8, 128), (8, 1))
    assert shape.layout.element_size_bits == 4
    assert shape.layout.memory_space == 1
    assert physical_dims(shape.dims, shape.layout) == (33, 65)
    assert physical_dims((2, 3, 1000), parse_shape("f32[2,3,1000]{2,0,1:T(2,128)}").layout) == (3, 2, 1000)


def test_tuple_with_index_comments_sums_its_arrays():
    text = ("(bf16[1024,512]{1,0:T(8,128)(2,1)S(1)}, s32[2]{0:S(4)}, u32[]{:S(2)}, u32[]{:S(2)}, "
            "u32[]{:S(2)}, /*index=5*/u32[]{:S(2)})")
    shape = parse_shape(text)
    assert isinstance(shape, TupleShape) and len(shape.elements) == 6
    assert shape.padded_bytes == 1024 * 512 * 2 + 8 + 4 * 4
    assert [a.dtype for a in leaf_arrays(shape)] == ["bf16", "s32", "u32", "u32", "u32", "u32"]


def test_nested_tuple_and_token():
    shape = parse_shape("((bf16[256,1024]{1,0:T(8,128)(2,1)}, token[]), bf16[64,1024]{1,0:T(8,128)(2,1)})")
    assert shape.logical_bytes == (256 + 64) * 1024 * 2
    assert parse_shape("token[]").padded_bytes == 0


def test_dynamic_dims_count_at_their_bound():
    assert parse_shape("f32[<=8,3]").logical_bytes == 96


@pytest.mark.parametrize("text", [
    "", "f32", "f32[3", "f32[a,b]", "q7[3]", "f32[3]{1,0}", "f32[3]{0:T(8", "(f32[3], ", "f32[3] junk",
])
def test_malformed_shapes_raise_shape_syntax_error(text):
    with pytest.raises(ShapeSyntaxError):
        parse_shape(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="fbsupredc0123456789[]{}(),:TESL*<=/ ", max_size=40))
def test_random_shape_text_raises_only_shape_syntax_error(text):
    try:
        shape = parse_shape(text)
    except ShapeSyntaxError:
        return
    assert shape.padded_bytes >= 0 and shape.logical_bytes >= 0


def _fixture_shapes() -> list[str]:
    texts = []
    for program in (load_hlo_dump(DUMPS / name).programs[0] for name in ("v5e_mlp_train", "tpu7x_mlp_train")):
        texts.extend(sorted({i.shape_text for i in program.instructions.values()}))
    return texts


def test_shape_text_round_trips_on_every_real_shape():
    for text in _fixture_shapes():
        shape = parse_shape(text)
        assert parse_shape(shape_text(shape)) == shape, text


def test_padded_is_never_below_logical_on_real_arrays():
    for text in _fixture_shapes():
        for array in leaf_arrays(parse_shape(text)):
            assert array.padded_bytes >= array.logical_bytes, text


# --- against the compiler's own numbers ------------------------------------------------------

def _check_against_compiler(facts: dict, hlo_text: str, buffer_text: str | None, where: str) -> None:
    """Parsed parameter layouts and padded bytes agree with what the compiler reports."""
    program = parse_hlo_text(hlo_text, where)
    params = program.entry_parameters()
    assert len(params) == len(facts["input_formats"]) == len(facts["input_shapes"])
    for param, fmt, (dims, _) in zip(params, facts["input_formats"], facts["input_shapes"], strict=True):
        layout = param.shape.layout
        assert list(param.shape.dims) == dims
        assert list(reversed(layout.minor_to_major)) == fmt["major_to_minor"], param.shape_text
        assert [list(t) for t in layout.tiles] == fmt["tiling"], param.shape_text
        assert layout.element_size_bits == fmt["sub_byte_element_size_in_bits"], param.shape_text
    assert sum(p.padded_bytes for p in params) == facts["memory_analysis"]["argument_size_in_bytes"]
    if buffer_text is not None:  # and one by one, against the buffer assignment
        allocations = parse_buffer_assignment(buffer_text)
        sizes = {a.parameter_number: a.size_bytes for a in allocations if a.parameter_number is not None}
        for param in params:
            assert param.padded_bytes == sizes[param.parameter_number], (where, param.shape_text)


def test_odd_parameters_match_the_fixture_compilers_sizes():
    directory = DUMPS / "v5e_odd_params"
    facts = json.loads((directory / "facts.json").read_text())
    hlo = next(directory.glob("*.after_optimizations.txt")).read_text()
    buffers = next(directory.glob("*.after_optimizations-buffer-assignment.txt")).read_text()
    _check_against_compiler(facts, hlo, buffers, str(directory))


LIVE_TOPOLOGIES = ("v5e:2x2", "v6e:2x2", "TPU7x:2x2x1")


@pytest.mark.libtpu
@pytest.mark.parametrize("topology", LIVE_TOPOLOGIES)
def test_padded_bytes_match_the_compiler_live(topology):
    """Compile the odd-shape table for `topology` now and compare every parameter's bytes.

    Needs jax with libtpu (the `tpu` extra, which CI installs): without it this fails rather than
    skips, so a CI that lost libtpu cannot pass silently.
    """
    try:
        import jax  # noqa: F401
        import libtpu  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"this test needs jax with libtpu (pip install -e '.[tpu]'): {exc}")
    script = DUMPS / "make_fixtures.py"
    proc = subprocess.run([sys.executable, str(script), "--probe-padding", topology],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"probe for {topology} failed:\n{proc.stderr[-3000:]}"
    facts = json.loads(proc.stdout)
    assert facts["hlo_text"], f"no after_optimizations dump for {topology}"
    _check_against_compiler(facts, facts["hlo_text"], facts["buffer_assignment"] or None, topology)
