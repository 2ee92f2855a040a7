"""Ops at or near the HBM bandwidth roof that dominate the step.

What it does
------------
Finds the ops whose achieved HBM bandwidth (HBM bytes over total time, as XProf computes it) is
at least `near_roof` of the peak and at least their share of peak FLOP/s (an op using more of the
MXU's peak than of HBM's is compute-bound; collectives left out), and reports them together when they
hold at least `min_time_share` of device time: HBM bytes per step, achieved against peak bandwidth, and their
operational intensity against the ridge point (peak FLOP/s / peak bandwidth). Such ops cannot go
faster by retiling: only moving fewer bytes helps. For each op it models the levers: narrower
weights (int8 or fp8) for matmuls, more rows per weight read (batch), and for other ops fusing
with the producer or consumer so the output does not round-trip through HBM.

Per step too: with the compiled program (the capture's embedded HLO or `--dumps`), the step's HBM
floor is the time to read its entry parameters in HBM once (weights and KV cache: what a decode
step must read whatever it computes) at peak bandwidth. A step whose FLOPs per floor byte are below
the ridge is bandwidth-bound by nature; when it takes much longer than its floor, a finding gives
the step against the floor (their ratio is the model bandwidth utilisation of LLM serving) with
the levers that apply: near its floor only fewer bytes help; far from it, the time goes elsewhere.

Why it matters
--------------
A decode step whose weight matmuls run at 85 % of HBM bandwidth and 5 % of peak FLOP/s is as fast
as its bytes allow; `low-mxu-utilization` sees the low FLOP rate but has no saving to offer. The
time is bought back only by reading fewer bytes per useful FLOP.

Evidence
--------
Per step: its time, the floor, the bytes read once and the share of HBM bandwidth they imply.
Per op: share of device time, HBM bytes per step, achieved bandwidth and its share of peak,
operational intensity against the ridge, the weight operand for matmuls, and each lever's
modelled saving.

How to fix
----------
Matmuls reading weights: quantise weights to int8 or fp8 (the low-precision inference path,
e.g. AQT or `jnp.int8` weights with per-channel scales) to halve the bytes of bf16 weights; serve
more rows per weight read (a larger decode batch, more tokens per call). Other ops: let XLA fuse
the op with its producer or consumer (remove the `optimization_barrier`, custom call or
sharding change that splits them), or write a Pallas kernel that keeps the intermediate in VMEM.
An async copy's done on the roof waits for a DMA (a weight prefetch into VMEM): start the copy
earlier so independent work hides it, or copy fewer bytes.

Bad: `bf16[32,8192] x bf16[8192,8192]` per token at 85 % of HBM bandwidth (OI 32 FLOP/B).
Good: the same matmul with int8 weights (half the bytes) or a batch of 256 rows (OI 240 FLOP/B).
A decode step of 90 µs whose 8 MiB of weights and KV cache take 10 µs at peak: batch more requests
per step, quantise the weights or the KV cache, fuse what round-trips through HBM, and keep the
weights resident in VMEM where they fit instead of copying them in every step.

Savings estimate
----------------
Modelled, at the achieved bandwidth: int8/fp8 weights save self time x weight bytes x (1 - 1 /
bytes-per-element) / HBM bytes; fusing saves self time x output bytes / HBM bytes (the write
avoided; the consumer's read is not counted). The finding's saving is the better lever per op,
summed, per step on the core where each op takes longest. Batch is given as time per row, not as a
step saving (the step does more work). Overlaps with low-mxu-utilization for the same matmuls.
The step finding's saving, modelled: near its floor, half the floor (int8/fp8 for bf16 bytes);
far from it, the step minus its floor, an upper bound.

Known limits
------------
Weights are taken to be the largest operand of a matmul, from the operand shapes in the op's HLO
text; without them the weight lever is not modelled. An op whose HBM bandwidth works out above
the peak (an async copy whose bytes the trace counts on its done, or a peak from another
generation) counts as on the roof, but its rate is not stated (a warning names it and the likely
cause) and no saving is built on it. HBM bytes come from the trace's
`memory_access_breakdown` (all bytes accessed without one). An op limited by VMEM or CMEM
bandwidth is not judged. The floor counts entry parameters in HBM (logical bytes, each read
once): arrays the step reads twice, or writes, make the true floor higher; parameters it does not
read (an unused argument) make it lower, and a step shorter than its floor gets no finding (it does
not read them all, or its time is an underestimate, as a compiler estimate can be).

Options
-------
- `near_roof` (0.7): an op is on the HBM roof at this share of peak bandwidth or more (XProf's
  roofline calls an op bound by the resource it uses most; 70 % is where retiling stops paying).
- `min_time_share` (0.05): report when the roof-bound ops hold at least this share of device time.
- `min_op_share` (0.01): ignore ops below this share of device time.
- `max_ops_shown` (5): evidence rows for at most this many ops, largest time first.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
- `floor_share` (0.5): a bandwidth-bound step whose HBM floor is at least this share of it is near
  its floor (only fewer bytes help: the saving is int8/fp8's half of the floor); below, it is far
  from it (the saving is the step minus its floor).
- `min_floor_share` (0.1): judge a step's floor only when it is at least this share of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpudiag.model.compiled import leaf_arrays
from tpudiag.model.findings import Basis, Evidence, Finding, Quantity, Saving, Severity
from tpudiag.model.hlo_names import async_role
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_pct, fmt_time
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, Table, op_events, op_hlo_texts,
                                per_step_worst_core, step_basis)
from tpudiag.model.hlo_shapes import Shape, dtype_bytes, operand_shapes, parse_shapes, shape_bytes
from tpudiag.rules.low_mxu_utilization import is_matmul

CODE = "TPD106"
NAME = "memory-bound"

@dataclass(frozen=True)
class Options:
    near_roof: float = 0.7
    min_time_share: float = 0.05
    min_op_share: float = 0.01
    max_ops_shown: int = 5
    high_share: float = 0.15
    medium_share: float = 0.03
    floor_share: float = 0.5
    min_floor_share: float = 0.1

    def __post_init__(self):
        if not 0.0 < self.near_roof <= 1.0:
            raise ValueError(f"near_roof must be in (0, 1], got {self.near_roof}")
        if self.max_ops_shown < 1:
            raise ValueError(f"max_ops_shown must be at least 1, got {self.max_ops_shown}")


@dataclass(frozen=True)
class Lever:
    name: str
    fraction: float  # of the op's self time


def levers(name: str, category: str, hbm_bytes: float, result: list[Shape], operands: list[Shape]) -> list[Lever]:
    """Modelled levers for one roof-bound op, from its shapes (bytes per occurrence)."""
    out = []
    if hbm_bytes <= 0:
        return out
    if is_matmul(name, category) and operands:
        weight = max(operands, key=shape_bytes)
        size = dtype_bytes(weight.dtype)
        if size > 1:
            saved = shape_bytes(weight) * (1 - 1 / size)
            out.append(Lever(f"int8/fp8 weights ({weight} → 1 byte/element)", min(1.0, saved / hbm_bytes)))
    elif result:
        written = shape_bytes(result[0])
        if 0 < written < hbm_bytes:
            out.append(Lever("fuse with producer or consumer (output stays out of HBM)", written / hbm_bytes))
    return out


def batch_note(result: list[Shape], operands: list[Shape], hbm_bytes: float) -> str:
    """Time per row when the rows double, at the same bandwidth (weights read once for twice the rows)."""
    if not operands or not result or len(result[0].dims) < 2:
        return ""
    weight = shape_bytes(max(operands, key=shape_bytes))
    rows = math.prod(result[0].dims[:-1])
    doubled = weight + 2 * (hbm_bytes - weight)
    per_row = doubled / (2 * hbm_bytes)
    return f"{2 * rows} rows instead of {rows}: time per row x{per_row:.2f} (modelled)"


@dataclass(frozen=True)
class StepFloor:
    """A step against the time to read its HBM parameters once at peak bandwidth."""

    module: str
    step_ps: float
    floor_ps: float
    bytes_read: int  # entry parameters in HBM, logical bytes
    flops: float  # per step and core
    copied_bytes: float  # per step and core: what async copies brought into VMEM from HBM
    peak_bw: float

    @property
    def share(self) -> float:
        return self.floor_ps / self.step_ps

    def message(self) -> str:
        return (f"each step of `{self.module}` is bandwidth-bound: it takes {fmt_time(self.step_ps)} against its "
                f"HBM floor of "
                f"{fmt_time(self.floor_ps)} ({fmt_bytes(self.bytes_read)} of parameters and state read once at "
                f"{fmt_bandwidth(self.peak_bw)}): it uses {fmt_pct(self.share)} of HBM bandwidth over the step "
                f"(model bandwidth utilisation), at {self.flops / self.bytes_read:.1f} FLOP per byte read")

    def quantities(self) -> tuple[Quantity, ...]:
        return (Quantity(self.module, "step time ps", self.step_ps), Quantity(self.module, "HBM floor ps", self.floor_ps),
                Quantity(self.module, "bytes read once", float(self.bytes_read)),
                Quantity(self.module, "HBM bandwidth utilization", self.share))


def _step_program(ctx: RuleContext):
    """The compiled program the steps run: the one named like the step's module, else the only one."""
    programs = ctx.compiled.programs
    modules = {s.module for s in ctx.analysis.step_sources.values() if s.module}
    named = [p for p in programs if p.module in modules]
    if named:
        return named[0]
    return programs[0] if len(programs) == 1 else None


def step_floor(ctx: RuleContext, basis) -> StepFloor | None:
    """The step against its HBM floor, where a compiled program and steps are known."""
    analysis = ctx.analysis
    device = analysis.profile.hosts[0].device
    program = _step_program(ctx) if ctx.compiled.programs else None
    if program is None or not device.hbm_bytes_per_s or basis.whole_capture or not basis.step_ps:
        return None
    read = sum(a.logical_bytes for p in program.entry_parameters() if p.shape is not None
               for a in leaf_arrays(p.shape) if a.memory_space == 0)
    if read <= 0:
        return None
    n_cores = analysis.n_cores_of_ops
    per = basis.n_steps * n_cores
    ops = analysis.ops
    copied = float(ops["copied_hbm_bytes"].sum()) / per if "copied_hbm_bytes" in ops.columns else 0.0
    return StepFloor(program.module, basis.step_ps, read / device.hbm_bytes_per_s * 1e12, read,
                     float(ops["flops"].sum()) / per, copied, device.hbm_bytes_per_s)


def _floor_finding(ctx: RuleContext, options: Options, floor: StepFloor, ridge: float | None) -> Finding | None:
    """A bandwidth-bound step far from its floor, with the levers whose precondition holds."""
    if ridge is None or floor.flops / floor.bytes_read >= ridge or floor.share < options.min_floor_share:
        return None
    if floor.share > 1:  # faster than reading its parameters once: it does not read them all, or its time
        return None      # is an underestimate (a compiler estimate); no rate above the peak is stated
    near = floor.share >= options.floor_share
    fixes = ["batch more requests per step (the weights are read once per step whatever the batch)",
             "quantise the weights or the KV cache (int8/fp8: half the bytes of bf16)"]
    if not near:
        fixes.append("fuse ops whose intermediates round-trip through HBM")
    chip = ctx.chip
    if floor.copied_bytes > 0 and chip is not None and floor.bytes_read <= chip.vmem_bytes:
        fixes.append(f"keep the weights resident: run several steps in one program (a `lax.fori_loop`), so what it "
                     f"copies into VMEM ({fmt_bytes(floor.copied_bytes)} per step; its {fmt_bytes(floor.bytes_read)} "
                     f"of parameters fit in {fmt_bytes(chip.vmem_bytes)}) crosses HBM once for all of them, not "
                     "once per step (VMEM holds nothing between program runs)")
    # Near its floor only fewer bytes help: int8/fp8 halve bf16's bytes read once. Far from it, the
    # step could at most fall to its floor.
    saving_ps = floor.floor_ps / 2 if near else floor.step_ps - floor.floor_ps
    why = ("int8/fp8 weights and cache: half the floor's bf16 bytes read once per step" if near
           else "the step at its HBM floor: its parameters in HBM read once at peak bandwidth")
    scale = SeverityScale(options.high_share, options.medium_share)
    evidence = Evidence(floor.module, (("step", fmt_time(floor.step_ps)), ("HBM floor", fmt_time(floor.floor_ps)),
                                       ("read once", fmt_bytes(floor.bytes_read)),
                                       ("bandwidth used", fmt_pct(floor.share)),
                                       ("FLOP per byte read", f"{floor.flops / floor.bytes_read:.1f}"),
                                       ("copied into VMEM/step", fmt_bytes(floor.copied_bytes))))
    return Finding(rule=NAME, code=CODE, severity=scale.of(saving_ps / floor.step_ps, RULE.severity),
                   message=floor.message(),
                   saving=Saving(int(round(saving_ps)), Basis.MODELLED, why),
                   fix="; ".join(fixes), evidence=(evidence,),
                   host=ctx.analysis.profile.hosts[0].host if len(ctx.analysis.profile.hosts) == 1 else "",
                   quantities=floor.quantities())


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    floor = step_floor(ctx, step_basis(ctx.analysis))
    found = _floor_finding(ctx, options, floor, ctx.analysis.profile.hosts[0].device.ridge_flops_per_byte) \
        if floor is not None else None
    return ([found] if found is not None else []) + _roof_ops(ctx, options)


def _roof_ops(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    ops = analysis.ops
    device = analysis.profile.hosts[0].device
    peak_bw = device.hbm_bytes_per_s
    if ops.empty or not peak_bw:
        return []
    basis = step_basis(analysis)
    n_cores = analysis.n_cores_of_ops
    total_core_ps = sum(analysis.core_time_ps.values())
    # Collectives move bytes over ICI, not only HBM: exposed-collective judges them. An op above the
    # peak bandwidth as timed (an async copy's done) is on the roof, but its rate is not physical (a
    # warning says why): it is not stated, and no saving is built on it.
    unphysical = analysis.over_peak_names
    ops = ops[ops["family"].astype(str) == ""]
    grouped = (ops.assign(name=ops["name"].astype(str), category=ops["category"].astype(str))
               .groupby("name", sort=False)
               .agg(category=("category", "first"), flops=("flops", "sum"), hbm_bytes=("hbm_bytes", "sum"),
                    total_time_ps=("total_time_ps", "sum"), self_time_ps=("self_time_ps", "sum"),
                    occurrences=("occurrences", "sum"), shape=("shape_with_layout", "first"))
               .reset_index())
    grouped = grouped[(grouped["hbm_bytes"] > 0) & (grouped["total_time_ps"] > 0)]
    bw = grouped["hbm_bytes"] / (grouped["total_time_ps"] / 1e12)
    share = grouped["self_time_ps"] / total_core_ps if total_core_ps else grouped["self_time_ps"] * 0
    peak_flops = device.peak_flops_per_s
    flop_util = grouped["flops"] / (grouped["total_time_ps"] / 1e12) / peak_flops if peak_flops else 0.0
    roof = grouped[(bw / peak_bw >= options.near_roof) & (bw / peak_bw >= flop_util)
                   & (share >= options.min_op_share)]
    if roof.empty or roof["self_time_ps"].sum() / total_core_ps < options.min_time_share:
        return []
    roof = roof.sort_values(["self_time_ps", "name"], ascending=[False, True])
    texts = op_hlo_texts(analysis)
    events = op_events(analysis, roof["name"])
    ridge = device.ridge_flops_per_byte
    saving_ps = 0.0
    rows = []
    for r in roof.itertuples(index=False):
        per_occ = r.hbm_bytes / r.occurrences
        result, operands = parse_shapes(r.shape), operand_shapes(texts.get(r.name, ""))
        options_here = levers(r.name, r.category, per_occ, result, operands) if r.name not in unphysical else []
        self_step = per_step_worst_core(events[events["name"] == r.name], "self_ps", basis)
        best = max(options_here, key=lambda lv: lv.fraction, default=None)
        op_saving = self_step * best.fraction if best else 0.0
        saving_ps += op_saving
        rows.append((r, per_occ, result, operands, options_here, self_step, op_saving))
    bytes_step = roof["hbm_bytes"].sum() / (basis.n_steps * n_cores)
    physical = roof[~roof["name"].isin(unphysical)]
    flops = roof["flops"].sum()
    oi = flops / roof["hbm_bytes"].sum()
    roof_share = roof["self_time_ps"].sum() / total_core_ps
    n = len(roof)
    what = f"{n} ops" if n > 1 else f"`{roof['name'].iloc[0]}`"
    together = str(roof["name"].iloc[0]) if n == 1 else f"{n} ops"  # the subject of the message's totals
    quantities = [Quantity(together, "time share", roof_share)]
    if len(physical) == n:
        achieved = physical["hbm_bytes"].sum() / (physical["total_time_ps"].sum() / 1e12)
        rate = f" at {fmt_bandwidth(achieved)} ({fmt_pct(achieved / peak_bw)} of {fmt_bandwidth(peak_bw)})"
        quantities.append(Quantity(together, "HBM bandwidth utilization", achieved / peak_bw))
    else:
        above = n - len(physical)
        who = "it runs" if n == 1 else "they run" if above == n else f"{above} of them run"
        rate = (f" (timed alone, {who} above the {fmt_bandwidth(peak_bw)} peak, which no core reaches: the "
                "warnings name the likely cause; no rate is stated)")
    per = f"per {analysis.platform.core_word} over the capture" if basis.whole_capture else "per step"
    message = (f"{what} on the HBM roof {'holds' if n == 1 else 'hold'} {fmt_pct(roof_share)} of device time: {fmt_bytes(bytes_step)} {per}"
               f"{rate}, operational intensity {oi:.0f} FLOP/B" + (f" vs ridge {ridge:.0f}" if ridge else ""))
    evidence = []
    for r, per_occ, result, operands, options_here, self_step, op_saving in rows[:options.max_ops_shown]:
        op_bw = r.hbm_bytes / (r.total_time_ps / 1e12)
        quantities.append(Quantity(r.name, "time share", r.self_time_ps / total_core_ps))
        if r.name in unphysical:
            shown = "above the peak as timed (see the warnings)"
        else:
            shown = f"{fmt_bandwidth(op_bw)} ({fmt_pct(op_bw / peak_bw)})"
            quantities += [Quantity(r.name, "HBM bytes/s", op_bw),
                           Quantity(r.name, "HBM bandwidth utilization", op_bw / peak_bw)]
        values = [("time share", fmt_pct(r.self_time_ps / total_core_ps)),
                  ("HBM bytes/step" if not basis.whole_capture else "HBM bytes", fmt_bytes(r.hbm_bytes / (basis.n_steps * n_cores))),
                  ("bandwidth", shown),
                  ("op. intensity", f"{r.flops / r.hbm_bytes:.1f} FLOP/B")]
        if operands:
            values.append(("operands", ", ".join(str(s) for s in operands[:3])))
        values.extend((lv.name, f"-{fmt_pct(lv.fraction)} ({fmt_time(self_step * lv.fraction)}/step)")
                      for lv in options_here)
        note = batch_note(result, operands, per_occ) if is_matmul(r.name, r.category) else ""
        if note:
            values.append(("larger batch", note))
        evidence.append(Evidence(r.name, tuple(values)))
    kinds = {lv.name.split(" (")[0] for row in rows for lv in row[4]}
    fixes = []
    if "int8/fp8 weights" in kinds:
        fixes.append("quantise weights to int8/fp8 (half the bytes of bf16) and serve more rows per weight read")
    if any(k.startswith("fuse") for k in kinds):
        fixes.append("fuse the op with its producer or consumer so its output stays out of HBM")
    waits = [f"`{n}`" for n in roof["name"].astype(str) if async_role(n) is not None]
    if waits:  # a copy's done waits for its DMA: hiding it, or fewer bytes, is what helps
        verb = "waits" if len(waits) == 1 else "wait"
        fixes.append(f"{', '.join(waits[:3])}{' and more' if len(waits) > 3 else ''} {verb} for a DMA no work hides: "
                     "start the copy earlier (more independent work between its start and done) or copy fewer "
                     "bytes (a narrower dtype)")
    fix = "; ".join(fixes) or "move fewer bytes: narrower dtypes, fused producers and consumers, larger batches"
    step_share = saving_ps / basis.step_ps if basis.step_ps else 0.0
    scale = SeverityScale(options.high_share, options.medium_share)
    saving = Saving(int(round(saving_ps)), Basis.MODELLED,
                    "per op, the better of int8/fp8 weights or fusing, at the achieved bandwidth; "
                    "on the core where each op takes longest")
    return [Finding(rule=NAME, code=CODE, severity=scale.of(step_share, RULE.severity), message=message,
                    saving=saving, fix=fix, evidence=tuple(evidence),
                    host=analysis.profile.hosts[0].host if len(analysis.profile.hosts) == 1 else "",
                    ops=tuple(roof["name"]), quantities=tuple(quantities))]


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options,
            check=check, doc=__doc__, tables=(Table.OPS, Table.OP_STEP_WORST, Table.STEPS, Table.OP_METADATA))
