"""The elementwise family's problem: n same-shaped inputs -> one output (no jax; copied into
`repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import BlockSizeError, itemsize, scale_dim, short_dtype  # repro: inlined

ACTIVATIONS = ("none", "gelu", "relu", "silu")
MAX_INPUTS = 8


@dataclass(frozen=True)
class Problem:
    """n inputs of [rows, cols] -> one output of [rows, cols]."""

    rows: int
    cols: int
    n_inputs: int = 2
    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    activation: str = "none"

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise BlockSizeError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not 1 <= self.n_inputs <= MAX_INPUTS:
            raise BlockSizeError(f"n_inputs must be in 1..{MAX_INPUTS}, got {self.n_inputs}")

    @property
    def flops(self) -> int:
        return 2 * self.n_inputs * self.rows * self.cols

    @property
    def compute_dtype(self) -> str:
        return self.dtype

    @property
    def min_hbm_bytes(self) -> int:
        """Each input read once, the output written once (what this family's kernel moves, too)."""
        return self.rows * self.cols * (self.n_inputs * itemsize(self.dtype) + itemsize(self.out_dtype))

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(self, rows=scale_dim(self.rows, factor), cols=scale_dim(self.cols, factor))

    def describe(self) -> str:
        """`2 x f32[4096,4096] -> f32 (gelu)`."""
        act = "" if self.activation == "none" else f" ({self.activation})"
        return (f"{self.n_inputs} x {short_dtype(self.dtype)}[{self.rows},{self.cols}] -> "
                f"{short_dtype(self.out_dtype)}{act}")
