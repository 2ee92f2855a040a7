"""What a captured collective is, for the collective family: kind, ring (replica group), shard shape.

Pure text inference (no jax). The ring comes from the HLO `replica_groups` when the instruction text
has them (a compiler dump joined with `--dump`, or the bundled example's own dumps), in any of the
three printed forms:

- explicit: `replica_groups={{0,2},{1,3}}`;
- iota: `replica_groups=[2,2]<=[4]` or `[2,2]<=[2,2]T(1,0)` (iota over the dims, transposed, cut
  into groups of the last size);
- mesh: `replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_1'}` (a group
  varies the named axes and fixes the others).

Without them the group size comes from the operand's shape (all-gather, reduce-scatter), else from
the capture's chip count; the basis says which.
"""

from __future__ import annotations

import math
import re

# The kinds the family reproduces, named as `tpudiag.model.hlo_names.collective_family` names them.
from tpudiag.kernels_lab.problems.collective import KINDS

_KIND_IN_TEXT = (("reduce-scatter", re.compile(r"\breduce-scatter\(|all-reduce-scatter")),
                 ("all-gather", re.compile(r"\ball-gather(?:-start)?\(")),
                 ("all-reduce", re.compile(r"\ball-reduce(?:-start)?\(")))
_EXPLICIT = re.compile(r"replica_groups=\{(?P<groups>(?:\{[\d,\s]*\},?\s*)+)\}")
_IOTA = re.compile(r"replica_groups=\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?:,\s*device_ids=\(\[(?P<dims>[\d,]+)\]"
                   r"(?:T\((?P<perm>[\d,]+)\))?\))?\s*\{(?P<named>[^}]*)\}")
_DIMENSIONS = re.compile(r"\bdimensions=\{(?P<d>\d+)\}")


def kind_of(family: str, category: str, text: str) -> str:
    """The reproducible kind of a collective op, or '' (other families, or nothing says which).
    v5e's async-collective start/done name no family: their category or fused body does."""
    if family in KINDS:
        return family
    for kind in KINDS:
        if kind in category.lower():
            return kind
    for kind, pattern in _KIND_IN_TEXT:
        if pattern.search(text):
            return kind
    return ""


def _transpose_iota(dims: list[int], perm: list[int] | None) -> list[int]:
    """iota(prod(dims)) reshaped to dims, transposed by perm, flattened (row-major)."""
    n = math.prod(dims)
    if not perm:
        return list(range(n))
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    out_dims = [dims[p] for p in perm]
    out = []
    for flat in range(n):
        idx, rest = [], flat
        for d in reversed(out_dims):
            idx.append(rest % d)
            rest //= d
        idx.reverse()
        out.append(sum(idx[k] * strides[perm[k]] for k in range(len(perm))))
    return out


def replica_groups(text: str) -> tuple[list[list[int]], str] | None:
    """(groups, how they were printed) from an instruction's text; None when it has none."""
    m = _EXPLICIT.search(text)
    if m:
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", m.group("groups"))]
        groups = [g for g in groups if g]
        return (groups, "explicit replica_groups") if groups else None
    m = _IOTA.search(text)
    if m:
        shape = [int(x) for x in m.group("shape").split(",")]
        dims = [int(x) for x in m.group("dims").split(",")]
        perm = [int(x) for x in m.group("perm").split(",")] if m.group("perm") else None
        flat = _transpose_iota(dims, perm)
        size = shape[-1]
        return [flat[i:i + size] for i in range(0, len(flat), size)], f"iota replica_groups {m.group(0)[15:]}"
    m = _MESH.search(text)
    if m:
        axes = [(a, int(s)) for a, s in re.findall(r"'([^']+)'=(\d+)", m.group("axes"))]
        named = re.findall(r"'([^']+)'", m.group("named"))
        sizes = [s for _, s in axes]
        n = math.prod(sizes)
        if m.group("dims"):
            dims = [int(x) for x in m.group("dims").split(",")]
            perm = [int(x) for x in m.group("perm").split(",")] if m.group("perm") else None
            devices = _transpose_iota(dims, perm) if math.prod(dims) == n else list(range(n))
        else:
            devices = list(range(n))
        varying = [i for i, (a, _) in enumerate(axes) if a in named]
        fixed = [i for i in range(len(axes)) if i not in varying]
        strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]

        def flat(index: dict[int, int]) -> int:
            return sum(index[i] * strides[i] for i in range(len(sizes)))

        groups = []
        for fixed_index in _product([sizes[i] for i in fixed]):
            group = []
            for var_index in _product([sizes[i] for i in varying]):
                index = dict(zip(fixed, fixed_index, strict=True)) | dict(zip(varying, var_index, strict=True))
                group.append(devices[flat(index)])
            groups.append(group)
        return groups, f"mesh replica_groups over axis {', '.join(named)}"


def mesh_axes(text: str) -> list[str]:
    """The mesh axes a collective's mesh-form replica_groups name (empty for other forms)."""
    m = _MESH.search(text)
    return re.findall(r"'([^']+)'", m.group("named")) if m else []
    return None


def _product(sizes: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for s in sizes:
        out = [t + (i,) for t in out for i in range(s)]
    return out


def gathered_dim(text: str) -> int | None:
    m = _DIMENSIONS.search(text)
    return int(m.group("d")) if m else None
