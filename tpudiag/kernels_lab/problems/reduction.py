"""The reduction family's problem: softmax, layer / RMS norm, row and column sums (no jax; copied
into `repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import BlockSizeError, itemsize, scale_dim, short_dtype  # repro: inlined

OPS = ("softmax", "layernorm", "rmsnorm", "sum", "colsum")


@dataclass(frozen=True)
class Problem:
    """`out = op(x)` row by row on x[rows, cols]; `sum` keeps the reduced dim: out[rows, 1];
    `colsum` sums x[outer, rows, cols] over rows: out[outer, cols]."""

    rows: int
    cols: int
    op: str = "softmax"
    dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    outer: int = 1

    def __post_init__(self):
        if self.op not in OPS:
            raise BlockSizeError(f"reduction op must be one of {OPS}, got {self.op!r}")
        if self.outer != 1 and self.op != "colsum":
            raise BlockSizeError(f"outer applies to colsum only, got outer={self.outer} for {self.op}")

    @property
    def out_cols(self) -> int:
        return 1 if self.op == "sum" else self.cols

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.outer, self.rows, self.cols) if self.op == "colsum" else (self.rows, self.cols)

    @property
    def n_params(self) -> int:
        """Per-column parameter vectors: gamma (and beta for layernorm)."""
        return {"layernorm": 2, "rmsnorm": 1}.get(self.op, 0)

    @property
    def flops(self) -> int:
        return {"softmax": 5, "layernorm": 8, "rmsnorm": 5, "sum": 1, "colsum": 1}[self.op] * self.rows * self.cols \
            * self.outer

    @property
    def compute_dtype(self) -> str:
        return self.dtype

    @property
    def min_hbm_bytes(self) -> int:
        """Each row is read and written once; parameter rows are fetched once (constant block index).
        What this family's kernel moves, too."""
        if self.op == "colsum":
            return self.outer * (self.rows * self.cols * itemsize(self.dtype) + self.cols * itemsize(self.out_dtype))
        return (self.rows * (self.cols * itemsize(self.dtype) + self.out_cols * itemsize(self.out_dtype))
                + self.n_params * self.cols * itemsize(self.dtype))

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(self, rows=scale_dim(self.rows, factor), cols=scale_dim(self.cols, factor),
                                   outer=scale_dim(self.outer, factor) if self.op == "colsum" else self.outer)

    def describe(self) -> str:
        """`softmax bf16[8192,4096] -> bf16`, `colsum f32[1,512,256] over dim 1 -> f32[1,256]`."""
        dt, out = short_dtype(self.dtype), short_dtype(self.out_dtype)
        if self.op == "colsum":
            return f"colsum {dt}[{self.outer},{self.rows},{self.cols}] over dim 1 -> {out}[{self.outer},{self.cols}]"
        return f"{self.op} {dt}[{self.rows},{self.cols}] -> {out}"
