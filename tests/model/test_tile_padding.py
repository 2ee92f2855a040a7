"""`hlo_shapes.padded_dims` and `fix_for`: which dims a layout's first tile pads, and the one-line fix.

Reached before only through padding-waste's and device-memory's tests; mutmut left mutants of the
boundaries (a dim exactly half its tile, a tile that pads nothing) alive. Expectations by hand:
a dim of size s under a tile t is padded to ceil(s / t) * t.
"""

from __future__ import annotations

from tpudiag.model.compiled import ArrayShape, Layout
from tpudiag.model.hlo_shapes import fix_for, padded_dims

_RELAYOUT = " is too small to pad: make a larger dim the minor one (transpose, or reshape to fold it into a neighbour)"


def _array(dims: tuple[int, ...], tile: tuple[int, ...] | None) -> ArrayShape:
    layout = None if tile is None else Layout(minor_to_major=tuple(reversed(range(len(dims)))), tiles=(tile,))
    return ArrayShape("f32", dims, layout, logical_bytes=0, padded_bytes=0)


def test_a_tile_pads_each_dim_up_to_its_multiple():
    # f32[5,100] under T(8,128): dim 0 5 -> 8, dim 1 100 -> 128.
    assert padded_dims(_array((5, 100), (8, 128))) == [(0, 5, 8), (1, 100, 128)]


def test_no_layout_pads_nothing():
    assert padded_dims(_array((5, 100), None)) == []


def test_a_tile_of_zero_or_xlas_combined_dimension_pads_nothing():
    # A damaged `T(0,128)` reads as 0; a proto's `*` tile is XLA's kCombineDimension, -2^63.
    assert padded_dims(_array((5, 100), (0, 128))) == [(1, 100, 128)]
    assert padded_dims(_array((5, 100), (-(2 ** 63), 128))) == [(1, 100, 128)]


def test_a_dim_that_fills_half_its_tile_is_padded_and_less_is_relaid():
    # 64 of 128 is exactly half: padded. 50 of 128 (100 < 128 <= 150) is less than half: re-laid out.
    assert fix_for([(0, 64, 128), (1, 50, 128)]) == (
        "pad to tile multiples (dim 0: 64 → 128) and mask or slice the extra elements; "
        "dim 1 (50 of a 128-wide tile)" + _RELAYOUT)


def test_several_small_dims_are_listed_together():
    assert fix_for([(0, 3, 8), (1, 50, 128)]) == "dim 0 (3 of a 8-wide tile), dim 1 (50 of a 128-wide tile)" + _RELAYOUT


def test_no_padded_dim_gives_the_general_advice():
    assert fix_for([]) == "choose sizes that are multiples of the layout's tile and mask the extra elements"
