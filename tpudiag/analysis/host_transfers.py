"""Async copies between host memory and HBM (offload, prefetch): which ops, how many bytes, how fast.

An async copy (`copy-start` / `copy-done`) moves an array from one memory space to another. One
whose destination or source is host memory (`S(5)` in its layout, `model.compiled.HOST_MEMORY_SPACE`:
what JAX's `pinned_host` memory kind compiles to) crosses the host link (PCIe); the core waits for
it in the `copy-done`. Those waits are their own part of a step (`host_transfer_ps` in the steps
table), not compute.

The facts come from the trace's own op metadata, per (program, op): a `copy-start`'s result is
`(destination, source, context)`, so its shape says the direction and the bytes; a `copy-done`
takes them from its `copy-start` (the HLO text names it as the operand; else the shared name
suffix pairs them). On each core, a transfer's window runs from its `copy-start` to the end of its
`copy-done`; the table `schemas.HOST_TRANSFERS` keeps one row per transfer: direction, bytes,
window and the time the core spent in its two ops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from tpudiag.model import schemas
from tpudiag.model.compiled import HOST_MEMORY_SPACE, ArrayShape, TupleShape, memory_spaces_in
from tpudiag.model.hlo_names import async_pair_key, pair_async
from tpudiag.model.intervals import union_length
from tpudiag.model.report import HostTransferRate
from tpudiag.parsers.layout import parse_shape


class Direction(StrEnum):
    TO_DEVICE = "host to HBM"  # prefetch: the array comes back from host memory
    TO_HOST = "HBM to host"  # offload


@dataclass(frozen=True)
class HostCopy:
    """One async copy op of one program that crosses the host link."""

    program_id: int
    name: str
    role: str  # "start" or "done"
    direction: Direction
    bytes: int  # the array's logical bytes
    dtype: str


_RESULT = re.compile(r"=\s*(?P<shape>.*?)\s+copy-(?:start|done)\(")
_OPERAND = re.compile(r"copy-done\(.*\)?\s*%(?P<start>[\w.\-]+)\)\s*(?:,|$)")


def _role(name: str, category: str) -> str:
    cat = category.lower()
    if cat in ("copy-start", "copy-done"):
        return cat.removeprefix("copy-")
    if name.startswith("copy-start"):
        return "start"
    if name.startswith("copy-done"):
        return "done"
    return ""


def _start_facts(text: str) -> tuple[Direction, int, str] | None:
    """Direction, bytes and dtype from a `copy-start`'s result tuple `(destination, source, context)`."""
    if HOST_MEMORY_SPACE not in memory_spaces_in(text):
        return None
    try:
        shape = parse_shape(text)
    except ValueError:
        return None
    if not isinstance(shape, TupleShape) or len(shape.elements) < 2:
        return None
    dest, src = shape.elements[0], shape.elements[1]
    if not (isinstance(dest, ArrayShape) and isinstance(src, ArrayShape)):
        return None
    if dest.memory_space == HOST_MEMORY_SPACE and src.memory_space != HOST_MEMORY_SPACE:
        return Direction.TO_HOST, dest.logical_bytes, dest.dtype
    if src.memory_space == HOST_MEMORY_SPACE and dest.memory_space != HOST_MEMORY_SPACE:
        return Direction.TO_DEVICE, dest.logical_bytes, dest.dtype
    return None


def host_copies(op_metadata: pd.DataFrame) -> dict[tuple[int, str], HostCopy]:
    """(program id, op name) -> `HostCopy`, for every async copy of `op_metadata` (one host's
    `schemas.OP_METADATA`) that moves an array between host memory and the device."""
    meta = op_metadata
    if meta.empty:
        return {}
    names = meta["name"].astype(str).to_numpy()
    cats = meta["category"].astype(str).to_numpy()
    roles = np.array([_role(n, c) for n, c in zip(names, cats)], dtype=object)
    if not (roles != "").any():
        return {}
    programs = meta["program_id"].to_numpy()
    shapes = meta["shape_with_layout"].fillna("").astype(str).to_numpy()
    texts = meta["hlo_text"].fillna("").astype(str).to_numpy()
    out: dict[tuple[int, str], HostCopy] = {}
    starts: dict[tuple[int, str], HostCopy] = {}
    for i in np.flatnonzero(roles == "start"):
        text = shapes[i]
        if not text and (m := _RESULT.search(texts[i])):
            text = m.group("shape")
        facts = _start_facts(text)
        if facts is not None:
            copy = HostCopy(int(programs[i]), names[i], "start", *facts)
            out[(copy.program_id, copy.name)] = copy
            starts[(copy.program_id, async_pair_key(copy.name) or copy.name)] = copy
    by_name = {(c.program_id, c.name): c for c in starts.values()}
    for i in np.flatnonzero(roles == "done"):
        program = int(programs[i])
        m = _OPERAND.search(texts[i])
        start = by_name.get((program, m.group("start"))) if m else None
        if start is None:
            start = starts.get((program, async_pair_key(names[i]) or names[i]))
        if start is not None:
            out[(program, names[i])] = HostCopy(program, names[i], "done", start.direction, start.bytes, start.dtype)
    return out


def host_copy_mask(events: pd.DataFrame, copies: dict[tuple[int, str], HostCopy]) -> np.ndarray:
    """Per event: True when it is one of `copies` (matched on program id and name)."""
    mask = np.zeros(len(events), dtype=bool)
    if not copies or not len(events):
        return mask
    wanted = {name for _, name in copies}
    categories = events["name"].cat.categories
    named = np.append(np.array([str(n) in wanted for n in categories], dtype=bool), False)
    idx = np.flatnonzero(named[events["name"].cat.codes.to_numpy()])
    if not len(idx):
        return mask
    programs = events["program_id"].to_numpy()[idx]
    names = categories[events["name"].cat.codes.to_numpy()[idx]]
    mask[idx] = [(int(p), str(n)) in copies for p, n in zip(programs, names)]
    return mask


def transfer_table(events: pd.DataFrame, copies: dict[tuple[int, str], HostCopy], host: str) -> pd.DataFrame:
    """`schemas.HOST_TRANSFERS` of one host's events (already labelled with their steps): one row
    per transfer, i.e. per `copy-done` event of a host copy, with its window from its `copy-start`."""
    mask = host_copy_mask(events, copies)
    if not mask.any():
        return schemas.HOST_TRANSFERS.empty()
    ev = events.loc[mask, ["device", "core", "program_id", "name", "start_ps", "dur_ps", "self_ps", "step"]]
    parts = []
    for core, g in ev.sort_values(["core", "start_ps"], kind="stable").groupby("core", sort=True):
        names = g["name"].astype(str).to_numpy()
        facts = [copies[(int(p), n)] for p, n in zip(g["program_id"].to_numpy(), names)]
        start = g["start_ps"].to_numpy()
        end = start + g["dur_ps"].to_numpy()
        self_ps = g["self_ps"].to_numpy()
        paired = {d: s for s, d in pair_async(list(names))}
        done = [i for i, f in enumerate(facts) if f.role == "done"]
        first = np.array([paired.get(i, i) for i in done], dtype=np.int64)  # a done without its start: itself
        done_idx = np.array(done, dtype=np.int64)
        parts.append(pd.DataFrame({
            "device": str(g["device"].iloc[0]), "core": int(core), "step": g["step"].to_numpy()[done_idx],
            "name": names[done_idx], "direction": [facts[i].direction.value for i in done],
            "dtype": [facts[i].dtype for i in done], "bytes": [facts[i].bytes for i in done],
            "start_ps": start[first], "end_ps": end[done_idx],
            "wait_ps": self_ps[done_idx] + np.where(first != done_idx, self_ps[first], 0)}))
    table = pd.concat(parts, ignore_index=True) if parts else schemas.HOST_TRANSFERS.empty()
    return schemas.HOST_TRANSFERS.of_host(table, host)


def transfer_rates(transfers: pd.DataFrame, steps: pd.DataFrame,
                   link_bytes_per_s: float | None) -> tuple[HostTransferRate, ...]:
    """Per direction, the mean per step and core of `schemas.HOST_TRANSFERS` (every host's), and
    the achieved bandwidth: each core's bytes over the union of its windows (concurrent copies
    share the link), averaged over the cores. Without steps the capture counts as one step."""
    if transfers.empty:
        return ()
    frame = pd.DataFrame({"host": transfers["host"].astype(str), "core": transfers["core"].to_numpy(),
                          "step": transfers["step"].to_numpy(), "direction": transfers["direction"].astype(str),
                          "name": transfers["name"].astype(str), "dtype": transfers["dtype"].astype(str),
                          "bytes": transfers["bytes"].to_numpy(np.float64),
                          "wait": transfers["wait_ps"].to_numpy(np.float64),
                          "start": transfers["start_ps"].to_numpy(), "end": transfers["end_ps"].to_numpy()})
    if steps.empty:
        n_steps = {key: 1 for key in frame.groupby(["host", "core"]).groups}
        inside = frame
    else:
        n_steps = steps.assign(host=steps["host"].astype(str)).groupby(["host", "core"])["step"].nunique().to_dict()
        inside = frame[frame["step"] >= 0]
    out = []
    for direction in (d.value for d in Direction):
        mine = frame[frame["direction"] == direction]
        if mine.empty:
            continue
        per_core, rates = [], []
        for (host, core), g in inside[inside["direction"] == direction].groupby(["host", "core"]):
            n = n_steps.get((host, core), 0)
            if n:
                per_core.append((len(g) / n, g["bytes"].sum() / n, g["wait"].sum() / n))
        for _, g in mine.groupby(["host", "core"]):
            window = union_length(g["start"].to_numpy(np.int64), g["end"].to_numpy(np.int64))
            if window > 0:
                rates.append(g["bytes"].sum() / (window / 1e12))
        means = np.array(per_core).mean(axis=0) if per_core else np.zeros(3)
        achieved = float(np.mean(rates)) if rates else None
        above = achieved is not None and link_bytes_per_s is not None and achieved > link_bytes_per_s
        waits = mine.groupby("name")["wait"].sum().sort_values(ascending=False, kind="stable")
        out.append(HostTransferRate(
            direction=direction, ops=tuple(str(n) for n in waits.index), transfers_per_step=float(means[0]),
            bytes_per_step=float(means[1]), wait_ps=float(means[2]),
            achieved_bytes_per_s=None if above else achieved, link_bytes_per_s=link_bytes_per_s,
            dtypes=tuple(sorted(set(mine["dtype"]))), above_link=above))
    return tuple(out)
