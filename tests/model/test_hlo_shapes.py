"""Array shapes read from HLO text (`tpudiag.model.hlo_shapes`), against shapes written out by hand."""

from __future__ import annotations

import pytest

from tpudiag.model.hlo_shapes import Shape, dtype_bytes, operand_shapes, parse_shapes, shape_bytes


@pytest.mark.parametrize(("text", "dtype", "dims", "minor_to_major"), [
    ("bf16[8,128]{1,0:T(8,128)(2,1)}", "bf16", (8, 128), (1, 0)),  # the order before the tiles
    ("f32[<=8,4]{0,1}", "f32", (8, 4), (0, 1)),                    # a dynamic dim reads as its bound
    ("f32[8,4]", "f32", (8, 4), None),                             # no layout printed
    ("f32[8,4]{0}", "f32", (8, 4), None),                          # an order that does not fit the rank
    ("pred[]", "pred", (), None),                                  # a scalar
    ("s32[2]{0:S(4)}", "s32", (2,), (0,)),
])
def test_each_shape_as_written(text, dtype, dims, minor_to_major):
    (s,) = parse_shapes(f"%x = {text} copy(...)")
    assert (s.dtype, s.dims, s.minor_to_major, s.text) == (dtype, dims, minor_to_major, text)


def test_the_layout_decides_row_major_and_the_memory_space():
    a, b, c = parse_shapes("(f32[8,4]{1,0}, f32[8,4]{0,1}, s32[2]{0:S(4)})")
    assert (a.row_major, b.row_major, a.memory_space, c.memory_space) == (True, False, 0, 4)


def test_element_sizes_and_bytes():
    # s4 packs two elements per byte; f8 variants are one byte; an unknown dtype counts as f32.
    assert [dtype_bytes(d) for d in ("bf16", "s4", "f8e4m3fn", "f8e5m2", "token")] == [2.0, 0.5, 1.0, 1.0, 4.0]
    assert shape_bytes(Shape("bf16", (8, 128))) == 2048
    assert shape_bytes(Shape("f8e4m3fn", (1024,))) == 1024


def test_operand_shapes_need_an_instruction():
    assert operand_shapes("%d = f32[8,16]{1,0} dot(bf16[8,4]{1,0} %a, bf16[4,16]{1,0} %b)") == [
        Shape("bf16", (8, 4)), Shape("bf16", (4, 16))]
    assert operand_shapes("f32[8]{0}") == [] and operand_shapes("") == []
    assert parse_shapes(None) == []
