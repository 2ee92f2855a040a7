"""Per-op aggregates (per host, program and op), with XProf's rate and bound-by semantics.

XProf (`xprof/convert/op_metrics_to_record.h`): FLOP rate = total FLOPs / total (not self) time;
bytes and FLOPs are per occurrence times occurrences; totals are summed over cores (core-seconds);
`bound_by` is the argmax of the measured utilizations, `Unknown` when all are zero.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.analysis.custom_calls import with_derived_costs
from tpudiag.model import schemas
from tpudiag.model.hlo_names import collective_family
from tpudiag.model.profile import HostTrace

PS_PER_S = 1e12
_KEYS = ["program_id", "name"]


def aggregate_ops(host: HostTrace) -> pd.DataFrame:
    """The ops table of one host."""
    ev = host.events
    if ev.empty:
        return schemas.OPS.empty()
    grouped = (ev.groupby(_KEYS, observed=True, sort=False)
               .agg(occurrences=("dur_ps", "size"), total_time_ps=("dur_ps", "sum"), self_time_ps=("self_ps", "sum"),
                    module=("module", "first"))
               .reset_index())
    grouped["name"] = grouped["name"].astype(str)
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
    with np.errstate(divide="ignore", invalid="ignore"):
        flop_rate = np.where(total_s > 0, flops / total_s, 0.0)
        hbm_bw = np.where(total_s > 0, hbm / total_s, 0.0)
        intensity = np.where(bytes_accessed > 0, flops / bytes_accessed, np.nan)
    peak_flops = host.device.peak_flops_per_s
    peak_hbm = host.device.hbm_bytes_per_s
    flop_util = flop_rate / peak_flops if peak_flops else np.full(len(df), np.nan)
    hbm_util = hbm_bw / peak_hbm if peak_hbm else np.full(len(df), np.nan)
    bound_by = np.where(
        np.nan_to_num(flop_util) + np.nan_to_num(hbm_util) <= 0, "Unknown",
        np.where(np.nan_to_num(flop_util) >= np.nan_to_num(hbm_util), "Compute", "HBM"))
    names = df["name"].to_numpy(dtype=object)
    cats = df["category"].fillna("").astype(str).to_numpy(dtype=object)
    family = [collective_family(n, c) for n, c in zip(names, cats)]
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
        "family": np.array(family, dtype=object),
        "shape_with_layout": df["shape_with_layout"].fillna("").to_numpy(dtype=object),
        "source": df["source"].fillna("").to_numpy(dtype=object),
        "tf_op": df["tf_op"].fillna("").to_numpy(dtype=object),
    })
