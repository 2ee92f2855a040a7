"""FLOPs and bytes for custom calls (Pallas kernels and others) that the trace gives none for.

XProf takes custom calls' costs from the trace as they are, and a Pallas kernel's are 0, so its
FLOP rate cannot be judged. Two sources, tried in order, each named in the `source` column:
- `cost_estimate`: the kernel's declared `pl.CostEstimate`, which JAX writes into the custom
  call's `backend_config` (`"cost_estimate": {"flops": ..., "bytes_accessed": ...}`);
- `matmul shapes`: a custom call with two operands `[B,]M,K x [B,]K,N` and an `[B,]M,N` result
  (either operand may be transposed) is taken as a matmul: 2·B·M·N·K FLOPs, operands + result bytes
  (`tpudiag.model.matmuls`, the one model of an op's math).
The LLO bundles' MXU instruction counts are static (no trip counts), so they are not used here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tpudiag.model.hlo_shapes import operand_shapes, result_shapes, shape_bytes
from tpudiag.model.matmuls import cost_estimate, matmul_from_shapes


def is_custom_call(category: str, hlo_text: str) -> bool:
    return "custom-call" in category.lower() or " custom-call(" in hlo_text


def matmul_cost(hlo_text: str) -> tuple[float, float] | None:
    """(flops, bytes) when the custom call's shapes compose as a matmul (`model.matmuls`), else None."""
    if not hlo_text or "custom-call(" not in hlo_text:
        return None
    results, operands = result_shapes(hlo_text), operand_shapes(hlo_text)
    if len(results) != 1 or len(operands) != 2:
        return None
    found = matmul_from_shapes(results[0].dims, operands[0].dims, operands[1].dims)
    if found is None:
        return None
    batch, m, n, k = found
    size = sum(shape_bytes(s) for s in (*results, *operands))
    return 2.0 * math.prod(batch) * m * n * k, float(size)


def derive_costs(meta: pd.DataFrame) -> pd.DataFrame:
    """(name, flops, bytes_accessed, source) per custom call in `meta` (op metadata) whose FLOPs are 0."""
    rows = []
    for name, category, flops, text in zip(meta["name"].astype(str), meta["category"].astype(str),
                                           meta["flops"].to_numpy(), meta["hlo_text"].astype(str)):
        if flops > 0 or not is_custom_call(category, text):
            continue
        for source, fn in (("cost_estimate", cost_estimate), ("matmul shapes", matmul_cost)):
            cost = fn(text)
            if cost is not None and cost[0] > 0:
                rows.append((name, cost[0], cost[1], source))
                break
    return pd.DataFrame(rows, columns=["name", "flops", "bytes_accessed", "source"])


def with_derived_costs(meta: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(op metadata with derived FLOPs and bytes filled in, the derived rows)."""
    derived = derive_costs(meta)
    if derived.empty:
        return meta, derived
    meta = meta.copy()
    idx = pd.Index(meta["name"].astype(str))
    for r in derived.itertuples(index=False):
        at = np.flatnonzero(idx == r.name)
        meta.loc[meta.index[at], "flops"] = r.flops
        meta.loc[meta.index[at], "model_flops"] = r.flops
        if r.bytes_accessed > 0 and (meta.loc[meta.index[at], "bytes_accessed"] <= 0).all():
            meta.loc[meta.index[at], "bytes_accessed"] = r.bytes_accessed
            meta.loc[meta.index[at], "hbm_bytes"] = r.bytes_accessed
    return meta, derived
