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

_SIZE = r"(\d+(?:\.\d+)?)([KMGT]?)"
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

_SCOPED = re.compile(rf"Scoped allocation with size {_SIZE} and limit {_SIZE} exceeded scoped vmem "
                     rf"limit by {_SIZE}")
_SCOPED_HLO = re.compile(r"allocating on stack for %(?P<hlo>[^\s=]+)\s*=")
_CAPACITY = re.compile(rf"Used {_SIZE} of {_SIZE} vmem\. Exceeded vmem capacity by {_SIZE}")
_REQUIREMENT_SCOPED = re.compile(rf"^\s*scoped\s+{_SIZE}\s*$", re.MULTILINE)
_SINGLE = re.compile(r"Allocation \(size=(?P<size>\d+)\) would exceed memory \(size=(?P<mem>\d+)\)"
                     r"(?: :: (?P<alloc>#allocation\d+ \[shape = '[^']*'[^\n]*?\]))?(?: :: (?P<hlo>\S+))?")
_SINGLE_FIELDS = re.compile(r"shape = '(?P<shape>[^']*)'.*?tag = '(?P<tag>[^']*)'")
_ENTRY = re.compile(rf"^\s*(?P<rank>\d+)\. Size: {_SIZE}\s*$")
_ENTRY_FIELD = re.compile(r"^\s*(?P<key>Operator|Shape|Unpadded size|Tag|XLA label|Allocation type): "
                          r"(?P<value>.*?)\s*$")
_XLA_LABEL_NAME = re.compile(r"^%?(?P<name>[^\s=]+)\s*=")


def size_bytes(number: str, unit: str) -> int:
    """`28.00`, `M` -> bytes (MiB: the compiler prints binary units)."""
    return round(float(number) * _UNIT[unit])


def _allocations(text: str) -> tuple[VmemOomAllocation, ...]:
    entries: list[dict] = []
    for line in text.splitlines():
        m = _ENTRY.match(line)
        if m is not None:
            entries.append({"rank": int(m["rank"]), "size_bytes": size_bytes(m[2], m[3])})
            continue
        f = _ENTRY_FIELD.match(line)
        if f is not None and entries:
            entries[-1][f["key"]] = f["value"]
    result = []
    for e in entries:
        unpadded = re.fullmatch(_SIZE, e.get("Unpadded size", ""))
        result.append(VmemOomAllocation(
            rank=e["rank"], size_bytes=e["size_bytes"], operator=e.get("Operator", ""),
            shape=e.get("Shape", ""),
            unpadded_size_bytes=size_bytes(unpadded[1], unpadded[2]) if unpadded else None,
            tag=e.get("Tag", ""), xla_label=e.get("XLA label", ""),
            allocation_type=e.get("Allocation type", "")))
    return tuple(result)


def line_at(text: str, at: int) -> str:
    """The whole line of `text` holding position `at`, stripped."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start:end if end >= 0 else len(text)].strip()


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
