"""The matmul family's problem: `convert(activation(x @ w + bias))` (no jax; copied into `repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import BlockSizeError, matmul_traffic, scale_dim, short_dtype  # repro: inlined

ACTIVATIONS = ("none", "gelu", "relu", "silu")


@dataclass(frozen=True)
class Problem:
    """`out[m, n] = convert(activation(sum_k x[m, k] * w[k, n] + bias[n]))`."""

    m: int
    k: int
    n: int
    in_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    bias: bool = False
    activation: str = "none"

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise BlockSizeError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def compute_dtype(self) -> str:
        return self.in_dtype

    @property
    def min_hbm_bytes(self) -> int:
        """Each operand read once, the output written once: what an ideal kernel moves."""
        return matmul_traffic(self.m, self.k, self.n, self.in_dtype, self.out_dtype, (1, 1, 1), self.bias)

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(self, m=scale_dim(self.m, factor), k=scale_dim(self.k, factor),
                                   n=scale_dim(self.n, factor))

    def describe(self) -> str:
        """`bf16 8192x4096 @ 4096x50257 -> bf16 (+bias, gelu)`."""
        epilogue = [x for x in ("bias" if self.bias else "", "" if self.activation == "none" else self.activation)
                    if x]
        return (f"{short_dtype(self.in_dtype)} {self.m}x{self.k} @ {self.k}x{self.n} -> "
                f"{short_dtype(self.out_dtype)}" + (f" (+{', '.join(epilogue)})" if epilogue else ""))
