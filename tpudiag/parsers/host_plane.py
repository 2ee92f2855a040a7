"""The `/host:CPU` plane's TraceMe events as a table, on the host's time axis with the device events.

Each line of `/host:CPU` is one host thread (`main/<tid>`, `py_xla_execute/<tid>`, ...); its events
are TraceMe spans (dispatch, transfers, compilation, Python functions when the Python tracer is
on). Times are read like device times, on the axis `parsers.time_axis` gives the line, so a host
span and a device idle gap can be intersected directly; the caller reads the table only when the
host's lines and the device lines share one axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from array import array
from collections.abc import Callable

import numpy as np

from tpudiag.model import schemas
from tpudiag.parsers.time_axis import TimeAxis, unplaceable

if TYPE_CHECKING:  # pandas is imported where tables are built: a host's parse begins without it
    import pandas as pd


def host_events(plane, axis: TimeAxis, warn: Callable[[str], None]) -> pd.DataFrame:
    """`schemas.HOST_EVENTS` of one `/host:CPU` plane; names are looked up once per metadata id.

    A line that cannot be placed on the axis, and an event whose time does not fit in int64, is
    dropped with a warning."""
    names = {mid: (md.display_name or md.name) for mid, md in plane.event_metadata.items()}
    # A step annotation (jax.profiler.StepTraceAnnotation: `step_num`) spans its whole step: it says
    # where steps are, not what the host does in them, so it is no cause of idle and is left out.
    step_stat = next((k for k, md in plane.stat_metadata.items() if md.name == "step_num"), None)
    threads: list[str] = []
    thread_idx = array("q")
    mids = array("q")
    starts = array("q")
    durs = array("q")
    beyond = 0
    for line in plane.lines:
        t = len(threads)
        threads.append(line.display_name or line.name or f"thread {line.id}")
        base = axis.base_ps(line.timestamp_ns)
        if base is None:
            warn(unplaceable(threads[-1], plane.name))
            continue
        for ev in line.events:
            if step_stat is not None and ev.stats and any(st.metadata_id == step_stat for st in ev.stats):
                continue
            try:  # the int64 column refuses a time beyond int64, at no cost to the others
                starts.append(base + ev.offset_ps)
            except OverflowError:
                beyond += 1
                continue
            thread_idx.append(t)
            mids.append(ev.metadata_id)
            durs.append(ev.duration_ps)
    if beyond:
        warn(f"{beyond} `{plane.name}` events dropped: a time beyond int64 (damaged timestamps)")
    if not len(mids):
        return schemas.HOST_EVENTS.empty()
    mid_arr = np.frombuffer(mids, dtype=np.int64)
    uniq, inverse = np.unique(mid_arr, return_inverse=True)
    labels = np.array([names.get(int(m), f"event {int(m)}") for m in uniq], dtype=object)
    # Distinct names and threads are few: expand through small lookup arrays, then categorise.
    return schemas.HOST_EVENTS.frame({
        "thread": np.array(threads, dtype=object)[np.frombuffer(thread_idx, dtype=np.int64)],
        "name": labels[inverse],
        "start_ps": np.frombuffer(starts, dtype=np.int64),
        "dur_ps": np.frombuffer(durs, dtype=np.int64),
    })
