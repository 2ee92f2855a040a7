"""`<hlo>_static_llo_profile.textproto`: the compiler's cycle estimate per HLO op.

    hlo_op_estimate {
      hlo_op_name: "fusion.7"
      estimated_cycles: 14170
      num_equivalent_hlos: 1
      dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
      ...nested hlo_instruction / operand_shapes / called_computations...
    }

No schema ships with libtpu, so the four top-level fields (two-space indent) are read with a
regex. `DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE` ops (collectives, and compute carrying a
collective continuation) always report 0 cycles: that 0 is not an estimate.
"""

from __future__ import annotations

import re

_BLOCK = re.compile(r"^hlo_op_estimate \{\s*$", re.MULTILINE)
_FIELD = re.compile(r"^  (?P<key>hlo_op_name|estimated_cycles|num_equivalent_hlos|dma_instruction_type): "
                    r"(?P<value>.*?)\s*$", re.MULTILINE)
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit: it accepts `²`, which int() rejects
_DMA_PREFIX = "DMA_INSTRUCTION_TYPE_"
REMOTE = "LOCAL_AND_REMOTE"


def _unquote(value: str) -> str | None:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return None


def parse_static_profile(text: str, file_name: str, warnings: list[str]) -> list[dict]:
    """`STATIC_PROFILE` rows, one per `hlo_op_estimate` block."""
    starts = [m.start() for m in _BLOCK.finditer(text)]
    if not starts:
        warnings.append(f"`{file_name}`: no `hlo_op_estimate` block")
        return []
    rows = []
    for start, end in zip(starts, [*starts[1:], len(text)]):
        fields = {m["key"]: m["value"] for m in _FIELD.finditer(text, start, end)}
        name = _unquote(fields.get("hlo_op_name", ""))
        cycles = fields.get("estimated_cycles", "")
        if name is None or not _DIGITS.fullmatch(cycles):
            warnings.append(f"`{file_name}`: estimate without hlo_op_name or estimated_cycles; skipped")
            continue
        equivalent = fields.get("num_equivalent_hlos", "1")
        if not _DIGITS.fullmatch(equivalent):
            warnings.append(f"`{file_name}`: num_equivalent_hlos {equivalent!r} not a number; using 1")
            equivalent = "1"
        dma = fields.get("dma_instruction_type", "")
        dma = dma.removeprefix(_DMA_PREFIX)
        total = None if dma == REMOTE else int(cycles) * int(equivalent)
        rows.append({"hlo": name, "estimated_cycles": int(cycles), "num_equivalent_hlos": int(equivalent),
                     "total_cycles": total, "dma_instruction_type": dma, "file": file_name})
    return rows
