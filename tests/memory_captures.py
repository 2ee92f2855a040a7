"""Inputs of the measured-memory tests: a capture with a played allocator, and a small pprof profile."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from tpudiag.proto import PprofProfile
from tpudiag.writers.allocator_trace import TracedAllocator, write_allocator_line
from tpudiag.writers.xspace_builder import XSpaceBuilder

GIB = 1 << 30
LINE_NS = 1_000  # every allocator line starts here, so XProf's in-line offsets order events as we do
T0_PS = 2_000_000  # allocator events start after this, on the capture clock
DATA_TYPES = list(range(24))  # every named TensorFlow DataType: XProf's names for them are checked too


def played_capture(path: Path) -> Path:
    """Two allocators on three threads. HBM: 1,500 events over three steps (group_id on most),
    8 MiB allocated before the capture, 64 KiB of stack; `TPU_1_bfc`: 40 events, no steps."""
    rng = random.Random(7)
    hbm = TracedAllocator("TPU_0_bfc", 16 * GIB, in_use_bytes=8 << 20, stack_bytes=64 << 10,
                          lifetime_peak_bytes=3 * GIB)
    other = TracedAllocator("TPU_1_bfc", 16 * GIB, first_address=0x6000_0000_0000)
    ops = ["jit(train)/dot_general", "jit(train)/add", "jit(train)/transpose", ""]
    live: list[int] = []
    t = T0_PS
    for i in range(1500):
        t += rng.randrange(1, 4) * 1000
        step = None if i % 97 == 0 else i // 500  # some events without group_id
        if live and (len(live) > 40 or rng.random() < 0.45):
            hbm.free(t, live.pop(rng.randrange(len(live))), step_id=step)
        else:
            size = rng.choice([1 << 20, 3 << 20, 1000, 4 << 20, 12345])
            live.append(hbm.allocate(t, size, step_id=step, op=rng.choice(ops),
                                     region_type=rng.choice(["output", "temp", "persist"]),
                                     data_type=rng.choice(DATA_TYPES), shape=f"[{size // 4}]"))
    other_live = []
    for i in range(40):
        if other_live and i % 3 == 2:
            other.free(T0_PS + 7000 * i + 500, other_live.pop(0))
        else:
            other_live.append(other.allocate(T0_PS + 7000 * i + 500, 2 << 20))
    space = XSpaceBuilder("host0")
    host = space.plane("/host:CPU", 1)
    host.line("main/1", 1, LINE_NS).event(host.event_metadata("PjitFunction(train)"), 0, 10_000)
    write_allocator_line(host, "py_xla_execute/2", 2, LINE_NS, [r for r in hbm.records if r.time_ps % 2])
    write_allocator_line(host, "python/3", 3, LINE_NS, [r for r in hbm.records if not r.time_ps % 2] + other.records)
    return space.write(path)


def pprof_bytes(sample_types=(("allocations", "count"), ("space", "bytes")), values=(1, 64),
                function_id=1, location_id=1, kind="buffer") -> bytes:
    """A gzipped pprof profile of one sample of `kind`: `values` per sample type, at model.py:7 on tpu:0."""
    p = PprofProfile()
    strings = [""]

    def s(text: str) -> int:
        strings.append(text)
        return len(strings) - 1

    for t, u in sample_types:
        p.sample_type.add(type=s(t), unit=s(u))
    p.function.add(id=1, name=s("f"), filename=s("model.py"))
    p.location.add(id=1).line.add(function_id=function_id, line=7)
    sample = p.sample.add(location_id=[location_id], value=list(values))
    sample.label.add(key=s("kind"), str=s(kind))
    sample.label.add(key=s("device"), str=s("tpu:0"))
    p.string_table.extend(strings)
    return gzip.compress(p.SerializeToString())
