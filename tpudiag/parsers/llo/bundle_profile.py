"""`TLP-NN-hlo-static-bundle-profile.txt`: static slot use per HLO op (category misc, all chips).

Per HLO a header `HLO: %fusion.7 = <shape> fusion(...), ...` (or `HLO: <no-hlo-instruction>`,
several times), then lines ` - MXU_0 matmul_packed: (256/276) - 0.927536` or
` - VMEM_SPILL_COUNT: (107/4415) - 0.0242356`. The denominator is capacity x static bundles;
loop bodies count once.
"""

from __future__ import annotations

import re

from tpudiag.model.llo import INDEXED_PROFILE_UNITS, KNOWN_PROFILE_UNITS, NO_HLO

_HEADER = re.compile(r"^HLO: (?P<text>.*)$")
_FLOAT = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|nan|-?inf"
_LINE = re.compile(r"^ - (?P<unit>[A-Za-z0-9_]+)(?: (?P<op>[A-Za-z0-9_]+))?: "
                   rf"\((?P<num>[0-9]+)/(?P<den>[0-9]+)\) - (?P<frac>{_FLOAT})$")
_INDEXED_UNIT = re.compile(rf"^(?:{'|'.join(INDEXED_PROFILE_UNITS)})_\d+$")
# `%name = shape opcode(` : the opcode is the first lower-case word directly before `(` that
# follows whitespace (layout tiles such as `T(8,128)` follow `:` or `)`, never a space).
_HLO_NAME = re.compile(r"^%?(?P<name>[^\s=]+)\s*=")
_OPCODE = re.compile(r"\s(?P<opcode>[a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"\bcalls=%(?P<calls>[^\s,]+)")


def hlo_name_and_opcode(text: str) -> tuple[str, str]:
    """(`fusion.7`, `fusion`) from an HLO instruction's text; (text, '') when it has no `=`."""
    text = text.strip()
    if text.startswith("<"):
        return text, ""
    m = _HLO_NAME.match(text)
    if m is None:
        return text, ""
    op = _OPCODE.search(text, m.end())
    return m["name"], op["opcode"] if op else ""


def parse_bundle_profile(text: str, program: str, file_name: str, warnings: list[str]) -> list[dict]:
    """Rows for `BUNDLE_PROFILE`, one per unit line."""
    rows: list[dict] = []
    block, hlo, opcode, calls = -1, None, "", ""
    unknown_units: set[str] = set()
    bad_lines: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        header = _HEADER.match(line)
        if header is not None:
            block += 1
            hlo, opcode = hlo_name_and_opcode(header["text"])
            called = _CALLS.search(header["text"])
            calls = called["calls"] if called else ""
            if hlo.startswith("<") and hlo != NO_HLO:
                hlo = hlo.split()[0]
            continue
        m = _LINE.match(line)
        if m is None or hlo is None:
            bad_lines.append(line)
            continue
        unit = m["unit"]
        if unit not in KNOWN_PROFILE_UNITS and not _INDEXED_UNIT.match(unit):
            unknown_units.add(unit)
        rows.append({"program": program, "block": block, "hlo": hlo, "opcode": opcode, "calls": calls,
                     "unit": unit, "op": m["op"] or "", "count": int(m["num"]), "capacity": int(m["den"]),
                     "fraction": float(m["frac"])})
    if unknown_units:
        warnings.append(f"`{file_name}`: unknown bundle-profile units {sorted(unknown_units)} "
                        "(kept, not interpreted)")
    if bad_lines:
        warnings.append(f"`{file_name}`: {len(bad_lines)} line(s) not understood, first: "
                        f"{bad_lines[0][:80]!r}")
    return rows
