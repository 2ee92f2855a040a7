"""Ops whose results spend a large share of their bytes on TPU tile padding.

What it does
------------
Reads each op's result shape with its TPU tiled layout (`shape_with_layout`, e.g.
`f32[3,1000]{1,0:T(4,128)}`), asks the layout parser for its logical and padded bytes
(16,384 padded for 12,000 logical here), and flags ops whose padding share, weighted by the
op's time, is large. It names the dims that are padded and the size that would need no padding,
e.g. a vocabulary of 50257 padded to 50304.

Why it matters
--------------
TPU arrays are stored in tiles (8x128 for 32-bit types): a minor dim of 1000 occupies 1024
lanes and a second-minor dim of 3 occupies a tile of 4 or 8 rows. Padding costs HBM capacity and
bandwidth, and the padded lanes go through the MXU and VPU as if they were data.

Evidence
--------
Per op: result shape and layout, logical and padded bytes, padding share, time share, and the
padded dims with their padded sizes.

How to fix
----------
Choose sizes that are multiples of the tile: pad the vocabulary to a multiple of 128 (50257 →
50304) and mask the extra logits; keep feature dims multiples of 128 and batch-like dims
multiples of 8. A dim that fills less than half of its tile (a minor dim of 4 in a 128-lane
tile) should not be padded: make a larger dim the minor one (transpose, or reshape to fold the
small dim into a neighbour).

Bad: `bf16[8192,50257]{1,0:T(8,128)(2,1)}` (the logits of GPT-2's vocabulary).
Good: `bf16[8192,50304]{1,0:T(8,128)(2,1)}`.

Savings estimate
----------------
Modelled: self time per step x padding share (padded - logical) / padded, on the core where the
op takes longest: the time the op would save if its cost scaled with the bytes it moves. An
upper bound for memory-bound ops; it overlaps with low-mxu-utilization for padded matmuls.

Known limits
------------
Only the result shape is recorded in the trace; padded operands show up only through their
producers. Results in VMEM (`S(1)`) are reported too (the evidence names the memory space):
their padding costs VMEM capacity and vector work rather than HBM bandwidth. Needs `tpudiag.parsers.layout` and ops that carry a tiled layout; the rule is skipped
otherwise.

Options
-------
- `min_padding_fraction` (0.1): ignore results whose padding is below this share of padded bytes.
- `min_padding_bytes` (65536): ignore results with fewer padding bytes than this: a scalar padded to
  512 bytes costs latency, not bandwidth.
- `min_time_share` (0.01): ignore ops taking less than this share of device time.
- `max_findings` (5): report at most this many ops, largest saving first.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model.compiled import Shape, leaf_arrays, memory_space_name
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.units import fmt_pct
from tpudiag.model.hlo_shapes import fix_for, padded_dims
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, Table, op_events, per_step_worst_core,
                                step_basis)

CODE = "TPD103"
NAME = "padding-waste"


@dataclass(frozen=True)
class Options:
    min_padding_fraction: float = 0.1
    min_padding_bytes: int = 65536
    min_time_share: float = 0.01
    max_findings: int = 5
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        if not 0.0 <= self.min_padding_fraction < 1.0:
            raise ValueError(f"min_padding_fraction must be in [0, 1), got {self.min_padding_fraction}")
        if self.max_findings < 1:
            raise ValueError(f"max_findings must be at least 1, got {self.max_findings}")


def _memory_space(shape: Shape) -> str:
    spaces = {a.memory_space for a in leaf_arrays(shape)}
    return ", ".join(memory_space_name(s) for s in sorted(spaces))


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    parse = ctx.layouts
    basis = step_basis(analysis)
    scale = SeverityScale(options.high_share, options.medium_share)
    ops = analysis.ops
    tiled = ops[ops["shape_with_layout"].str.contains(":T(", regex=False).fillna(False)]
    if tiled.empty:
        return []
    total_core_ps = sum(analysis.core_time_ps.values())
    grouped = (tiled.assign(name=tiled["name"].astype(str), module=tiled["module"].astype(str))
               .groupby(["module", "name"], sort=False)
               .agg(self_time_ps=("self_time_ps", "sum"), shape=("shape_with_layout", "first"))
               .reset_index())
    events = None  # the per-step rows of the tiled ops, read once a candidate needs them
    candidates = []
    for r in grouped.itertuples(index=False):
        share = r.self_time_ps / total_core_ps if total_core_ps else 0.0
        if share < options.min_time_share:
            continue
        try:
            shape = parse(str(r.shape))
        except ValueError:
            continue  # a layout the parser does not know: nothing to say about it
        logical, padded = shape.logical_bytes, shape.padded_bytes
        if padded <= 0 or padded <= logical:
            continue
        waste = (padded - logical) / padded
        if waste < options.min_padding_fraction or padded - logical < options.min_padding_bytes:
            continue
        if events is None:
            events = op_events(analysis, grouped["name"])
        saving = per_step_worst_core(events[events["name"] == r.name], "self_ps", basis) * waste
        dims = [d for a in leaf_arrays(shape) for d in padded_dims(a)]
        candidates.append((saving, r, share, logical, padded, waste, dims, _memory_space(shape)))
    candidates.sort(key=lambda c: (-c[0], c[1].name))
    findings = []
    for saving, r, share, logical, padded, waste, dims, space in candidates[:options.max_findings]:
        step_share = saving / basis.step_ps if basis.step_ps else 0.0
        dim_text = ", ".join(f"dim {i}: {s} → {p}" for i, s, p in dims)
        message = (f"`{r.name}` result `{r.shape}` is {fmt_pct(waste)} padding ({padded:,} bytes for {logical:,}) "
                   f"and takes {fmt_pct(share)} of device time")
        fix = fix_for(dims)
        values = [("shape", str(r.shape)), ("logical bytes", f"{logical:,}"), ("padded bytes", f"{padded:,}"),
                  ("padding", fmt_pct(waste)), ("time share", fmt_pct(share))]
        if space != "hbm":
            values.append(("memory space", space))
        if dims:
            values.append(("padded dims", dim_text))
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(step_share, RULE.severity), message=message,
            saving=Saving(int(round(saving)), Basis.MODELLED,
                          "self time per step x padding share, assuming the op's time scales with its bytes"),
            fix=fix, evidence=(Evidence(r.name, tuple(values)),),
            host=analysis.profile.hosts[0].host if len(analysis.profile.hosts) == 1 else "", ops=(r.name,)))
    return findings


RULE = Rule(code=CODE, name=NAME, severity=Severity.MEDIUM, inputs=(RuleInput.TRACE, RuleInput.LAYOUTS),
            options_type=Options, check=check, doc=__doc__, tables=(Table.OPS, Table.OP_STEP_WORST, Table.STEPS), tpu_only=True)
