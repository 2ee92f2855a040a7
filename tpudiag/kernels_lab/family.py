"""What a kernel family module provides, as a Protocol, and the one way to import a family.

Each family is a module (`tpudiag.kernels_lab.matmul`, `reduction`, `elementwise`, `transpose`,
`multi_output`, `datamove`, `collective`) that satisfies `KernelFamily`: its typed `Problem` (from
`kernels_lab.problems`, jax-free, which the spec inference builds from an op's math), its
`BlockSizes`, the plain-JAX reference, the Pallas kernel, its inputs, its HBM traffic per blocking,
its default blocks and the sweep space. The harness, `repro.py`, `lab tune` and the compile worker
use a family only through these names. Family modules import jax: import them with
`family_module` when a kernel is needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tpudiag.errors import InputError, UsageError
from tpudiag.kernels_lab.problems import KERNEL_FAMILIES


@runtime_checkable
class KernelFamily(Protocol):
    """A kernel family module. `p` is its `Problem`, `blocks` its `BlockSizes`."""

    FAMILY: str  # the family's name, as `spec.json` writes it
    Problem: type  # the family's problem (`kernels_lab.problems.<family>.Problem`)
    BlockSizes: type  # frozen, validates itself against a Problem and a VMEM budget
    SCALES_BLOCKS: bool  # whether `--scale-down` shrinks the blocks too (not a collective's direction)
    DEFAULT_INTERPRET: dict | None  # TPU-interpreter parameters when plain interpret mode cannot run it
    # Modelled ICI seconds of a blocking, (p, blocks, link_bytes_per_s) -> float; None: no ICI traffic
    ici_seconds: Callable[[Any, Any, float], float] | None

    def reference(self, p: Any, *args: Any) -> Any:
        """The op in plain JAX (what XLA compiles): the numerics the kernel is checked against."""

    def pallas(self, *args: Any, p: Any, blocks: Any, interpret: Any = False) -> Any:
        """The Pallas TPU kernel on the same inputs."""

    def input_structs(self, p: Any) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of each input, for compiling without data."""

    def make_inputs(self, p: Any, seed: int = 0) -> list:
        """Random inputs of `input_structs`' shapes."""

    def fit(self, p: Any, *knobs: Any) -> Any:
        """The nearest legal BlockSizes to `knobs` (the BlockSizes fields, in order) for `p`."""

    def hbm_bytes(self, p: Any, blocks: Any) -> int:
        """Bytes a blocking moves between HBM and VMEM (the sweep's memory floor)."""

    def default_blocks(self, p: Any, generation: str | None) -> Any:
        """The tuned table's blocks for the generation, or the family's safe default."""

    def candidates(self, p: Any) -> list:
        """The block sizes `lab tune` sweeps."""


def family_module(name: str) -> KernelFamily:
    """The family's module, imported on demand (it imports jax)."""
    if name == "pallas":
        raise UsageError("the op is a Pallas kernel of your own: the lab has no kernel of its own for it",
                         hint="tune its block sizes by compiling your function: `tpudiag lab tune MODULE:FN "
                              "--param block_m=128,256,512 ...`")
    if name not in KERNEL_FAMILIES:
        raise InputError(f"unknown kernel family {name!r}; expected one of {', '.join(KERNEL_FAMILIES)}")
    return importlib.import_module(f"tpudiag.kernels_lab.{name}")
