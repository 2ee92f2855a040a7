"""Matmul and convolution fusions that dominate time at a low fraction of peak FLOP/s.

What it does
------------
Compares each matmul or convolution op's achieved FLOP rate (FLOPs over its total time, as
XProf computes it) with the per-core peak, and flags the ops that take a large share of device
time at low utilization. Ops are matmul-like when their category contains "convolution" or
"dot", or their name contains `convolution`, `dot`, `matmul` or `einsum`. Where the trace can
tell, it says why: the op is memory-bound (operational intensity below the ridge point), its
dimensions are not multiples of the MXU size (128 on v4/v5e/v5p, 256 on v6e/TPU7x), its batch
(rows) is small, or it multiplies f32 operands.

Why it matters
--------------
Matmuls are where a TPU's FLOPs are; a dominant matmul at 20 % of peak leaves most of the chip
idle. Each reason has a different fix, and a memory-bound matmul will not speed up by retiling.

Evidence
--------
Per op: share of device time, achieved FLOP/s and utilization, operational intensity against the
ridge point, the shapes parsed from `shape_with_layout` and the op's HLO text, and the reasons.
With LLO dumps (`--dumps DIR`), the compiler's static MXU busy fraction for the op: when it is
low too, the compiled tiling, not the runtime, keeps the MXUs idle.

How to fix
----------
Misaligned dims: pad them to the MXU multiple (a 1000-wide layer to 1024). Small batch: raise
the per-core batch or fuse more tokens per call. f32 operands: cast to bf16 and keep f32
accumulation with `preferred_element_type=jnp.float32`. Memory-bound: raise the operational
intensity (fuse the producer, reuse weights across more rows). Otherwise inspect the fusion's
tiling in the compiler dump.

Bad: `bf16[8,1000] dot bf16[1000,1000]` at 3 % of peak.
Good: `bf16[1024,1024] dot bf16[1024,1024]` at 60 % of peak.

Savings estimate
----------------
Modelled: self time per step x (1 - utilization / attainable target), where the attainable
target is `target_utilization` x min(1, operational intensity / ridge point) (the roofline);
for a compute-bound op that is self time x (1 - util / target). Per step, on the core where the
op takes longest. An upper bound that overlaps with padding-waste for padded matmuls.

Known limits
------------
Memory-bound matmuls already at their roofline target get an info finding that refers them to
`memory-bound`, which models the byte savings. Custom calls (Pallas kernels) without FLOPs in
the trace are judged with FLOPs from the kernel's declared `cost_estimate` or, for a two-operand
matmul, from its shapes (the finding says which). Other ops without FLOPs in the trace cannot be
judged and are left out; a trace with no FLOPs at all, or without a peak FLOP/s, skips the rule.
Dimensions come from the result shape and the operand shapes in the HLO text; which operand
dim is contracting is not known, so every minor dim of every operand is checked. A `dot` inside
a loop fusion is not recognised unless the category or name says so.

Options
-------
- `low_utilization` (0.5): flag ops whose FLOP utilization is below this (XProf's smart
  suggestions call MXU utilization low below 50 %).
- `target_utilization` (0.7): utilization a well-shaped matmul reaches (XProf: high above 70 %);
  savings are measured against it.
- `min_time_share` (0.02): ignore ops taking less than this share of device time.
- `max_findings` (5): report at most this many ops, largest saving first.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.custom_calls import derive_costs
from tpudiag.model.findings import Evidence, Finding, Saving, Severity
from tpudiag.model.hlo_shapes import Shape, operand_shapes, parse_shapes
from tpudiag.model.units import fmt_pct
from tpudiag.rules.base import Rule, RuleContext, SeverityScale, op_events, per_step_worst_core, step_basis

CODE = "TPD102"
NAME = "low-mxu-utilization"

_MATMUL_NAME = re.compile(r"convolution|\bdot\b|dot[._]|matmul|einsum")


@dataclass(frozen=True)
class Options:
    low_utilization: float = 0.5
    target_utilization: float = 0.7
    min_time_share: float = 0.02
    max_findings: int = 5
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        if not 0.0 < self.low_utilization <= 1.0:
            raise ValueError(f"low_utilization must be in (0, 1], got {self.low_utilization}")
        if not 0.0 < self.target_utilization <= 1.0:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.max_findings < 1:
            raise ValueError(f"max_findings must be at least 1, got {self.max_findings}")


def is_matmul(name: str, category: str) -> bool:
    cat = category.lower()
    return "convolution" in cat or "dot" in cat.split() or bool(_MATMUL_NAME.search(name))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def diagnose(result: list[Shape], operands: list[Shape], mxu: int, intensity: float | None,
             ridge: float | None) -> tuple[list[str], list[str]]:
    """(reasons, fixes) for a slow matmul, from its shapes and roofline position."""
    reasons, fixes = [], []
    if intensity is not None and ridge and intensity < ridge:
        reasons.append(f"memory-bound (operational intensity {intensity:.0f} FLOP/B < ridge {ridge:.0f})")
        fixes.append(f"raise operational intensity above {ridge:.0f} FLOP/B (fuse the producer, reuse weights "
                     "across more rows)")
    out = result[0] if result else None
    rows = math.prod(out.dims[:-1]) if out is not None and len(out.dims) >= 2 else None
    if rows is not None and rows < mxu:
        reasons.append(f"small batch (M = {rows} rows < MXU {mxu})")
        fixes.append(f"raise the per-core batch toward {mxu} rows")
    minor: list[int] = []
    if out is not None and out.dims:
        minor.append(out.dims[-1])
    for s in operands:
        minor.extend(s.dims[-2:])
    skip_rows = {rows} if rows is not None and rows < mxu else set()
    bad = sorted({d for d in minor if d % mxu and d > 1 and d not in skip_rows})
    if bad:
        pairs = ", ".join(f"{d}→{_round_up(d, mxu)}" for d in bad[:4])
        reasons.append(f"dims not multiples of {mxu}: {', '.join(map(str, bad[:4]))}")
        fixes.append(f"pad dims to multiples of {mxu} ({pairs})")
    if operands:
        f32_operands = [s for s in operands if s.dtype == "f32" and len(s.dims) >= 2]
        if f32_operands and len(f32_operands) >= min(2, len([s for s in operands if len(s.dims) >= 2])):
            reasons.append("f32 operands (bf16 runs at full MXU rate)")
            fixes.append("cast operands to bf16 with `preferred_element_type=jnp.float32`")
    elif out is not None and out.dtype == "f32":
        reasons.append("f32 result (operands not recorded; f32 matmuls run below the bf16 peak)")
        fixes.append("use bf16 operands with `preferred_element_type=jnp.float32` if precision allows")
    return reasons, fixes


def static_mxu_busy(dumps) -> dict[str, float]:
    """Op name -> the compiler's static MXU busy fraction, from LLO dumps' per-op tables (`ops`)."""
    out: dict[str, float] = {}
    for dump in dumps:
        table = dump.ops
        if "mxu_busy_fraction" not in table.columns:
            continue
        for name, value in zip(table["name"].astype(str), table["mxu_busy_fraction"]):
            if pd.notna(value):
                out[name] = float(value)
    return out


def llo_dumps(ctx: RuleContext) -> tuple:
    """The LLO dumps this rule reads (the one place it reaches compiled inputs)."""
    return ctx.compiled.llo


def derived_sources(analysis) -> dict[str, str]:
    """Custom calls whose FLOPs the analysis derived (the trace gives none), with where they came from."""
    meta = pd.concat([h.op_metadata for h in analysis.profile.hosts], ignore_index=True)
    derived = derive_costs(meta)
    return dict(zip(derived["name"], derived["source"]))


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    ops = analysis.ops
    if ops.empty:
        return []
    basis = step_basis(analysis)
    scale = SeverityScale(options.high_share, options.medium_share)
    device = analysis.profile.hosts[0].device
    peak = device.peak_flops_per_s
    ridge = device.ridge_flops_per_byte
    mxu = device.chip.mxu_dim if device.chip else 128
    if not peak:
        return []
    total_core_ps = sum(analysis.core_time_ps.values())
    cats = ops["category"].astype(str)
    names = ops["name"].astype(str)
    derived = derived_sources(analysis)
    mask = np.array([is_matmul(n, c) or n in derived for n, c in zip(names, cats)], dtype=bool) & (
        ops["flops"].to_numpy() > 0)
    cand = ops[mask]
    if cand.empty:
        return []
    grouped = (cand.assign(name=cand["name"].astype(str), module=cand["module"].astype(str),
                           category=cand["category"].astype(str))
               .groupby(["module", "name"], sort=False)
               .agg(category=("category", "first"), flops=("flops", "sum"), bytes_accessed=("bytes_accessed", "sum"),
                    total_time_ps=("total_time_ps", "sum"), self_time_ps=("self_time_ps", "sum"),
                    occurrences=("occurrences", "sum"), shape=("shape_with_layout", "first"))
               .reset_index())
    meta = pd.concat([h.op_metadata.assign(name=h.op_metadata["name"].astype(str)) for h in analysis.profile.hosts],
                     ignore_index=True)
    hlo_text = dict(zip(meta["name"], meta["hlo_text"].astype(str)))
    events = op_events(analysis, grouped["name"])
    static_busy = static_mxu_busy(llo_dumps(ctx))
    candidates = []
    referred = []  # memory-bound matmuls already at their roofline target: memory-bound judges them
    for r in grouped.itertuples(index=False):
        total_s = r.total_time_ps / 1e12
        util = (r.flops / total_s) / peak if total_s > 0 else 0.0
        share = r.self_time_ps / total_core_ps if total_core_ps else 0.0
        if util >= options.low_utilization or share < options.min_time_share:
            continue
        intensity = r.flops / r.bytes_accessed if r.bytes_accessed > 0 else None
        attainable = min(1.0, intensity / ridge) if intensity is not None and ridge else 1.0
        target = options.target_utilization * attainable
        fraction = max(0.0, 1.0 - util / target) if target > 0 else 0.0
        if fraction <= 0:
            if intensity is not None and ridge and intensity < ridge:
                referred.append((r, util, share, intensity))
            continue
        self_per_step = per_step_worst_core(events[events["name"] == r.name], "self_ps", basis)
        saving = self_per_step * fraction
        result = parse_shapes(r.shape)
        operands = operand_shapes(hlo_text.get(r.name, ""))
        reasons, fixes = diagnose(result, operands, mxu, intensity, ridge)
        if r.name in derived:
            reasons.append("custom call: FLOPs from " + ("its declared cost_estimate" if derived[r.name] ==
                                                         "cost_estimate" else "its operand and result shapes"))
        busy = static_busy.get(r.name)
        if busy is not None and busy < options.low_utilization:
            reasons.append(f"the compiled code keeps the MXUs busy in only {fmt_pct(busy)} of its bundles "
                           "(static LLO)")
        candidates.append((saving, r, util, share, intensity, target, reasons, fixes, result, operands))
    candidates.sort(key=lambda c: (-c[0], c[1].name))
    findings = []
    for saving, r, util, share, intensity, target, reasons, fixes, result, operands in candidates[:options.max_findings]:
        step_share = saving / basis.step_ps if basis.step_ps else 0.0
        why = "; ".join(reasons) if reasons else "no cause visible in the trace"
        message = (f"`{r.name}` ({r.category}) runs at {fmt_pct(util)} of peak FLOP/s for {fmt_pct(share)} of "
                   f"device time: {why}")
        fix = "; ".join(fixes) if fixes else "inspect the fusion's tiling in the compiler dump (`--xla_dump_to`)"
        values = [("time share", fmt_pct(share)), ("FLOP util", fmt_pct(util)),
                  ("FLOP/s", f"{r.flops / (r.total_time_ps / 1e12) / 1e12:.1f} T"),
                  ("attainable target", fmt_pct(target))]
        if intensity is not None:
            values.append(("op. intensity", f"{intensity:.0f} FLOP/B" + (f" (ridge {ridge:.0f})" if ridge else "")))
        if result:
            values.append(("result", str(result[0])))
        if operands:
            values.append(("operands", ", ".join(str(s) for s in operands[:3])))
        if r.name in static_busy:
            values.append(("static MXU busy", fmt_pct(static_busy[r.name])))
        explanation = (f"self time per step x (1 - {fmt_pct(util)} / {fmt_pct(target)} attainable), on the core "
                       "where the op takes longest")
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(step_share, RULE.severity), message=message,
            saving=Saving(int(round(saving)), "modelled", explanation), fix=fix,
            evidence=(Evidence(r.name, tuple(values)),),
            host=analysis.profile.hosts[0].host if len(analysis.profile.hosts) == 1 else "", ops=(r.name,)))
    if referred:
        referred.sort(key=lambda x: (-x[2], x[0].name))
        names = tuple(r.name for r, *_ in referred)
        first, util, share, intensity = referred[0]
        more = f" and {len(referred) - 1} more" if len(referred) > 1 else ""
        findings.append(Finding(
            rule=NAME, code=CODE, severity=Severity.INFO,
            message=(f"`{first.name}`{more} run at {fmt_pct(util)} of peak FLOP/s, on the HBM roof (operational "
                     f"intensity {intensity:.0f} FLOP/B < ridge {ridge:.0f}): see `memory-bound`"),
            saving=Saving(0, "modelled", "no MXU-side saving: the ops are as fast as their bytes allow"),
            fix="move fewer bytes (see `tpudiag rule memory-bound`)",
            evidence=tuple(Evidence(r.name, (("time share", fmt_pct(sh)), ("FLOP util", fmt_pct(u)),
                                             ("op. intensity", f"{oi:.0f} FLOP/B (ridge {ridge:.0f})")))
                           for r, u, sh, oi in referred[:options.max_findings]),
            host=analysis.profile.hosts[0].host if len(analysis.profile.hosts) == 1 else "", ops=names))
    return findings


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=("trace", "flops"), options_type=Options, check=check,
            doc=__doc__, uses=("llo",), tables=("ops", "op_step_worst", "steps", "op_metadata"))
