"""The collective family's problem: an all-gather, reduce-scatter or all-reduce over one ring of
devices (no jax; copied into `repro.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.kernels_lab.tiling import BlockSizeError, OneDtype, itemsize, scale_dim, short_dtype  # repro: inlined

KINDS = ("all-gather", "reduce-scatter", "all-reduce")


@dataclass(frozen=True)
class Problem(OneDtype):
    """`kind` over `devices` on one ring; each device's shard is `rows x cols` (all-gather's input,
    reduce-scatter's output, all-reduce's chunk). `group`: the devices' ids in the topology (one
    replica group of the captured op), used when compiling for it; default 0..devices-1. `mesh_axis`:
    the mesh axis the captured op ran on, when its HLO names one (informational)."""

    kind: str
    devices: int
    rows: int
    cols: int
    dtype: str = "float32"
    group: tuple = ()
    mesh_axis: str = ""

    def __post_init__(self):
        object.__setattr__(self, "group", tuple(self.group))  # a list from spec.json
        if self.kind not in KINDS:
            raise BlockSizeError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.devices < 2:
            raise BlockSizeError(f"a ring needs at least 2 devices, got {self.devices}")
        if self.group and len(self.group) != self.devices:
            raise BlockSizeError(f"group {self.group} must name {self.devices} devices")
        if self.rows < 1 or self.cols < 1:
            raise BlockSizeError(f"the shard must be non-empty, got {self.rows}x{self.cols}")

    @property
    def flops(self) -> int:
        return 0 if self.kind == "all-gather" else (self.devices - 1) * self.rows * self.cols

    @property
    def phases(self) -> int:
        return 2 if self.kind == "all-reduce" else 1

    @property
    def ici_bytes_per_device(self) -> int:
        """Bytes each device sends over ICI: (n-1) chunks per phase (two phases for all-reduce)."""
        return self.phases * (self.devices - 1) * self.rows * self.cols * itemsize(self.dtype)

    @property
    def local_shape(self) -> tuple[int, int]:
        """One device's input: its shard (all-gather), or all n chunks (reduce-scatter, all-reduce)."""
        return (self.rows if self.kind == "all-gather" else self.devices * self.rows, self.cols)

    @property
    def min_hbm_bytes(self) -> int:
        """Per device: the shard read and the result written once, plus what arrives over ICI."""
        rows, cols = self.local_shape
        out_rows = {"all-gather": self.devices * self.rows, "reduce-scatter": self.rows}.get(
            self.kind, self.devices * self.rows)
        return (rows + out_rows) * cols * itemsize(self.dtype) + self.ici_bytes_per_device

    def scaled(self, factor: int) -> Problem:
        return dataclasses.replace(self, rows=scale_dim(self.rows, factor), cols=scale_dim(self.cols, factor))

    def describe(self) -> str:
        """`all-gather bf16[1024,12288] per device, ring of 4 [0, 1, 2, 3]`."""
        group = list(self.group) or list(range(self.devices))
        axis = f" on mesh axis {self.mesh_axis!r}" if self.mesh_axis else ""
        return (f"{self.kind} {short_dtype(self.dtype)}[{self.rows},{self.cols}] per device, ring of "
                f"{self.devices} {group}{axis}")
