"""`TLP-NN-vmem_report.html`: VMEM allocations per HLO op, from the page's embedded JSON.

The page holds `const DATA = {"global_info": {module_name, vmem_capacity}, "hlo_breakdowns":
{<hlo>: {"blocks": [{"block_type": SCOPED|HLO_TEMPORARY, "block_size", "allocations": [{size,
padding, shape, tag}]}], "total_size"}}};` (whitespace varies: `const DATA ={`). Spill slots appear
as allocations tagged `SPILL` (slots x 4 KiB).
"""

from __future__ import annotations

import json
import re

from tpudiag.model.llo import VmemReport

_DATA = re.compile(r"const\s+DATA\s*=\s*")


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_vmem_report(text: str, file_name: str,
                      warnings: list[str]) -> tuple[VmemReport | None, list[dict]]:
    m = _DATA.search(text)
    if m is None:
        warnings.append(f"`{file_name}`: no `const DATA = ...` in the page; VMEM report skipped")
        return None, []
    try:
        data, _ = json.JSONDecoder().raw_decode(text, m.end())
    except json.JSONDecodeError as exc:
        warnings.append(f"`{file_name}`: VMEM report JSON unreadable ({exc.msg} at char {exc.pos})")
        return None, []
    if not isinstance(data, dict):
        warnings.append(f"`{file_name}`: VMEM report DATA is not an object")
        return None, []
    info = data.get("global_info") if isinstance(data.get("global_info"), dict) else {}
    report = VmemReport(str(info.get("module_name", "")), _int(info.get("vmem_capacity")))
    breakdowns = data.get("hlo_breakdowns")
    if not isinstance(breakdowns, dict):
        warnings.append(f"`{file_name}`: VMEM report has no hlo_breakdowns")
        return report, []
    rows, skipped = [], 0
    for hlo, breakdown in breakdowns.items():
        blocks = breakdown.get("blocks") if isinstance(breakdown, dict) else None
        if not isinstance(blocks, list):
            skipped += 1
            continue
        for index, block in enumerate(blocks):
            allocations = block.get("allocations") if isinstance(block, dict) else None
            block_bytes = _int(block.get("block_size")) if isinstance(block, dict) else None
            if not isinstance(allocations, list) or block_bytes is None:
                skipped += 1
                continue
            for alloc in allocations:
                size = _int(alloc.get("size")) if isinstance(alloc, dict) else None
                if size is None:
                    skipped += 1
                    continue
                tag = str(alloc.get("tag", ""))
                rows.append({"hlo": str(hlo), "block": index, "block_type": str(block.get("block_type", "")),
                             "block_bytes": block_bytes, "size_bytes": size,
                             "padding_bytes": _int(alloc.get("padding")) or 0,
                             "shape": str(alloc.get("shape", "")), "tag": tag,
                             "is_spill": tag.upper() == "SPILL"})
    if skipped:
        warnings.append(f"`{file_name}`: {skipped} VMEM report entr(y/ies) malformed; skipped")
    return report, rows
