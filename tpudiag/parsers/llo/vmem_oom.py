"""VMEM out-of-memory compile errors (reference §7.2), parsed into a `VmemBudget`.

Three forms were seen on v5e (libtpu 0.0.42.1):

- scoped: `E1001: CompileTimeScopedVmemOom: ... while allocating on stack for %f.1 = ...
  Scoped allocation with size 28.00M and limit 16.00M exceeded scoped vmem limit by 12.00M.`
- capacity: `Ran out of memory in memory space vmem. Used 192.00M of 128.00M vmem. Exceeded vmem
  capacity by 64.00M.`, `Program vmem requirement 192.00M:` with a `scoped` line, then a ranked
  `Largest program allocations in vmem:` list (`1. Size: 64.00M`, `Operator:`, `Shape:`,
  `Unpadded size:`, `Tag:`, `XLA label:`, `Allocation type:`).
- one allocation over capacity: `Allocation (size=167772160) would exceed memory
  (size=134217728) :: #allocation2 [shape = '...', ..., tag = 'scratch operand'] :: f.1`.

Sizes printed as `28.00M` are MiB with two decimals, so parsed bytes are exact to ~5 KiB.
"""

from __future__ import annotations

import re

from tpudiag.model.llo import VmemBudget, VmemOomAllocation
from tpudiag.parsers.oom_text import line_at, parse_allocations, size_bytes

_SIZE = r"(\d+(?:\.\d+)?)([KMGT]?)"

_SCOPED = re.compile(rf"Scoped allocation with size {_SIZE} and limit {_SIZE} exceeded scoped vmem "
                     rf"limit by {_SIZE}")
_SCOPED_HLO = re.compile(r"allocating on stack for %(?P<hlo>[^\s=]+)\s*=")
_CAPACITY = re.compile(rf"Used {_SIZE} of {_SIZE} vmem\. Exceeded vmem capacity by {_SIZE}")
_REQUIREMENT_SCOPED = re.compile(rf"^\s*scoped\s+{_SIZE}\s*$", re.MULTILINE)
_SINGLE = re.compile(r"Allocation \(size=(?P<size>\d{1,18})\) would exceed memory \(size=(?P<mem>\d{1,18})\)"
                     r"(?: :: (?P<alloc>#allocation\d+ \[shape = '[^']*'[^\n]*?\]))?(?: :: (?P<hlo>\S+))?")
_SINGLE_FIELDS = re.compile(r"shape = '(?P<shape>[^']*)'.*?tag = '(?P<tag>[^']*)'")
_XLA_LABEL_NAME = re.compile(r"^%?(?P<name>[^\s=]+)\s*=")


def _allocations(text: str) -> tuple[VmemOomAllocation, ...]:
    """The ranked list as the VMEM budget keeps it (`tpudiag.parsers.oom_text.parse_allocations`)."""
    return tuple(VmemOomAllocation(
        rank=a.rank, size_bytes=a.size_bytes, operator=_operator(a), shape=a.shape,
        unpadded_size_bytes=a.unpadded_bytes, tag=a.tag, xla_label=a.xla_label, allocation_type=a.allocation_type)
        for a in parse_allocations(text))


def _operator(a) -> str:
    return " ".join(f'{k}="{v}"' for k, v in (("op_type", a.op_type), ("op_name", a.op_name)) if v)


def parse_vmem_oom(text: str) -> VmemBudget | None:
    """The VMEM budget an OOM error text describes, or None when the text has no VMEM OOM."""
    m = _SCOPED.search(text)
    if m is not None:
        hlo = _SCOPED_HLO.search(text)
        return VmemBudget(kind="scoped", hlo=hlo["hlo"] if hlo else "",
                          used_bytes=size_bytes(m[1], m[2]), limit_bytes=size_bytes(m[3], m[4]),
                          exceeded_by_bytes=size_bytes(m[5], m[6]), allocations=_allocations(text),
                          message=line_at(text, m.start()))
    m = _CAPACITY.search(text)
    if m is not None:
        allocations = _allocations(text)
        scoped = _REQUIREMENT_SCOPED.search(text)
        label = _XLA_LABEL_NAME.match(allocations[0].xla_label) if allocations else None
        return VmemBudget(kind="capacity", hlo=label["name"] if label else "",
                          used_bytes=size_bytes(m[1], m[2]), limit_bytes=size_bytes(m[3], m[4]),
                          exceeded_by_bytes=size_bytes(m[5], m[6]), allocations=allocations,
                          scoped_bytes=size_bytes(scoped[1], scoped[2]) if scoped else None,
                          message=line_at(text, m.start()))
    m = _SINGLE.search(text)
    if m is not None:
        used, limit = int(m["size"]), int(m["mem"])
        fields = _SINGLE_FIELDS.search(m["alloc"] or "")
        allocation = VmemOomAllocation(
            rank=1, size_bytes=used, operator="", shape=fields["shape"] if fields else "",
            unpadded_size_bytes=None, tag=fields["tag"] if fields else "", xla_label=m["hlo"] or "",
            allocation_type="")
        return VmemBudget(kind="allocation", hlo=m["hlo"] or "", used_bytes=used, limit_bytes=limit,
                          exceeded_by_bytes=used - limit, allocations=(allocation,),
                          message=line_at(text, m.start()))
    return None
