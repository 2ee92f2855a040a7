"""Reading back a real `jax.profiler` CPU capture: the XLA ops it executed and the steps it annotated."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tpudiag.proto.schema import XSpace


def capture_events(run_dir: Path, step_name: str = "train") -> tuple[Counter, list[int]]:
    """Events on the XLA CPU client's threads (by name), and the step numbers of `step_name` annotations."""
    (trace,) = Path(run_dir).glob("*.xplane.pb")
    space = XSpace()
    space.ParseFromString(trace.read_bytes())
    ops: Counter = Counter()
    steps: list[int] = []
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if line.name.startswith("tf_XLA"):
                    ops[name] += 1
                if name == step_name:
                    steps += [s.int64_value or s.uint64_value for s in event.stats
                              if stat_names[s.metadata_id] == "step_num"]
    return ops, sorted(steps)


def hlo_instructions(hlo_text: str) -> set[str]:
    """The instruction names of an HLO module's text."""
    return set(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = ", hlo_text, flags=re.M))
