"""The datamove family's problem: copies, relayouts, dynamic slices and updates, concatenate, pad
(no jax; copied into `repro.py`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import BlockSizeError, OneDtype, itemsize, scale_dim, short_dtype  # repro: inlined

OPS = ("copy", "relayout", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad")


@dataclass(frozen=True)
class Problem(OneDtype):
    """`in_dims` -> `out_dims`; `perm` (relayout) is the output's major-to-minor dim order;
    `update_dims` (dynamic_update_slice) the update's shape; `parts` (concatenate) each input's size
    along `axis`; `pad_low` / `pad_high` (pad) the edge padding per dim."""

    op: str
    in_dims: tuple
    out_dims: tuple
    dtype: str = "bfloat16"
    perm: tuple = ()
    update_dims: tuple = ()
    parts: tuple = ()
    axis: int = 0
    pad_low: tuple = ()
    pad_high: tuple = ()

    def __post_init__(self):
        for name in ("in_dims", "out_dims", "perm", "update_dims", "parts", "pad_low", "pad_high"):
            object.__setattr__(self, name, tuple(getattr(self, name)))  # lists from spec.json
        if self.op not in OPS:
            raise BlockSizeError(f"op must be one of {OPS}, got {self.op!r}")
        if self.op in ("copy", "relayout") and math.prod(self.in_dims) != math.prod(self.out_dims):
            raise BlockSizeError(f"{self.op}: {self.in_dims} and {self.out_dims} hold different element counts")
        if self.op == "relayout" and sorted(self.perm) != list(range(len(self.out_dims))):
            raise BlockSizeError(f"relayout: perm must be a permutation of 0..{len(self.out_dims) - 1}, "
                                 f"got {self.perm}")
        if self.op == "dynamic_slice" and any(o > i for o, i in zip(self.out_dims, self.in_dims, strict=True)):
            raise BlockSizeError(f"dynamic_slice: window {self.out_dims} exceeds the operand {self.in_dims}")
        if self.op == "dynamic_update_slice" and any(
                u > o for u, o in zip(self.update_dims, self.out_dims, strict=True)):
            raise BlockSizeError(f"dynamic_update_slice: update {self.update_dims} exceeds {self.out_dims}")
        if self.op == "concatenate" and (not 0 <= self.axis < len(self.out_dims) or len(self.parts) < 1
                                         or min(self.parts) < 1 or sum(self.parts) != self.out_dims[self.axis]):
            raise BlockSizeError(f"concatenate: parts {self.parts} along axis {self.axis} must be positive and sum to "
                                 f"the output's dim, got output {self.out_dims}")
        if self.op == "pad":
            expect = tuple(i + lo + hi for i, lo, hi in zip(self.in_dims, self.pad_low, self.pad_high, strict=True))
            if min(self.pad_low + self.pad_high, default=0) < 0 or expect != self.out_dims:
                raise BlockSizeError(f"pad: {self.in_dims} padded by {self.pad_low}/{self.pad_high} (non-negative) "
                                     f"must give {self.out_dims}, got {expect}")

    @property
    def flops(self) -> int:
        return 0

    @property
    def min_hbm_bytes(self) -> int:
        """What the op must move: the window (slice), the update (update-slice) or the array (copies)
        read once and written once; a pad reads its input and writes the padded output."""
        if self.op == "pad":
            return (math.prod(self.in_dims) + math.prod(self.out_dims)) * itemsize(self.dtype)
        moved = {"dynamic_slice": self.out_dims, "dynamic_update_slice": self.update_dims}.get(self.op, self.out_dims)
        return 2 * math.prod(moved) * itemsize(self.dtype)

    def scaled(self, factor: int) -> Problem:
        """Every dim / `factor` (`scale_dim`), keeping the op's own constraints."""
        def sd(dims):
            return tuple(scale_dim(d, factor) for d in dims)

        if self.op in ("copy", "relayout") and self.in_dims != self.out_dims:
            return self  # a reshape cannot scale its two shapes independently: run the full problem
        if self.op == "pad":
            in_dims = sd(self.in_dims)
            out_dims = tuple(i + lo + hi for i, lo, hi in zip(in_dims, self.pad_low, self.pad_high, strict=True))
            return dataclasses.replace(self, in_dims=in_dims, out_dims=out_dims)
        if self.op == "concatenate":
            parts = sd(self.parts)
            out = list(sd(self.out_dims))
            out[self.axis] = sum(parts)
            return dataclasses.replace(self, parts=parts, out_dims=tuple(out), in_dims=tuple(out))
        in_dims, out_dims = sd(self.in_dims), sd(self.out_dims)
        update = tuple(min(u, o) for u, o in zip(sd(self.update_dims), out_dims, strict=True)) if self.update_dims \
            else self.update_dims
        if self.op == "dynamic_slice":
            out_dims = tuple(min(o, i) for o, i in zip(out_dims, in_dims, strict=True))
        return dataclasses.replace(self, in_dims=in_dims, out_dims=out_dims, update_dims=update)

    def describe(self) -> str:
        """`pad bf16[8, 100] -> [8, 128] low [0, 0] high [0, 28]`."""
        extra = {"relayout": f" perm {list(self.perm)}", "dynamic_update_slice": f" update {list(self.update_dims)}",
                 "concatenate": f" parts {list(self.parts)} on dim {self.axis}",
                 "pad": f" low {list(self.pad_low)} high {list(self.pad_high)}"}.get(self.op, "")
        return f"{self.op} {short_dtype(self.dtype)}{list(self.in_dims)} -> {list(self.out_dims)}{extra}"
