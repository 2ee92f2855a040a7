"""`<prog>-NN-schedule-analysis_final_bundles.txt`: bundle totals and bundles per HLO op.

    Schedule analysis:
        total scheduled bundles:    334
        empty scheduled bundles:    34
        non empty scheduled bundles: 300
         281.50 scheduled bundles (93.83%): <no hlo>
           9.00 scheduled bundles ( 3.00%): %copy-start = (...) copy-start(%param.2), ...
        [opcode]      15 scheduled bundles ( 5.00%): copy-start     (1 instances,  15.00 avg)

Per-HLO bundles are fractional: a bundle shared by two ops counts half to each.
"""

from __future__ import annotations

import re

from tpudiag.model.llo import ScheduleAnalysis
from tpudiag.parsers.llo.bundle_profile import hlo_name_and_opcode

_TOTALS = {
    "total": re.compile(r"^\s*total scheduled bundles:\s*(\d+)\s*$"),
    "empty": re.compile(r"^\s*empty scheduled bundles:\s*(\d+)\s*$"),
    "non_empty": re.compile(r"^\s*non empty scheduled bundles:\s*(\d+)\s*$"),
}
_PER_HLO = re.compile(r"^\s*(?P<bundles>\d+(?:\.\d+)?) scheduled bundles \(\s*(?P<pct>\d+(?:\.\d+)?)%\): "
                      r"(?P<text>.*)$")
_OPCODE_LINE = re.compile(r"^\s*\[opcode\]")


def parse_schedule(text: str, program: str, file_name: str,
                   warnings: list[str]) -> tuple[ScheduleAnalysis | None, list[dict]]:
    totals: dict[str, int] = {}
    rows: list[dict] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("Schedule analysis") or _OPCODE_LINE.match(line):
            continue
        for key, pattern in _TOTALS.items():
            m = pattern.match(line)
            if m is not None:
                totals[key] = int(m[1])
                break
        else:
            m = _PER_HLO.match(line)
            if m is None:
                bad += 1
                continue
            name, _ = hlo_name_and_opcode(m["text"])
            rows.append({"program": program, "hlo": name, "bundles": float(m["bundles"]),
                         "percent": float(m["pct"]), "hlo_text": m["text"]})
    if bad:
        warnings.append(f"`{file_name}`: {bad} line(s) not understood")
    if len(totals) < 3:
        warnings.append(f"`{file_name}`: bundle totals missing ({sorted(set(_TOTALS) - set(totals))})")
        return None, rows
    return ScheduleAnalysis(program, totals["total"], totals["empty"], totals["non_empty"]), rows
