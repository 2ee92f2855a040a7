"""A Pallas kernel the user wrote, as its serialised Mosaic body states it (no jax).

A `tpu_custom_call` already is a hand-written kernel: what the lab reproduces is that kernel itself,
on the captured shapes, with the grid, blocks and dimension semantics it was compiled with
(`model.kernels.MosaicKernel`, read by `parsers.mosaic`). Its block sizes are tuned by compiling
the user's own function with other values (`tpudiag lab tune MODULE:FN --param ...`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpudiag.model.kernels import KernelBlock, MosaicKernel


# What a reproduction of the user's kernel (`lab extract`'s repro.py) does not do that the captured op did.
LEFT_OUT = ("the code around the kernel in your function (wrappers, `shard_map`, epilogues XLA fused "
            "outside the custom call)", "`pl.CostEstimate`, `input_output_aliases` and compiler params "
            "other than the dimension semantics", "your inputs' values (random inputs of the captured "
            "shapes and dtypes)")


@dataclass(frozen=True)
class Problem:
    """The user's kernel (`kernel`, its facts) on the captured arrays (`operands`, `outputs`: `dtype[dims]`)."""

    kernel: MosaicKernel
    operands: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    declared_flops: int = 0  # `pl.CostEstimate` flops, 0 when the kernel declares none
    declared_bytes: int = 0

    def __post_init__(self) -> None:
        kernel = self.kernel
        if isinstance(kernel, dict):  # spec.json: the kernel's fields, lists for tuples
            blocks = tuple(KernelBlock(**{**b, "shape": tuple(b["shape"]), "index_map": None if b.get("index_map") is None
                                          else tuple(b["index_map"])}) for b in kernel.get("blocks", ()))
            kernel = MosaicKernel(**{**kernel, "grid": tuple(kernel.get("grid", ())), "blocks": blocks,
                                     "dimension_semantics": tuple(kernel.get("dimension_semantics", ())),
                                     "caller_params": tuple(kernel.get("caller_params", ()))})
        if not isinstance(kernel, MosaicKernel):
            raise ValueError(f"a Pallas problem's kernel must be its facts, not {type(kernel).__name__}")
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "operands", tuple(self.operands))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def flops(self) -> int:
        return self.declared_flops

    @property
    def compute_dtype(self) -> str:
        ins = self.kernel.of("input")
        return ins[0].dtype if ins else ""

    @property
    def out_dtype(self) -> str:
        outs = self.kernel.of("output")
        return outs[0].dtype if outs else ""

    @property
    def min_hbm_bytes(self) -> int:
        return self.declared_bytes

    def scaled(self, factor: int) -> Problem:
        """The user's kernel is not rescaled: its grid and blocks are what it was compiled with."""
        return dataclasses.replace(self)

    def describe(self) -> str:
        """`Pallas `_kernel` (pallas_matmul.py:27-35) grid (4,4,4) parallel,parallel,arbitrary; blocks ...`."""
        k = self.kernel
        where = f" ({k.source_name})" if k.source_file else ""
        return f"Pallas {k.describe().replace(f'`{k.name}`', f'`{k.name}`{where}', 1)}"
