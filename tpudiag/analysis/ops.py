"""Per-op aggregates (per host, program and op), with XProf's rate and bound-by semantics.

XProf (`xprof/convert/op_metrics_to_record.h`): FLOP rate = total FLOPs / total (not self) time;
bytes and FLOPs are per occurrence times occurrences; totals are summed over cores (core-seconds);
`bound_by` is the argmax of the measured utilizations, `Unknown` when all are zero. tpudiag differs
where XProf's answer is not a fact (docs/xprof-differences.md):

- a rate above the core's peak (`analysis.limits`) is no rate: it is NaN here, so no table, cell or
  JSON value shows it, and the report warns once;
- a collective is bound by `collective`, with the bytes each device sends over ICI (its payload and
  ring algorithm, `model.collectives`) over the time the transfer took (the async window for a
  start/done pair) and their share of the chip's ICI peak;
- an op with no measured utilization (no FLOPs, no bytes) reaches no roof: `latency`, never
  `Unknown`;
- the roofline has a level per memory (issue 27 §2): compute (FLOPs over the peak), HBM (its HBM
  bytes; for an op whose operands async copies brought into VMEM, those bytes too) and VMEM (bytes of
  operands and results in VMEM, `S(1)`, modelled from the layouts, over the read and write peaks the
  trace or the chip's table gives, `DeviceInfo.vmem`). The level with the largest utilization binds:
  the one whose roof is lowest at the op's intensity there. An op with no bytes at a level has no
  utilization or intensity there; without a VMEM peak there is no VMEM level, and VMEM's modelled
  bytes decide only from 10 % of its peak (`VMEM_BINDS_AT`; XProf, with VMEM bytes the hardware
  counted, takes any share).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from enum import StrEnum

from tpudiag.analysis.custom_calls import with_derived_costs
from tpudiag.analysis.limits import above_peak
from tpudiag.analysis.op_bytes import COLUMNS as BYTE_COLUMNS
from tpudiag.analysis.op_bytes import op_bytes
from tpudiag.model import schemas
from tpudiag.model.collectives import Traffic, latency_bound, traffic
from tpudiag.model.grouping import factorize_runs, first_appearance_groups, group_sums, sums_by_group
from tpudiag.model.hlo_names import async_pair_key, async_role, collective_family
from tpudiag.model.profile import HostTrace, Platform
from tpudiag.parsers.device_trace import NON_XLA_KERNEL
from tpudiag.parsers.hlo_proto import tuple_elements

PS_PER_S = 1e12
VMEM_BINDS_AT = 0.1  # share of the VMEM peak below which VMEM does not decide bound_by
_KEYS = ["program_id", "name"]


class BoundBy(StrEnum):
    """What binds an op; the value is what every output prints."""

    COMPUTE = "Compute"  # FLOP utilization is the larger (XProf's spelling)
    HBM = "HBM"  # HBM bandwidth utilization is the larger
    VMEM = "VMEM"  # VMEM bandwidth utilization (read or write) is the largest
    COLLECTIVE = "collective"  # a collective: judged by its ICI bandwidth, not by a roof of the core
    HOST_LINK = "host link"  # an async copy to or from host memory (`S(5)`): the host link binds it
    LATENCY = "latency"  # no measured utilization: it reaches no roof
    NO_COST_DATA = "no cost data"  # a GPU kernel no HLO op launched, or one the cost analysis gave no FLOPs or bytes
    NO_PEAK = "no peak known"  # FLOPs or bytes recorded, but the device's peak for them is not known (a CPU)


class BoundBasis(StrEnum):
    """How `bound_by` was decided; the value is what the JSON says."""

    UTILIZATION = "utilization"  # the larger measured utilization, as XProf
    COPIED_BYTES = "intensity with copied bytes"  # FLOPs over its own HBM bytes plus what its copies brought
    VMEM_BYTES = "VMEM bytes from the layouts"  # VMEM's utilization, of bytes modelled from the layouts, is the largest
    MEMORY_SPACE = "memory space"  # collectives and host copies: what they move over
    NONE = "none"  # no utilization: latency, no cost data, or no peak known


def aggregate_ops(host: HostTrace) -> pd.DataFrame:
    """The ops table of one host."""
    ev = host.events
    if ev.empty:
        return schemas.OPS.empty()
    grouped = _per_op(ev)
    # Custom calls (Pallas kernels) carry no FLOPs in the trace: derive them where the HLO tells.
    meta, _ = with_derived_costs(host.op_metadata)
    meta = meta.copy()
    meta["name"] = meta["name"].astype(str)
    meta = meta.drop(columns=["host"])
    df = grouped.merge(meta, on=_KEYS, how="left", validate="one_to_one")
    occ = df["occurrences"].to_numpy(dtype=np.float64)
    total_s = df["total_time_ps"].to_numpy(dtype=np.float64) / PS_PER_S
    flops = df["flops"].fillna(0.0).to_numpy() * occ
    bytes_accessed = df["bytes_accessed"].fillna(0.0).to_numpy() * occ
    hbm = df["hbm_bytes"].fillna(0.0).to_numpy() * occ
    peak_flops = host.device.peak_flops_per_s
    peak_hbm = host.device.hbm_bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        flop_rate = np.where(total_s > 0, flops / total_s, 0.0)
        hbm_bw = np.where(total_s > 0, hbm / total_s, 0.0)
        intensity = np.where(bytes_accessed > 0, flops / bytes_accessed, np.nan)
    flop_util = flop_rate / peak_flops if peak_flops else np.full(len(df), np.nan)
    hbm_util = hbm_bw / peak_hbm if peak_hbm else np.full(len(df), np.nan)
    names = df["name"].to_numpy(dtype=object)
    cats = df["category"].fillna("").astype(str).to_numpy(dtype=object)
    family = np.array([collective_family(n, c) for n, c in zip(names, cats)], dtype=object)
    # The roof an op is at is the larger utilization as counted (XProf's argmax), one above the peak
    # included: the op reached that roof as the trace counts it.
    f, h = np.nan_to_num(flop_util), np.nan_to_num(hbm_util)
    # A rate above the peak is an artefact (`analysis.limits` warns): it is no rate.
    for rate, util, peak in ((flop_rate, flop_util, peak_flops), (hbm_bw, hbm_util, peak_hbm)):
        over = above_peak(rate, peak)
        rate[over] = np.nan
        util[over] = np.nan
    ici = _ici(host, df, family, occ)
    spaces = _spaces(meta, df, occ, host.hlo_protos)
    with np.errstate(divide="ignore", invalid="ignore"):
        roof_bytes = hbm + spaces["copied_hbm_bytes"]
        hbm_intensity = np.where((roof_bytes > 0) & (flops > 0), flops / roof_bytes, np.nan)
    # (an async copy's or slice's start moves its bytes over its window: not judged on its own time)
    copied = (family == "") & (spaces["copied_hbm_bytes"] > 0) & (spaces["moves"] == "") & bool(peak_hbm)
    if peak_hbm:
        # The HBM level of an op its copies fed counts what they brought (the roof it would reach
        # had it read them itself); with FLOPs, that is its FLOP/B against the ridge.
        with np.errstate(divide="ignore", invalid="ignore"):
            h = np.where(copied, np.where(total_s > 0, roof_bytes / total_s, 0.0) / peak_hbm, h)
    vmem = _vmem_level(host, spaces, flops, total_s)
    # VMEM's bytes are modelled (each array in VMEM read or written once): they bind an op only at
    # a real share of the peak, not at the fractions of a percent most small fusions reach.
    # An async copy's or slice's start moves its bytes over the window, not in its own time.
    v = np.where((vmem["vmem_raw_utilization"] >= VMEM_BINDS_AT) & (spaces["moves"] == ""),
                 vmem["vmem_raw_utilization"], 0.0)
    bound_by = np.where(family != "", BoundBy.COLLECTIVE.value,
                        np.where(f + h + v <= 0, BoundBy.LATENCY.value,
                                 np.where((f >= h) & (f >= v), BoundBy.COMPUTE.value,
                                          np.where(h >= v, BoundBy.HBM.value, BoundBy.VMEM.value))))
    basis = np.where(family != "", BoundBasis.MEMORY_SPACE.value,
                     np.where(bound_by == BoundBy.LATENCY.value, BoundBasis.NONE.value,
                              np.where(bound_by == BoundBy.VMEM.value, BoundBasis.VMEM_BYTES.value,
                                       np.where(copied, BoundBasis.COPIED_BYTES.value,
                                                BoundBasis.UTILIZATION.value))))
    host_copy = _host_copies(df, spaces["moves"])
    bound_by = np.where(host_copy, BoundBy.HOST_LINK.value, bound_by)
    basis = np.where(host_copy, BoundBasis.MEMORY_SPACE.value, basis)
    # A kernel no HLO op launched (TensorFlow's, a library's) has no cost analysis: its zero FLOPs
    # and bytes are unknowns, not measurements, so it has no rate and nothing decides what binds it.
    # Likewise a GPU op with neither FLOPs nor bytes: every GPU kernel touches memory, so zero is a
    # custom call the cost analysis does not cost (Transformer Engine's attention, a `__cublas$gemm`),
    # not an op that reached no roof.
    uncosted = (host.device.platform is Platform.GPU) & (flops <= 0) & (bytes_accessed <= 0) & (hbm <= 0)
    no_cost = ((cats == NON_XLA_KERNEL) | uncosted) & (family == "")
    for column in (flop_rate, hbm_bw, flop_util, hbm_util):
        column[no_cost] = np.nan
    bound_by = np.where(no_cost, BoundBy.NO_COST_DATA.value, bound_by)
    basis = np.where(no_cost, BoundBasis.NONE.value, basis)
    # FLOPs or bytes with no peak to hold them against (XLA's CPU runtime records no peaks): nothing
    # decides what binds the op, and "latency" would say a 2.7 ms matmul reaches no roof. (Its basis
    # is already `none`, a latency op's.)
    no_peak = ((bound_by == BoundBy.LATENCY.value)
               & (((flops > 0) & (not peak_flops)) | ((roof_bytes > 0) & (not peak_hbm))))
    bound_by = np.where(no_peak, BoundBy.NO_PEAK.value, bound_by)
    return schemas.OPS.frame({
        "host": np.full(len(df), host.host, dtype=object),
        "program_id": df["program_id"].to_numpy(dtype=np.uint64),
        "module": df["module"].astype(str).to_numpy(dtype=object),
        "name": names,
        "category": cats,
        "occurrences": df["occurrences"].to_numpy(dtype=np.int64),
        "total_time_ps": df["total_time_ps"].to_numpy(dtype=np.int64),
        "self_time_ps": df["self_time_ps"].to_numpy(dtype=np.int64),
        "flops": flops,
        "bytes_accessed": bytes_accessed,
        "hbm_bytes": hbm,
        "flop_rate": flop_rate,
        "hbm_bw": hbm_bw,
        "operational_intensity": intensity,
        "flop_utilization": flop_util,
        "hbm_utilization": hbm_util,
        "bound_by": bound_by,
        "family": family,
        "shape_with_layout": df["shape_with_layout"].fillna("").to_numpy(dtype=object),
        "source": df["source"].fillna("").to_numpy(dtype=object),
        "tf_op": df["tf_op"].fillna("").to_numpy(dtype=object),
        **ici,
        **spaces,
        "hbm_intensity": hbm_intensity,
        "vmem_utilization": vmem["vmem_utilization"],
        "vmem_intensity": vmem["vmem_intensity"],
        "bound_basis": basis,
    })


def _vmem_level(host: HostTrace, spaces: dict[str, np.ndarray], flops: np.ndarray,
                total_s: np.ndarray) -> dict[str, np.ndarray]:
    """The VMEM level of the roofline: per op, the larger of its read and write utilizations
    (bytes in VMEM over the op's time, over the peak of that direction), and its FLOPs per VMEM
    byte in that direction. `vmem_raw_utilization` (0 where none) decides bound_by, one above the
    peak included, as for the other levels; the `vmem_utilization` column is NaN there (bytes
    modelled from the layouts that would cross faster than the peak are no rate) and without a peak."""
    n = len(flops)
    peak = host.device.vmem
    nan = np.full(n, np.nan)
    if peak is None or not peak.read_bytes_per_s or not peak.write_bytes_per_s:
        return {"vmem_raw_utilization": np.zeros(n), "vmem_utilization": nan, "vmem_intensity": nan}
    read, write = spaces["vmem_read_bytes"], spaces["vmem_write_bytes"]
    with np.errstate(divide="ignore", invalid="ignore"):
        util_read = np.where(total_s > 0, read / total_s, 0.0) / peak.read_bytes_per_s
        util_write = np.where(total_s > 0, write / total_s, 0.0) / peak.write_bytes_per_s
        binding = np.where(util_write > util_read, write, read)
        intensity = np.where((binding > 0) & (flops > 0), flops / binding, np.nan)
    raw = np.maximum(util_read, util_write)
    return {"vmem_raw_utilization": raw, "vmem_utilization": np.where((raw > 0) & (raw <= 1), raw, np.nan),
            "vmem_intensity": intensity}


def _per_op(ev: pd.DataFrame) -> pd.DataFrame:
    """Occurrences, total and self time and the module per (program, op), in order of first
    appearance (pandas' `groupby(sort=False)`), from integer codes: millions of events on a host."""
    name = ev["name"].cat.codes.to_numpy()
    module = ev["module"].cat.codes.to_numpy()
    if (name < 0).any() or (module < 0).any():  # a missing name or module: pandas' rules for them
        grouped = (ev.groupby(_KEYS, observed=True, sort=False)
                   .agg(occurrences=("dur_ps", "size"), total_time_ps=("dur_ps", "sum"),
                        self_time_ps=("self_ps", "sum"), module=("module", "first"))
                   .reset_index())
        grouped["name"] = grouped["name"].astype(str)
        return grouped
    program, programs = factorize_runs(ev["program_id"].to_numpy())
    group, first = first_appearance_groups([program, name])
    n = len(first)
    names = np.asarray(ev["name"].cat.categories.astype(str), dtype=object)
    return pd.DataFrame({
        "program_id": programs[program[first]], "name": names[name[first]],
        "occurrences": np.bincount(group, minlength=n).astype(np.int64),
        "total_time_ps": sums_by_group(group, n, ev["dur_ps"].to_numpy()),
        "self_time_ps": sums_by_group(group, n, ev["self_ps"].to_numpy()),
        "module": pd.Categorical.from_codes(module[first], dtype=ev["module"].dtype)})


def _spaces(meta: pd.DataFrame, df: pd.DataFrame, occ: np.ndarray,
            protos: dict[int, bytes]) -> dict[str, np.ndarray]:
    """The OPS columns of bytes by memory space (`analysis.op_bytes`), totals over occurrences;
    `protos`, the programs the capture embeds, give the tuple elements the trace does not record."""
    per = op_bytes(meta, lambda pid: tuple_elements(protos[pid]) if pid in protos else {})
    merged = df[_KEYS].merge(per, on=_KEYS, how="left")
    out: dict[str, np.ndarray] = {c: merged[c].fillna(0.0).to_numpy(dtype=np.float64) * occ for c in BYTE_COLUMNS}
    out["moves"] = merged["moves"].fillna("").astype(str).to_numpy(dtype=object)
    return out


def _host_copies(df: pd.DataFrame, moves: np.ndarray) -> np.ndarray:
    """Rows of async copies (start and done) that move to or from host memory."""
    names = df["name"].astype(str).to_numpy(dtype=object)
    programs = df["program_id"].to_numpy()
    host = np.array(["host" in m for m in moves], dtype=bool)
    keys = {(programs[i], async_pair_key(names[i])) for i in np.flatnonzero(host)}
    if not keys:
        return host
    return host | np.array([(p, async_pair_key(n)) in keys for p, n in zip(programs, names)], dtype=bool)


def _ici(host: HostTrace, df: pd.DataFrame, family: np.ndarray, occ: np.ndarray) -> dict[str, np.ndarray]:
    """The OPS columns of a collective's ICI traffic (`group_size` .. `ici_utilization`); zeros and
    NaN for other ops. Bytes per device are modelled from its HLO text (`model.collectives.traffic`);
    an async done takes its start's figures. The time is the async window of a start/done pair
    (both rows get it), else the op's own total time."""
    n = len(df)
    group = np.zeros(n, dtype=np.int64)
    source = np.full(n, "", dtype=object)
    ici_bytes = np.zeros(n)
    ici_time = df["total_time_ps"].to_numpy(dtype=np.int64).copy()
    windows = _window_time(host.async_windows)
    texts = df["hlo_text"].fillna("").astype(str).to_numpy(dtype=object)
    shapes = df["shape_with_layout"].fillna("").astype(str).to_numpy(dtype=object)
    names = df["name"].astype(str).to_numpy(dtype=object)
    programs = df["program_id"].to_numpy()
    found: dict[tuple[int, str], Traffic] = {}
    rows = np.flatnonzero(family != "")
    for i in rows:
        found[(programs[i], names[i])] = traffic(str(family[i]), texts[i], shapes[i], host.device.n_chips)
    starts = {(p, async_pair_key(nm)): t for (p, nm), t in found.items()
              if (async_role(nm) or ("",))[0] == "start"}
    for i in rows:
        key = async_pair_key(names[i])
        t = found[(programs[i], names[i])]
        if key is not None and (async_role(names[i]) or ("",))[0] == "done":
            t = starts.get((programs[i], key), t)
        group[i], source[i], ici_bytes[i] = t.group_size, t.group_source.value, t.bytes_per_device * occ[i]
        if key is not None and key in windows:
            ici_time[i] = windows[key]
    peak = host.device.chip.ici_bytes_per_s if host.device.chip is not None else None
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where((ici_time > 0) & (ici_bytes > 0), ici_bytes / (ici_time / PS_PER_S), np.nan)
    bw = np.where(above_peak(bw, peak), np.nan, bw)
    occurrences = np.maximum(occ, 1)
    latency = np.array([bool(family[i]) and latency_bound(ici_bytes[i] / occurrences[i], ici_time[i] / occurrences[i],
                                                          peak) for i in range(n)], dtype=bool)
    return {"group_size": group, "group_source": source, "ici_bytes": ici_bytes, "ici_time_ps": ici_time,
            "ici_bw": bw, "ici_utilization": bw / peak if peak else np.full(n, np.nan), "ici_latency_bound": latency}


def _window_time(windows: pd.DataFrame) -> dict[str, int]:
    """Async pair key -> summed window time (start to done) over the host's windows."""
    if windows is None or windows.empty:
        return {}
    # One key per distinct name (a host has ~100 k windows of a few hundred names), summed by code.
    names = windows["name"]
    names = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype(str).astype("category")
    codes = names.cat.codes.to_numpy()
    spans = (windows["end_ps"].to_numpy(dtype=np.int64) - windows["start_ps"].to_numpy(dtype=np.int64))
    named = codes >= 0
    (seen,), sums = group_sums([codes[named].astype(np.int64)], spans[named])
    out: dict[str, int] = {}
    for code, total in zip(seen.tolist(), sums.tolist()):
        key = async_pair_key(str(names.cat.categories[code]))
        if key is not None:
            out[key] = out.get(key, 0) + total
    return out
