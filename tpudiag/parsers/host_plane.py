"""The `/host:CPU` plane's TraceMe events as a table, on the device planes' time origin.

Each line of `/host:CPU` is one host thread (`main/<tid>`, `py_xla_execute/<tid>`, ...); its events
are TraceMe spans (dispatch, transfers, compilation, Python functions when the Python tracer is
on). Times are read like device times (`timestamp_ns` x 1000 + `offset_ps`, less the device
origin), so a host span and a device idle gap can be intersected directly.
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from tpudiag.model import schemas


def host_events(plane, origin_ns: int) -> pd.DataFrame:
    """`schemas.HOST_EVENTS` of one `/host:CPU` plane; names are looked up once per metadata id."""
    names = {mid: (md.display_name or md.name) for mid, md in plane.event_metadata.items()}
    threads: list[str] = []
    thread_idx = array("q")
    mids = array("q")
    starts = array("q")
    durs = array("q")
    for line in plane.lines:
        t = len(threads)
        threads.append(line.display_name or line.name or f"thread {line.id}")
        base = (line.timestamp_ns - origin_ns) * 1000
        for ev in line.events:
            thread_idx.append(t)
            mids.append(ev.metadata_id)
            starts.append(base + ev.offset_ps)
            durs.append(ev.duration_ps)
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
