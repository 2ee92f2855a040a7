"""What every out-of-memory text shares: its sizes (`17.00G`), the line that says it, and the
ranked `Largest program allocations in hbm:` / `in vmem:` list (`tpudiag.parsers.oom_error` for
HBM, `tpudiag.parsers.llo.vmem_oom` for VMEM).

Sizes are binary units with two decimals (`28.00M` = 28 MiB), as the compiler prints them. A size
no device could hold (past 2^56 bytes, or past float range: `1<309 zeros>G`) is an
`OomSizeError`, never an `OverflowError`.
"""

from __future__ import annotations

import math
import re

from tpudiag.model.memory import OomAllocation

_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# No device holds 2^56 bytes (64 PiB): a larger size is a damaged or hostile text.
MAX_SIZE_BYTES = 1 << 56
_SIZE = r"(\d+(?:\.\d+)?)\s?([KMGT]?)i?B?"
_ENTRY = re.compile(rf"^\s*(?P<rank>\d{{1,6}})\. Size: {_SIZE}\s*$")
_FIELD = re.compile(r"^\s*(?P<key>Operator|Shape|Unpadded size|Extra memory due to padding|Tag|XLA label|"
                    r"Allocation type): (?P<value>.*?)\s*$")
_EXPANSION = re.compile(rf"^{_SIZE}\s*\((?P<x>\d{{1,9}}(?:\.\d{{1,9}})?)x expansion\)")
_ATTR = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|(\S+))')
_LABEL_NAME = re.compile(r"^%?(?P<name>[^\s=]+)\s*=")


class OomSizeError(ValueError):
    """A size in an out-of-memory text that no device could have."""


def size_bytes(number: str, unit: str) -> int:
    """`28.00`, `M` -> bytes (MiB: the compiler prints binary units); OomSizeError past any device."""
    value = float(number) * _UNIT[unit] if len(number) <= 40 else math.inf
    if not value <= MAX_SIZE_BYTES:
        shown = number if len(number) <= 20 else f"{number[:8]}…({len(number)} digits)"
        raise OomSizeError(f"size `{shown}{unit}` is past any device's memory")
    return round(value)


def line_at(text: str, at: int) -> str:
    """The whole line of `text` holding position `at`, stripped."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start:end if end >= 0 else len(text)].strip()


def parse_allocations(text: str) -> tuple[OomAllocation, ...]:
    """The `Largest program allocations in hbm:` (or `vmem:`) list, in its printed order."""
    entries: list[dict[str, str | int]] = []
    for line in text.splitlines():
        m = _ENTRY.match(line)
        if m is not None:
            entries.append({"rank": int(m["rank"]), "size_bytes": size_bytes(m[2], m[3])})
            continue
        f = _FIELD.match(line)
        if f is not None and entries:
            entries[-1][f["key"]] = f["value"]
    return tuple(_allocation(e) for e in entries)


def _allocation(e: dict) -> OomAllocation:
    unpadded = re.match(_SIZE, e.get("Unpadded size", ""))
    extra = _EXPANSION.match(e.get("Extra memory due to padding", ""))
    attrs = {m[1]: (m[2] if m[2] is not None else m[3]) for m in _ATTR.finditer(e.get("Operator", ""))}
    line = attrs.get("source_line", "")
    label = e.get("XLA label", "")
    name = _LABEL_NAME.match(label)
    unpadded_bytes = size_bytes(unpadded[1], unpadded[2]) if unpadded else None
    padding = size_bytes(extra[1], extra[2]) if extra else None
    if padding is None and unpadded_bytes is not None and unpadded_bytes <= e["size_bytes"]:
        padding = e["size_bytes"] - unpadded_bytes  # printed only above a threshold; the sizes say it
    return OomAllocation(
        rank=e["rank"], size_bytes=e["size_bytes"], shape=e.get("Shape", ""), unpadded_bytes=unpadded_bytes,
        padding_bytes=padding, expansion=float(extra["x"]) if extra else None,
        op_type=attrs.get("op_type", ""), op_name=attrs.get("op_name", "").replace('\\"', '"'),
        source_file=attrs.get("source_file", ""),
        source_line=int(line) if line.isascii() and line.isdigit() and len(line) < 10 else 0,
        xla_label=label, instruction=name["name"] if name else "", allocation_type=e.get("Allocation type", ""),
        tag=e.get("Tag", ""))


