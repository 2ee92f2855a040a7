"""The transpose family's problem: a 2-D transpose, as a copy into layout {0,1} is (no jax; copied
into `repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import OneDtype, itemsize, scale_dim, short_dtype  # repro: inlined


@dataclass(frozen=True)
class Problem(OneDtype):
    """x[rows, cols] -> out[cols, rows] = x.T (same dtype)."""

    rows: int
    cols: int
    dtype: str = "bfloat16"

    @property
    def flops(self) -> int:
        return 0

    @property
    def min_hbm_bytes(self) -> int:
        return 2 * self.rows * self.cols * itemsize(self.dtype)

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(self, rows=scale_dim(self.rows, factor), cols=scale_dim(self.cols, factor))

    def describe(self) -> str:
        """`bf16[8192,4096] -> [4096,8192]`."""
        return f"{short_dtype(self.dtype)}[{self.rows},{self.cols}] -> [{self.cols},{self.rows}]"
