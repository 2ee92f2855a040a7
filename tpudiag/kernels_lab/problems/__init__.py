"""What each kernel family reproduces, as a typed `Problem` per family (no jax).

One module per family, each holding its frozen `Problem` dataclass: it validates itself, knows
its FLOPs and ideal HBM traffic, scales down for a CPU run (`scaled`) and describes itself in one
line (`describe`). The family's kernel module (`tpudiag.kernels_lab.<family>`, which imports jax)
uses the same class, and `repro.py` carries a copy of it. `OpSpec.problem` is one of these.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from tpudiag.kernels_lab.problems import (collective, datamove, elementwise, matmul, multi_output, pallas, reduction,
                                         transpose)
from tpudiag.kernels_lab.tiling import BlockSizeError

# Family name -> its Problem class; the names `spec.json` and `repro.py` use.
PROBLEMS: dict[str, type] = {
    "matmul": matmul.Problem, "reduction": reduction.Problem, "elementwise": elementwise.Problem,
    "transpose": transpose.Problem, "multi_output": multi_output.Problem, "datamove": datamove.Problem,
    "collective": collective.Problem, "pallas": pallas.Problem,
}
# Families the lab reproduces with a kernel of its own (`kernels_lab.<family>`); `pallas` is the
# user's own kernel, tuned through their function (`lab tune MODULE:FN`).
KERNEL_FAMILIES = tuple(f for f in PROBLEMS if f != "pallas")
FAMILIES = tuple(PROBLEMS)

AnyProblem = (matmul.Problem | reduction.Problem | elementwise.Problem | transpose.Problem | multi_output.Problem
              | datamove.Problem | collective.Problem | pallas.Problem)


class KernelProblem(Protocol):
    """What every family's `Problem` provides."""

    @property
    def flops(self) -> int: ...

    @property
    def compute_dtype(self) -> str: ...

    @property
    def out_dtype(self) -> str: ...

    @property
    def min_hbm_bytes(self) -> int: ...

    def scaled(self, factor: int) -> KernelProblem: ...

    def describe(self) -> str: ...


def problem_from_fields(family: str, fields: dict) -> AnyProblem:
    """The family's Problem from its fields (`spec.json`, the inference); ValueError saying what is
    wrong: an unknown family, a field the Problem does not have, or a value it refuses."""
    cls = PROBLEMS.get(family)
    if cls is None:
        raise ValueError(f"unknown kernel family {family!r}; expected one of {', '.join(FAMILIES)}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"the {family} problem has no field {', '.join(unknown)}")
    try:
        return cls(**fields)
    except TypeError as exc:  # a required field missing
        raise ValueError(f"the {family} problem: {exc}") from None
    except BlockSizeError as exc:
        raise ValueError(f"the {family} problem: {exc}") from None


def problem_fields(problem: KernelProblem) -> dict:
    """The Problem's fields, tuples as lists: the form `spec.json` stores."""
    return _lists(dataclasses.asdict(problem))


def _lists(value):
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value
