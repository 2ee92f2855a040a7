"""`<prog>-NN-final_hlo-static-per-bundle-utilization.txt`: one row of slot issues per bundle.

    == CAPACTIY:            (sic; CAPACITY accepted too)
    MXU, XLU, VALU, VPOP, EUP, VLOAD, VLOAD:FILL, VSTORE, VSTORE:SPILL, SALU
        4     3     4     2     1     3     3     1     1     2
    == UTILIZATION:
    0 0 0 0 0 1 0 0 0 0
    ...

Row count = scheduled bundles; MXU = MXUs busy in the bundle; VLOAD:FILL / VSTORE:SPILL are the
spill fills and stores, the same ones `final_bundles` shows.
"""

from __future__ import annotations

import re

from tpudiag.model.llo import KNOWN_UTILIZATION_COLUMNS, BundleUtilization, UtilizationColumn

_CAPACITY = re.compile(r"^== CAPAC(?:TIY|ITY):\s*$")
_UTILIZATION = re.compile(r"^== UTILIZATION:\s*$")
_INTS = re.compile(r"^\s*\d+(?:\s+\d+)*\s*$")


def parse_utilization(text: str, program: str, file_name: str,
                      warnings: list[str]) -> BundleUtilization | None:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CAPACITY.match(line)), None)
    if start is None or start + 2 >= len(lines):
        warnings.append(f"`{file_name}`: no `== CAPACTIY:` header; file skipped")
        return None
    names = [n.strip() for n in lines[start + 1].split(",")]
    if not _INTS.match(lines[start + 2]) or len(lines[start + 2].split()) != len(names):
        warnings.append(f"`{file_name}`: capacity row does not match the {len(names)} columns; "
                        "file skipped")
        return None
    capacities = [int(v) for v in lines[start + 2].split()]
    unknown = [n for n in names if n not in KNOWN_UTILIZATION_COLUMNS]
    if unknown:
        warnings.append(f"`{file_name}`: unknown utilization columns {unknown} (summed, not interpreted)")
    totals = [0] * len(names)
    bundles = bad = 0
    in_rows = False
    for line in lines[start + 3:]:
        if _UTILIZATION.match(line):
            in_rows = True
            continue
        if not in_rows or not line.strip():
            continue
        values = line.split()
        if len(values) != len(names) or not _INTS.match(line):
            bad += 1
            continue
        bundles += 1
        for i, v in enumerate(values):
            totals[i] += int(v)
    if not in_rows:
        warnings.append(f"`{file_name}`: no `== UTILIZATION:` section; bundle count unknown")
        return None
    if bad:
        warnings.append(f"`{file_name}`: {bad} utilization row(s) not understood (truncated file?)")
    return BundleUtilization(program, bundles, tuple(
        UtilizationColumn(n, c, t) for n, c, t in zip(names, capacities, totals)))
