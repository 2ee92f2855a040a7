"""What a collective moves over ICI: participants per replica group and bytes per device by algorithm.

One model, read by the analysis (achieved ICI bandwidth of a traced collective) and the compiler's
cost model (a modelled collective's time):

- participants per replica group, from the instruction's printed `replica_groups` in any of XLA's
  forms: iota `[groups,size]<=[...]`, explicit `{{0,1},{2,3}}`, mesh
  `mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`;
- where no `replica_groups` is printed (a trace's HLO text often has none), the group an all-gather
  or reduce-scatter shows in the ratio of its result and operand, else every chip of the host,
  said as assumed (`GroupSource`);
- bytes each device sends over ICI for a payload of `payload` bytes (the larger of the
  collective's result and operands) in a group of n, with bandwidth-optimal ring algorithms:
  all-gather, reduce-scatter and all-to-all (n-1)/n x payload, all-reduce 2(n-1)/n x payload
  (a reduce-scatter then an all-gather), collective-permute and others 1 x payload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from tpudiag.model.hlo_shapes import operand_shapes, parse_shapes, result_shapes, shape_bytes

# Replica groups as XLA prints them: iota `[groups,size]<=[...]` or explicit `{{0,1},{2,3}}`.
_GROUPS_IOTA = re.compile(r"replica_groups=\[(?P<dims>[\d,]+)\]<=")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{(?P<first>[\d,\s]*)\}")
# Mesh form (newer XLA): `replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`.
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<sel>[^}]*)\}")
_MESH_AXIS = re.compile(r"'(?P<axis>[^']+)'\s*=\s*(?P<size>\d+)")

RING_FAMILIES = frozenset({"all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all"})


def replica_group_size(text: str) -> int | None:
    """Participants per replica group in printed attributes, in any of XLA's forms; None if absent."""
    mesh = _GROUPS_MESH.search(text)
    if mesh:
        axes = {a.group("axis"): int(a.group("size")) for a in _MESH_AXIS.finditer(mesh.group("axes"))}
        size = 1
        for axis in re.findall(r"'([^']+)'", mesh.group("sel")) or list(axes):
            size *= axes.get(axis, 1)
        return size
    m = _GROUPS_IOTA.search(text)
    if m:
        dims = [int(d) for d in m.group("dims").split(",") if d]
        return dims[-1] if dims else None
    m = _GROUPS_LIST.search(text)
    if m:
        return len([x for x in m.group("first").split(",") if x.strip()]) or None
    return None


def ring_factor(family: str, n: int) -> float:
    """Bytes each device sends over ICI per payload byte, for a group of `n` (0 for n <= 1)."""
    if n <= 1:
        return 0.0
    if family == "all-reduce":
        return 2.0 * (n - 1) / n
    if family in RING_FAMILIES:
        return (n - 1) / n
    return 1.0


class GroupSource(StrEnum):
    """Where a collective's group size came from; the value is what outputs print."""

    REPLICA_GROUPS = "replica_groups"  # printed in its HLO text
    SHAPES = "shapes"  # the ratio of its gathered and scattered shapes (all-gather, reduce-scatter)
    ASSUMED = "assumed"  # neither: every chip of the host


@dataclass(frozen=True)
class Traffic:
    """What one occurrence of a collective sends over ICI from each device, modelled."""

    family: str  # the algorithm: a generic async collective gets the one its shapes show
    group_size: int
    group_source: GroupSource
    payload_bytes: float  # the larger of its gathered (or reduced) data and its operands
    bytes_per_device: float  # ring_factor(family, group_size) x payload_bytes


def _largest(shapes) -> float:
    return max((shape_bytes(s) for s in shapes), default=0.0)


def traffic(family: str, hlo_text: str, result_text: str, default_group: int) -> Traffic:
    """The ICI traffic of one occurrence of a collective of `family`, from its HLO text (operands,
    result, `replica_groups`), else its result shape `result_text`; `default_group` (every chip of
    the host) where nothing tells the group. An async start's result tuple holds its operand and its
    result, so its largest array is the gathered data; a generic async collective (v5e's
    `async-collective-start`) is an all-gather when its result is larger than its operand, a
    reduce-scatter when smaller, else an all-reduce."""
    results = result_shapes(hlo_text) or parse_shapes(result_text)
    operands = operand_shapes(hlo_text)
    result, operand = _largest(results), _largest(operands)
    if family == "collective" and result and operand:
        family = "all-gather" if result > operand else "reduce-scatter" if result < operand else "all-reduce"
    stated = replica_group_size(hlo_text)
    group, source = stated, GroupSource.REPLICA_GROUPS
    if group is None and result and operand and family in ("all-gather", "reduce-scatter"):
        ratio = result / operand if family == "all-gather" else operand / result
        if ratio >= 2 and float(ratio).is_integer():
            group, source = int(ratio), GroupSource.SHAPES
    if group is None:
        group, source = max(default_group, 1), GroupSource.ASSUMED
    payload = max(result, operand)
    if not operand and family == "reduce-scatter":  # only the scattered result is known
        payload = result * group
    return Traffic(family, group, source, payload, ring_factor(family, group) * payload)


# A collective's fixed cost (synchronisation, DMA setup, hops) before bandwidth matters: the cost
# model's default ICI latency (`analysis.cost_model.CostModel.for_chip`).
ICI_LATENCY_PS = 2_000_000
LATENCY_BOUND_UTILIZATION = 0.1  # below this share of the ICI peak, a small collective is latency-bound


def latency_bound(bytes_per_device: float, time_ps: float, peak_bytes_per_s: float | None) -> bool:
    """Whether a collective is latency-bound: its bytes would cross ICI in less than the fixed latency
    at peak, and it achieved under a tenth of the peak over its time."""
    if not peak_bytes_per_s or time_ps <= 0:
        return False
    at_peak_ps = bytes_per_device / peak_bytes_per_s * 1e12
    return at_peak_ps < ICI_LATENCY_PS and at_peak_ps < LATENCY_BOUND_UTILIZATION * time_ps
