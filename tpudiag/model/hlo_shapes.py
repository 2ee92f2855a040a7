"""Array shapes read from HLO instruction text (`%x = bf16[8,128]{1,0} dot(bf16[8,64]{1,0} %a, ...)`).

Dtype, dims and the layout's minor-to-major order; tiles and memory spaces are skipped, and the
operand list is found by matching parentheses (a tiled layout such as `{1,0:T(8,128)(2,1)}` holds
some). The rules, the custom-call cost model, the op math (`model.matmuls`) and the kernels lab
read shapes from a trace's HLO text this one way; `parsers.layout` reads full shapes with tiles.
Dynamic dims (`[<=8]`) read as their bound.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tpudiag.model.compiled import ArrayShape, memory_spaces_in
from tpudiag.model.units import element_bytes

_SHAPE = re.compile(r"\b(?P<dtype>pred|bf16|f8e\w+|[fsuc]\d+)\[(?P<dims>(?:<=)?\d+(?:,(?:<=)?\d+)*)?\]"
                    r"(?P<layout>\{[^{}]*\})?")
_OPCODE_CALL = re.compile(r"\b[a-z][\w\-]*\(")
_OPERAND_NAME = re.compile(r"\s*%(?P<name>[\w.\-]+)")

@dataclass(frozen=True)
class Shape:
    """One array: dtype and dims; two shapes are equal when these are. `minor_to_major` is the
    layout's order (None when none is printed) and `text` the array as written, layout included."""

    dtype: str
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...] | None = field(default=None, compare=False)
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"

    @property
    def row_major(self) -> bool:
        return self.minor_to_major is None or list(self.minor_to_major) == list(range(len(self.dims)))[::-1]

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def memory_space(self) -> int:
        """The layout's memory space `S(n)` (0, HBM, when none is printed)."""
        spaces = memory_spaces_in(self.text)
        return spaces[0] if spaces else 0


def _shape(m: re.Match) -> Shape:
    dims = tuple(int(d.replace("<=", "")) for d in m.group("dims").split(",")) if m.group("dims") else ()
    m2m = None
    if m.group("layout") is not None:
        order = m.group("layout")[1:-1].split(":")[0]
        m2m = tuple(int(d) for d in order.split(",") if d.strip().isdigit())
        if len(m2m) != len(dims):
            m2m = None
    return Shape(m.group("dtype"), dims, m2m, m.group(0))


def parse_shapes(text: str) -> list[Shape]:
    """Every array shape written in `text`, in order."""
    return [_shape(m) for m in _SHAPE.finditer(text or "")]


def parse_array(text: str) -> Shape | None:
    """The array `text` starts with (`bf16[8192,4096]{1,0:T(8,128)(2,1)}`); None for a tuple or other text."""
    text = text.strip()
    m = _SHAPE.match(text)
    return _shape(m) if m is not None and not text.startswith("(") else None


def _split(hlo_text: str) -> tuple[str, str] | None:
    """(result text, operand list text) of `%x = shape opcode(operands), ...`, or None."""
    if not hlo_text or "=" not in hlo_text:
        return None
    rhs = hlo_text.split("=", 1)[1]
    m = _OPCODE_CALL.search(rhs)
    if m is None:
        return None
    args = rhs[m.end():]
    depth, end = 1, len(args)
    for i, ch in enumerate(args):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    return rhs[:m.start()], args[:end]


def result_shapes(hlo_text: str) -> list[Shape]:
    """The instruction's result shapes (one, or a tuple's elements)."""
    parts = _split(hlo_text)
    return parse_shapes(parts[0]) if parts else []


def operand_shapes(hlo_text: str) -> list[Shape]:
    """Operand shapes from HLO text `%x = shape opcode(shape %a, shape %b), ...`."""
    parts = _split(hlo_text)
    return parse_shapes(parts[1]) if parts else []


def named_operands(hlo_text: str) -> list[tuple[Shape, str]]:
    """(shape, operand name) of each array operand written `shape %name` in `hlo_text`, in order."""
    parts = _split(hlo_text)
    if parts is None:
        return []
    args = parts[1]
    out = []
    for m in _SHAPE.finditer(args):
        name = _OPERAND_NAME.match(args, m.end())
        if name is not None:
            out.append((_shape(m), name.group("name")))
    return out


def dtype_bytes(dtype: str) -> float:
    """Bytes per element; a dtype the table does not know counts as 4 (f32-sized)."""
    size = element_bytes(dtype)
    return 4.0 if size is None else float(size)


def shape_bytes(s: Shape) -> float:
    return math.prod(s.dims) * dtype_bytes(s.dtype)


def padded_dims(array: ArrayShape) -> list[tuple[int, int, int]]:
    """(dim index, logical size, padded size) for each dim the layout's first tile pads.

    [] without a tiled layout, or with one that gives no dim order (nothing to name).
    """
    layout = array.layout
    if layout is None or not array.dims or not layout.tiles or len(layout.minor_to_major) != len(array.dims):
        return []
    dims = array.dims
    tile = layout.tiles[0]
    physical = list(reversed(layout.minor_to_major))  # major to minor
    out = []
    for t, dim_index in zip(reversed(tile), reversed(physical)):
        size = dims[dim_index]
        padded = -(-size // t) * t if t > 0 else size
        if padded != size:
            out.append((dim_index, size, padded))
    return sorted(out)


def fix_for(dims: list[tuple[int, int, int]]) -> str:
    """One line: pad dims that nearly fill their tile; re-layout dims that fill less than half of it."""
    pad = [(i, s, p) for i, s, p in dims if 2 * s >= p]
    small = [(i, s, p) for i, s, p in dims if 2 * s < p]
    parts = []
    if pad:
        parts.append("pad to tile multiples (" + ", ".join(f"dim {i}: {s} → {p}" for i, s, p in pad)
                     + ") and mask or slice the extra elements")
    if small:
        parts.append(", ".join(f"dim {i} ({s} of a {p}-wide tile)" for i, s, p in small)
                     + " is too small to pad: make a larger dim the minor one (transpose, or reshape to fold it "
                     "into a neighbour)")
    return "; ".join(parts) or "choose sizes that are multiples of the layout's tile and mask the extra elements"
