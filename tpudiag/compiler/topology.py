"""TPU topology names for deviceless compilation, and the facts tpudiag needs about each.

Names follow libtpu's own rule, `^([a-zA-Z0-9_ ]+)[=_:]([0-9x]+)(_twisted|_untwisted)?$`
(libtpu prints it when a name does not match), e.g. `v5e:2x2`, `v5p:2x2x1`, `TPU7x:2x2x1`.
Device counts and the static-profile support were measured with libtpu 0.0.42.1
(`shared/reference/tpu-compiler-dumps.md` §2-3).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tpudiag.errors import UsageError
from tpudiag.model.hardware import ChipSpec, chip_for

TOPOLOGY_RULE = r"^([a-zA-Z0-9_ ]+)[=_:]([0-9x]+)(_twisted|_untwisted)?$"
_TOPOLOGY = re.compile(TOPOLOGY_RULE)

# Generation prefixes libtpu accepts, by tpudiag's canonical generation name. `v7x` is rejected
# by libtpu (`Invalid TPU external name: TPU v7x`); TPU7x is spelled `TPU7x` or `tpu7x`.
_GENERATIONS = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "tpu7x": "TPU7x"}

# The static LLO profile aborts the compiler on v4 (DMA latency model unsupported) and on TPU7x
# for anything beyond tiny programs; it works on these.
STATIC_PROFILE_GENERATIONS = frozenset({"v5e", "v5p", "v6e"})

# Dimensions of a chip grid as libtpu spells it: the generations with a 3D torus take three.
_GRID_RANK = {"v4": 3, "v5e": 2, "v5p": 3, "v6e": 2, "TPU7x": 3}

# Devices per chip as JAX sees them: v4 and TPU7x expose each TensorCore as a device.
_DEVICES_PER_CHIP = {"v4": 2, "v5e": 1, "v5p": 1, "v6e": 1, "TPU7x": 2}


@dataclass(frozen=True)
class Topology:
    """A parsed topology name, e.g. `v5e:2x2`."""

    name: str  # as given (libtpu gets exactly this)
    generation: str  # canonical: v4, v5e, v5p, v6e, TPU7x
    dims: tuple[int, ...]  # chip grid
    twist: str  # '', '_twisted' or '_untwisted'

    @property
    def chips(self) -> int:
        return math.prod(self.dims)

    @property
    def expected_devices(self) -> int:
        return self.chips * _DEVICES_PER_CHIP[self.generation]

    @property
    def chip(self) -> ChipSpec:
        spec = chip_for(self.generation)
        assert spec is not None, self.generation  # every accepted generation is in the table
        return spec

    @property
    def single_chip(self) -> bool:
        """libtpu rejects 1x1 unless `chips_per_host_bounds` is given; the worker passes it."""
        return self.chips == 1

    @property
    def static_profile_supported(self) -> bool:
        return self.generation in STATIC_PROFILE_GENERATIONS

    @property
    def clock_hz(self) -> float | None:
        """The TensorCore clock where public peaks imply it (v5e 1.5 GHz, v5p 1.75 GHz), else None."""
        return self.chip.clock_hz


def parse_topology(name: str) -> Topology:
    """Parse `name` or raise UsageError quoting libtpu's naming rule."""
    text = name.strip()
    m = _TOPOLOGY.match(text)
    known = ", ".join(sorted({"v4:2x2x1", "v5e:2x2", "v5p:2x2x1", "v6e:2x2", "TPU7x:2x2x1"}))
    if m is None:
        raise UsageError(f"bad topology name {name!r}: it must match {TOPOLOGY_RULE}",
                         hint=f"examples: {known}")
    prefix, dims_text, twist = m.group(1), m.group(2), m.group(3) or ""
    generation = _GENERATIONS.get(prefix.strip().lower())
    if generation is None:
        raise UsageError(f"unknown TPU generation {prefix!r} in topology {name!r}",
                         hint=f"use one of v4, v5e, v5p, v6e, TPU7x, e.g. {known}")
    parts = dims_text.split("x")
    if any(not p for p in parts):
        raise UsageError(f"bad chip grid {dims_text!r} in topology {name!r}: it must match {TOPOLOGY_RULE}",
                         hint=f"examples: {known}")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise UsageError(f"chip grid {dims_text!r} in topology {name!r} has a zero dimension")
    rank = _GRID_RANK[generation]
    if len(dims) == 1 and rank > 1:
        # libtpu rejects a bare chip count ("Invalid topology layout for a single slice: 1"). One
        # chip has one grid; any other count has several, so only that one is spelled out here.
        if dims != (1,):
            raise UsageError(f"topology {name!r} gives a chip count, not a grid: {generation} takes "
                             f"{rank} dimensions", hint=f"e.g. {generation}:{'x'.join(['2'] * rank)}")
        dims = (1,) * rank
        text = f"{prefix}:{'x'.join(['1'] * rank)}{twist}"
    return Topology(name=text, generation=generation, dims=dims, twist=twist)


def default_mesh_shape(n_devices: int) -> dict[str, int]:
    """tpudiag's default mesh: `data` x `model` with `model` = 2 when the count is even."""
    if n_devices >= 2 and n_devices % 2 == 0:
        return {"data": n_devices // 2, "model": 2}
    return {"data": n_devices, "model": 1}
