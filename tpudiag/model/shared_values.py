"""The values every host of a pod repeats, held once on the driver.

The hosts of one SPMD run carry the same program: the same op names, shapes, source lines and op
metadata, in every table of every host's digest. Each host's tables arrive as their own copies
(unpickled from a pool process or a Dask worker), so a driver that kept them as they came would
hold every op name, category list and shape string once per host: about 0.4 MB per host of a
522-op program, most of what grew with the host count. `SharedValues` makes each host's tables
refer to the first copy of each such value instead. The tables' contents do not change (equal
categories in the same order, equal strings); measured values (times, counts, bytes) are never
shared, since they are each host's own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from tpudiag.model.profile import HostTrace


class SharedValues:
    """Replaces, in each arriving host's tables, every categorical column's categories and every
    string column's strings by the first equal ones seen (`share`); one per capture read."""

    def __init__(self) -> None:
        self._dtypes: dict[tuple, pd.CategoricalDtype] = {}
        self._strings: dict[str, str] = {}

    def share(self, host: HostTrace) -> None:
        """Point `host`'s tables (its own and its digest's) at the values already held."""
        for frame in host_frames(host):
            self._share_frame(frame)

    def _share_frame(self, frame: pd.DataFrame) -> None:
        for name in frame.columns:
            column = frame[name]
            dtype = column.dtype
            if isinstance(dtype, pd.CategoricalDtype):
                same = self._dtypes.setdefault((tuple(dtype.categories), dtype.ordered), dtype)
                if same is not dtype:
                    frame[name] = pd.Categorical.from_codes(column.cat.codes.to_numpy(), dtype=same)
            elif isinstance(dtype, pd.StringDtype) and dtype.storage == "python":
                strings = self._strings
                values = column.to_numpy(dtype=object)
                frame[name] = pd.array(np.array([strings.setdefault(v, v) if isinstance(v, str) else v
                                                 for v in values], dtype=object), dtype=dtype)


def host_frames(host: HostTrace) -> list[pd.DataFrame]:
    """Every table `host` holds but its events (a pod's hosts arrive without them): its own, and those
    of its digest and the digest's parts (per-step tables included while they are not yet folded)."""
    frames = [host.op_metadata, host.step_markers, host.modules, host.async_windows]
    pending = [host.digest] if host.digest is not None else []
    while pending:
        value = pending.pop()
        for field in dataclasses.fields(value):
            v = getattr(value, field.name)
            if isinstance(v, pd.DataFrame):
                frames.append(v)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                pending.append(v)
    return frames
