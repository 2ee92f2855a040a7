"""TPU shape text with layouts -> `ArrayShape`/`TupleShape`, and the bytes each occupies.

Grammar handled (as XLA prints shapes): `dtype[d0,d1,...]{minor_to_major:attrs}` where attrs are
`T(a,b)(c,d)...` (tiles: the first pads, later ones pack sub-32-bit rows inside it),
`E(bits)` (sub-byte element size), `S(n)` (memory space); other attributes (`L(...)`, `P(...)`,
`SC(...)`, `#(...)`, `*`) are skipped. Tuples `(s0, s1, /*index=5*/s5)`; scalars `f32[]{:T(256)}`;
dynamic dims `<=8` count at their bound.

Padded bytes, as measured against the compiler's own argument sizes
(`shared/reference/tpu-compiler-dumps.md` §9): order the dims major-to-minor by the layout,
round the last len(T) of them up to the first tile (a shape with fewer dims than the tile gets
leading 1s, so scalars occupy one whole tile), multiply, then times the element size. Later
tiles such as `(2,1)` and `(4,1)` only pack rows within the first tile: no extra bytes.
"""

from __future__ import annotations

import math
import re

from tpudiag.model.compiled import ArrayShape, Layout, Shape, TupleShape

# Bits per element, by HLO spelling. pred is stored in a byte; s4/u4 pack two per byte.
DTYPE_BITS = {
    "pred": 8,
    "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4,
    "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "f4e2m1fn": 4,
    "f8e5m2": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8,
    "f8e3m4": 8, "f8e8m0fnu": 8,
    "c64": 64, "c128": 128,
    "token": 0, "opaque": 0,
}


# No device holds an array of 2^56 bytes (64 PiB); a bigger one is a damaged shape, and its byte
# counts would not fit the int64 columns downstream.
MAX_ARRAY_BYTES = 1 << 56


class ShapeSyntaxError(ValueError):
    """Shape text this parser does not understand; callers turn it into a warning or InputError."""


def parse_shape(text: str) -> Shape:
    """Parse one shape, e.g. `bf16[512,4096]{1,0:T(8,128)(2,1)}`; raise ShapeSyntaxError."""
    scanner = _Scanner(text)
    shape = scanner.shape()
    scanner.skip_space()
    if not scanner.at_end():
        raise ShapeSyntaxError(f"unexpected {text[scanner.pos:scanner.pos + 20]!r} after shape {text!r}")
    return shape


def array_shape(dtype: str, dims: tuple[int, ...], layout: Layout | None) -> ArrayShape:
    """An ArrayShape with its logical and padded bytes computed."""
    if dtype not in DTYPE_BITS:
        raise ShapeSyntaxError(f"unknown element type {dtype!r}")
    padded = padded_bytes(dtype, dims, layout)
    if padded > MAX_ARRAY_BYTES:
        # no float of the size: one past float range cannot be formatted as one
        raise ShapeSyntaxError(f"implausible array size (over 64 PiB) for {dtype}{list(dims)}"[:200])
    return ArrayShape(dtype=dtype, dims=dims, layout=layout,
                      logical_bytes=logical_bytes(dtype, dims), padded_bytes=padded)


def check_dim_order(dtype: str, dims: tuple[int, ...], layout: Layout | None) -> None:
    """ShapeSyntaxError unless the layout's `minor_to_major` is empty or a permutation of the dims.

    Checked where the padded bytes are computed, so for every shape, from HLO text or an HloProto
    alike: `{5,0}` on a rank-2 shape would index past the dims, and `{0,0}` or `{-1,0}` would
    silently count one dim twice (or the last one in place of the first) in the padded bytes.
    """
    if layout is None or not layout.minor_to_major:
        return
    if sorted(layout.minor_to_major) != list(range(len(dims))):
        order = ",".join(str(d) for d in layout.minor_to_major)[:80]
        shape = f"{dtype}[{','.join(str(d) for d in dims)}]"
        raise ShapeSyntaxError(f"layout {{{order}}} is not a permutation of the {len(dims)} dims of {shape}"[:200])


def logical_bytes(dtype: str, dims: tuple[int, ...]) -> int:
    return _bytes(math.prod(dims), DTYPE_BITS[dtype])


def padded_bytes(dtype: str, dims: tuple[int, ...], layout: Layout | None) -> int:
    """Bytes of the array as tiled: see the module docstring for the rule and its evidence."""
    check_dim_order(dtype, dims, layout)
    if layout is None:
        return logical_bytes(dtype, dims)
    physical = physical_dims(dims, layout)
    bits = layout.element_size_bits or DTYPE_BITS[dtype]
    if layout.tiles:
        tile = layout.tiles[0]
        if len(physical) < len(tile):
            physical = (1,) * (len(tile) - len(physical)) + physical
        head = physical[: len(physical) - len(tile)]
        tail = physical[len(physical) - len(tile):]
        physical = head + tuple(_round_up(d, t) for d, t in zip(tail, tile))
    return _bytes(math.prod(physical), bits)


def physical_dims(dims: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    """Dims in memory order, most major first (the reverse of minor_to_major)."""
    if not layout.minor_to_major:
        return dims  # no dim order: the written order is the memory order (a bad one is refused above)
    return tuple(dims[i] for i in reversed(layout.minor_to_major))


def shape_text(shape: Shape) -> str:
    """Render a shape the way XLA prints it (used for shapes that come from protos)."""
    if isinstance(shape, TupleShape):
        return "(" + ", ".join(shape_text(e) for e in shape.elements) + ")"
    text = f"{shape.dtype}[{','.join(str(d) for d in shape.dims)}]"
    lay = shape.layout
    if lay is None or lay == Layout(minor_to_major=()):
        return text  # XLA prints no braces for an empty (scalar, default) layout
    attrs = "".join("(" + ",".join(str(d) for d in t) + ")" for t in lay.tiles)
    if attrs:
        attrs = "T" + attrs
    if lay.element_size_bits:
        attrs += f"E({lay.element_size_bits})"
    if lay.memory_space:
        attrs += f"S({lay.memory_space})"
    order = ",".join(str(d) for d in lay.minor_to_major)
    return f"{text}{{{order}:{attrs}}}" if attrs else f"{text}{{{order}}}"


def _round_up(value: int, multiple: int) -> int:
    if multiple <= 1:
        return value
    return -(-value // multiple) * multiple


def _bytes(elements: int, bits: int) -> int:
    return -(-elements * bits // 8)


def _size(text: str, default: int) -> int:
    """A non-negative ASCII integer, else `default` (`*` tiles, damage)."""
    text = text.strip()
    # past 19 digits no size is real (and past 4,300, int() refuses the text)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else default


_DTYPE = re.compile(r"[a-z][a-z0-9]*")
_INT = re.compile(r"-?\d+")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)


# XLA nests tuples a few levels (a while loop's state holding a tuple); far deeper nesting is a
# damaged or hostile file, and would otherwise exhaust Python's recursion limit.
MAX_TUPLE_DEPTH = 64


class _Scanner:
    """A small recursive-descent reader over shape text (tuples nest, so no single regex)."""

    def __init__(self, text: str, pos: int = 0):
        self.text = text
        self.pos = pos

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self) -> None:
        while True:
            while self.pos < len(self.text) and self.text[self.pos].isspace():
                self.pos += 1
            m = _COMMENT.match(self.text, self.pos)  # `/*index=5*/` markers inside tuples
            if not m:
                return
            self.pos = m.end()

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            got = self.text[self.pos:self.pos + 20] or "end of text"
            raise ShapeSyntaxError(f"expected {ch!r} at {got!r} in shape {self.text[:200]!r}")
        self.pos += 1

    def shape(self, depth: int = 0) -> Shape:
        self.skip_space()
        if self.peek() == "(":
            if depth >= MAX_TUPLE_DEPTH:
                raise ShapeSyntaxError(f"tuple shapes nested over {MAX_TUPLE_DEPTH} deep in shape {self.text[:200]!r}")
            self.pos += 1
            elements: list[Shape] = []
            self.skip_space()
            if self.peek() == ")":
                self.pos += 1
                return TupleShape(())
            while True:
                elements.append(self.shape(depth + 1))
                self.skip_space()
                if self.peek() == ",":
                    self.pos += 1
                    continue
                self.expect(")")
                return TupleShape(tuple(elements))
        m = _DTYPE.match(self.text, self.pos)
        if not m:
            raise ShapeSyntaxError(f"no element type at {self.text[self.pos:self.pos + 20]!r}")
        dtype = m.group(0)
        self.pos = m.end()
        if dtype in ("token", "opaque") and self.peek() != "[":
            return array_shape(dtype, (), None)
        dims = self.dims()
        layout = self.layout(len(dims)) if self.peek() == "{" else None
        return array_shape(dtype, dims, layout)

    def dims(self) -> tuple[int, ...]:
        self.expect("[")
        end = self.text.find("]", self.pos)
        if end < 0:
            raise ShapeSyntaxError(f"unclosed '[' in shape {self.text[:200]!r}")
        body = self.text[self.pos:end].strip()
        self.pos = end + 1
        if not body:
            return ()
        dims = []
        for part in body.split(","):
            part = part.strip().removeprefix("<=")  # dynamic dim: its bound
            if not (part.isascii() and part.isdigit()) or len(part) > 19:  # isdigit alone accepts `²`
                raise ShapeSyntaxError(f"dimension {part[:40]!r} is not a size in shape {self.text[:200]!r}")
            dims.append(int(part))
        return tuple(dims)

    def layout(self, rank: int) -> Layout:
        self.expect("{")
        end = self._matching_brace()
        body = self.text[self.pos:end]
        self.pos = end + 1
        order_text, _, attrs = body.partition(":")
        numbers = _INT.findall(order_text)
        if any(len(x) > 20 for x in numbers):
            raise ShapeSyntaxError(f"a layout dimension past int64 in shape {self.text[:200]!r}")
        order = tuple(int(x) for x in numbers)  # checked against the dims by array_shape
        tiles: list[tuple[int, ...]] = []
        bits = 0
        space = 0
        i = 0
        last_letter = ""
        while i < len(attrs):
            ch = attrs[i]
            if ch == "(":
                close = attrs.find(")", i)
                if close < 0:
                    raise ShapeSyntaxError(f"unclosed '(' in layout {{{body}}}")
                inner = attrs[i + 1:close]
                if last_letter == "T":
                    tiles.append(tuple(-_size(x.strip()[1:], -1) if x.strip().startswith("-") else _size(x, 1)
                                       for x in inner.split(",")))
                elif last_letter == "E":
                    bits = _size(inner, 0)
                elif last_letter == "S":
                    space = _size(inner, 0)
                i = close + 1
                continue
            if ch.isalpha() or ch == "#":
                j = i
                while j < len(attrs) and (attrs[j].isalpha() or attrs[j] == "#"):
                    j += 1
                last_letter = attrs[i:j]
                i = j
                continue
            i += 1  # '*' and anything else this parser does not model
        return Layout(minor_to_major=order, tiles=tuple(tiles), element_size_bits=bits, memory_space=space)

    def _matching_brace(self) -> int:
        depth = 1
        i = self.pos
        while i < len(self.text):
            if self.text[i] == "{":
                depth += 1
            elif self.text[i] == "}":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        raise ShapeSyntaxError(f"unclosed '{{' in shape {self.text[:200]!r}")
