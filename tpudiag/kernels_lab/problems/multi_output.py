"""The multi_output family's problem: a primary output (a matmul or an elementwise body) plus the
fusion's other outputs (no jax; copied into `repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import (  # repro: inlined
    BlockSizeError, itemsize, matmul_traffic, scale_dim, short_dtype)

KINDS = ("matmul", "elementwise")
ROLES = ("carried", "computed")


@dataclass(frozen=True)
class Problem:
    """Primary output [m, n] (`kind` matmul over k, or elementwise over n_inputs) plus `extras`,
    each `(rows, cols, dtype, role)`."""

    kind: str
    m: int
    n: int
    k: int = 1
    n_inputs: int = 1
    in_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    extras: tuple = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise BlockSizeError(f"kind must be one of {KINDS}, got {self.kind!r}")
        # spec.json round-trips tuples as lists; keep the problem hashable (it is a static jit argument)
        object.__setattr__(self, "extras", tuple(tuple(e) for e in self.extras))
        for e in self.extras:
            if len(e) != 4 or e[3] not in ROLES:
                raise BlockSizeError(f"each extra must be (rows, cols, dtype, role in {ROLES}), got {e!r}")

    @property
    def compute_dtype(self) -> str:
        return self.in_dtype

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n if self.kind == "matmul" else 2 * self.n_inputs * self.m * self.n

    def traffic(self, grid: tuple[int, int, int]) -> int:
        """Primary traffic (the matmul's re-reads per block of an (M, N, K) grid) plus each computed
        extra read and written once; carried extras move nothing on one chip."""
        if self.kind == "matmul":
            total = matmul_traffic(self.m, self.k, self.n, self.in_dtype, self.out_dtype, grid)
        else:
            total = self.m * self.n * (self.n_inputs * itemsize(self.in_dtype) + itemsize(self.out_dtype))
        return total + sum(2 * r * c * itemsize(d) for r, c, d, role in self.extras if role == "computed")

    @property
    def min_hbm_bytes(self) -> int:
        return self.traffic((1, 1, 1))

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(
            self, m=scale_dim(self.m, factor), n=scale_dim(self.n, factor),
            k=scale_dim(self.k, factor) if self.kind == "matmul" else 1,
            extras=tuple((scale_dim(r, factor), scale_dim(c, factor), d, role) for r, c, d, role in self.extras))

    def describe(self) -> str:
        """`bf16 512x1024 @ 1024x256 -> bf16 + 0 computed, 3 carried outputs`."""
        head = (f"{short_dtype(self.in_dtype)} {self.m}x{self.k} @ {self.k}x{self.n}" if self.kind == "matmul"
                else f"{self.n_inputs} x {short_dtype(self.in_dtype)}[{self.m},{self.n}]")
        carried = sum(1 for e in self.extras if e[3] == "carried")
        return (f"{head} -> {short_dtype(self.out_dtype)} + {len(self.extras) - carried} computed, {carried} carried "
                "outputs")
