"""`<prog>-NN-register-pressure.txt` (category ra; only some programs get one).

    Register pressure for vregs is 132
    len=9414 lr=[948, 10362) wt=36 users=8             :: %v21098 = vpack.c.bf16 %v2754, %v2695
                                            use: lr=[125, 132) %v459 = ...

The pressure is a pre-allocation number: a weak spill predictor (reference §5), kept for context.
"""

from __future__ import annotations

import re

from tpudiag.model.llo import LiveRange, RegisterPressure

_HEADER = re.compile(r"^Register pressure for (?P<cls>\S+) is (?P<value>\d+)\s*$")
_RANGE = re.compile(r"^len=(?P<len>\d+) lr=\[(?P<start>-?\d+), (?P<end>-?\d+)\) wt=(?P<wt>\d+) "
                    r"users=(?P<users>\d+)\s+:: (?P<instr>.*)$")
_USE = re.compile(r"^\s+use: ")

MAX_LIVE_RANGES = 10  # the dump lists hundreds; the longest few explain the pressure


def parse_register_pressure(text: str, program: str, file_name: str, warnings: list[str],
                            max_live_ranges: int = MAX_LIVE_RANGES) -> list[RegisterPressure]:
    results: list[RegisterPressure] = []
    cls, value, ranges = None, 0, []
    bad = 0

    def flush():
        if cls is not None:
            results.append(RegisterPressure(program, cls, value, tuple(ranges)))

    for line in text.splitlines():
        if not line.strip() or _USE.match(line):
            continue
        m = _HEADER.match(line)
        if m is not None:
            flush()
            cls, value, ranges = m["cls"], int(m["value"]), []
            continue
        m = _RANGE.match(line)
        if m is None or cls is None:
            bad += 1
            continue
        if len(ranges) < max_live_ranges:
            ranges.append(LiveRange(int(m["len"]), int(m["start"]), int(m["end"]), int(m["wt"]),
                                    int(m["users"]), m["instr"].strip()))
    flush()
    if bad:
        warnings.append(f"`{file_name}`: {bad} line(s) not understood")
    if not results:
        warnings.append(f"`{file_name}`: no `Register pressure for ...` line")
    return results
