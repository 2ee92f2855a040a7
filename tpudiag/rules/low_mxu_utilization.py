"""Matmul and convolution fusions that dominate time at a low fraction of peak FLOP/s.

What it does
------------
Compares each matmul or convolution op's achieved FLOP rate (FLOPs over its total time, as
XProf computes it) with the per-core peak, and flags the ops that take a large share of device
time at low utilization. Ops are matmul-like when their category contains "convolution" or
"dot", or their name contains `convolution`, `dot`, `matmul` or `einsum`. It says why from the
op's math (`tpudiag.model.matmuls`): the main matmul inside the fusion (a `dot` or a
`convolution`, nested fusions included) with its M, N, K and batch and its operand dtypes. Causes:
the op is memory-bound (operational intensity below the ridge point); M, the rows, is below the
MXU width (a small batch); N or K is below the MXU width (a narrow or short matmul) or not a
multiple of it (128 on v4/v5e/v5p, 256 on v6e/TPU7x); an operand of that matmul is f32; the op
also runs a collective (v5e's async collective fusions carry an all-gather beside the matmul); the
compiled code spills (LLO) or keeps the MXUs idle (static LLO). Only that matmul's dims and
dtypes are named, never those of the fusion's other instructions or of its output tuple.

Why it matters
--------------
Matmuls are where a TPU's FLOPs are; a dominant matmul at 20 % of peak leaves most of the chip
idle. Each reason has a different fix, and a memory-bound matmul will not speed up by retiling.

Evidence
--------
Per op: share of device time, achieved FLOP/s and utilization, operational intensity against the
ridge point, the main matmul (`convolution.55: bf16 x bf16 -> bf16, M 512, N 256, K 1024
(128x8)`) and where its dims come from (the compiled HLO, or the op's operand shapes), the other
matmuls of the op, and the reasons. With LLO dumps (`--dumps DIR`), the compiler's static MXU
busy fraction for the op and its spills. The finding carries the dims, dtypes and rates as typed
quantities (`Finding.quantities`, `quantities` in JSON).

How to fix
----------
Small M: raise the rows per call (per-core batch, tokens per call); padding M only adds work.
Narrow N: merge matmuls that share an operand (concatenate their weights along N). N or K off
the MXU multiple: pad it, when the padding adds less work than the op could recover (the fix
says how much it adds: 1000→1024 is +2.4 %). f32 operands: cast to bf16 and keep f32
accumulation with `preferred_element_type=jnp.float32`. Memory-bound: raise the operational
intensity (fuse the producer, reuse weights across more rows). Otherwise inspect the fusion's
tiling and spills in the compiler dump.

On a Pallas matmul kernel whose serialised body is at hand (`parsers.mosaic`), the finding names
its blocks (bm x bk x bn) and the first fix follows from them (`model.kernels.mxu_block_fix`):
block_k or block_n off the MXU's multiple is raised to it; blocks that spill are halved where that
frees most vector state; otherwise a larger block_k halves the grid's k steps and the f32
accumulator's loads and stores per MXU pass. Each comes with the `tpudiag lab tune` command that
compiles both sizes deviceless, with the function around the `pallas_call` and its keyword filled
in when its source file is here (else `MODULE:FN` and what to substitute).

Bad: `bf16[8,1000] dot bf16[1000,1000]` at 3 % of peak.
Good: `bf16[1024,1024] dot bf16[1024,1024]` at 60 % of peak.

Savings estimate
----------------
Modelled: self time per step x (1 - utilization / attainable target), where the attainable
target is `target_utilization` x min(1, operational intensity / ridge point) (the roofline);
for a compute-bound op that is self time x (1 - util / target). Per step, on the core where the
op takes longest. An upper bound that overlaps with padding-waste for padded matmuls. An op whose
FLOP rate is above the peak is not judged (a warning names it: see `tpudiag.analysis.limits`).

Known limits
------------
On a GPU capture the peak is the tensor cores' (`model.hardware`'s GPU table) and no MXU-width
cause is named (tensor cores have none to pad to): only the roofline and operand dtypes.
Memory-bound matmuls already at their roofline target get an info finding that refers them to
`memory-bound`, which models the byte savings. Custom calls (Pallas kernels) without FLOPs in
the trace are judged with FLOPs from the kernel's declared `cost_estimate` or, for a matmul-shaped
call, from its shapes (the finding says which). Other ops without FLOPs in the trace cannot be
judged and are left out; a trace with no FLOPs at all, or without a peak FLOP/s, skips the rule.
The matmul comes from the compiled program the trace op joined (`--dumps`, or the HLO a capture
embeds); without one, only from the op's own HLO text when its operand shapes compose as a
matmul, and otherwise its dims are said to be unknown. M's alignment is not judged (rows stream
through the MXU); with several matmuls in one op, the causes are those of the one doing most of
its FLOPs. A `dot` inside a loop fusion is not recognised unless the category or name says so.

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

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.custom_calls import derive_costs
from tpudiag.model.profile import Platform
from tpudiag.model.findings import Basis, Evidence, Finding, Quantity, Saving, Severity
from tpudiag.model.llo import LloDump
from tpudiag.model.kernels import mxu_block_fix
from tpudiag.model.matmuls import Matmul, OpMath, ProgramMath, op_math_from_text
from tpudiag.model.units import fmt_pct
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, Table, op_events, op_hlo_texts,
                                per_step_worst_core, step_basis)

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


def diagnose(math: OpMath | None, mxu: int, intensity: float | None, ridge: float | None,
             recoverable: float, unit: str = "MXU") -> tuple[list[str], list[str]]:
    """(reasons, fixes) for a slow matmul op, from its matmul (`model.matmuls`) and roofline position.

    Only the main matmul's own dims and operand dtypes are named. A small M (rows) is a batch
    cause and a narrow N or short K a shape cause: padding those multiplies the work. A N or K
    above the MXU width but off its multiple gets a padding fix only when the work padding adds
    is smaller than the share of the op's time a fix could recover (`recoverable`), and the fix
    says how much it adds.
    """
    reasons, fixes = [], []
    if intensity is not None and ridge and intensity < ridge:
        reasons.append(f"memory-bound (operational intensity {intensity:.0f} FLOP/B < ridge {ridge:.0f})")
        fixes.append(f"raise operational intensity above {ridge:.0f} FLOP/B (fuse the producer, reuse weights "
                     "across more rows)")
    mm = math.main if math is not None else None
    if mm is None:
        return reasons, fixes
    where = f" in `{mm.instruction}`" if mm.instruction != math.op else ""
    if mm.m < mxu:
        reasons.append(f"small batch (M = {mm.m} rows{where} < MXU {mxu})")
        fixes.append(f"raise the rows per call toward {mxu} (a larger batch, more tokens per call); padding M "
                     "would only add work")
    pads = []
    for label, d in (("N", mm.n), ("K", mm.k)):
        if d % mxu == 0:
            continue
        padded = _round_up(d, mxu)
        if d < mxu:
            what, part = ("narrow output", "columns") if label == "N" else ("short contraction", "rows")
            reasons.append(f"{what} ({label} = {d}{where} < MXU {mxu}: {fmt_pct(d / padded)} of the MXU {part} used)")
            fixes.append("merge matmuls that share an operand into one wider one (concatenate their weights along N)"
                         if label == "N" else "contract more per matmul (fold heads or groups into K)")
            continue
        added = padded / d - 1
        reasons.append(f"{label} = {d}{where} is not a multiple of the {mxu}-wide MXU ({d} of {padded} used)")
        if added < recoverable:
            pads.append(f"{label} {d}→{padded} (+{fmt_pct(added)} work and bytes on that dim)")
    if pads:
        fixes.append("pad " + ", ".join(pads))
    if "f32" in (mm.lhs_dtype, mm.rhs_dtype):
        reasons.append(f"f32 operands ({mm.lhs_dtype} x {mm.rhs_dtype}{where}; bf16 runs at full {unit} rate)")
        fixes.append("cast operands to bf16 with `preferred_element_type=jnp.float32`")
    return reasons, fixes


def matmul_quantities(op: str, mm: Matmul) -> list[Quantity]:
    """The dims and dtypes of `mm` as a finding about `op` states them."""
    return [Quantity(op, name, value, mm.instruction) for name, value in (
        ("M", mm.m), ("N", mm.n), ("K", mm.k), ("batch", mm.batch), ("lhs dtype", mm.lhs_dtype),
        ("rhs dtype", mm.rhs_dtype), ("result dtype", mm.result_dtype))]


class OpMathIndex:
    """An op's math (`model.matmuls`): from the compiled program the join matched to its trace
    program, else from the op's own HLO text in the trace."""

    def __init__(self, join, hlo_text: dict[str, str]):
        self.join = join
        self.hlo_text = hlo_text
        self._programs: dict[int, ProgramMath] = {}

    def get(self, program_id, module: str, name: str) -> OpMath | None:
        program = self.join.program_for(program_id, module) if self.join is not None else None
        if program is not None:
            math = self._programs.setdefault(id(program), ProgramMath(program))
            if name in math:
                return math.get(name)
        return op_math_from_text(name, self.hlo_text.get(name, ""))


def static_mxu_busy(dumps: Iterable[LloDump]) -> dict[str, float]:
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


def derived_sources(analysis) -> dict[str, str]:
    """Custom calls whose FLOPs the analysis derived (the trace gives none), with where they came from."""
    meta = pd.concat([h.op_metadata for h in analysis.profile.hosts], ignore_index=True)
    derived = derive_costs(meta)
    return dict(zip(derived["name"], derived["source"]))


def _spills(ctx: RuleContext, ops: pd.DataFrame) -> dict[str, int]:
    """Op name -> VMEM spill stores of its compiled code (LLO, through the join); absent when unknown."""
    join = ctx.join
    if join is None or "spill_stores" not in join.columns or join.columns.empty:
        return {}
    stores = join.columns["spill_stores"].reindex(ops.index)
    known = stores.notna().to_numpy()
    names = ops["name"].astype(str).to_numpy()[known]
    out: dict[str, int] = {}
    for name, value in zip(names, stores[known].astype("int64")):
        out[name] = max(out.get(name, 0), int(value))
    return out


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
    # A GPU's tensor cores have no MXU width to pad to: only roofline and dtype causes are named there
    tpu = device.platform is Platform.TPU
    mxu = (device.chip.mxu_dim if device.chip else 128) if tpu else 1
    unit = "MXU" if tpu else "tensor-core"
    if not peak:
        return []
    total_core_ps = sum(analysis.core_time_ps.values())
    cats = ops["category"].astype(str)
    names = ops["name"].astype(str)
    derived = derived_sources(analysis)
    unphysical = analysis.over_peak_names  # a warning says why; no saving is built on them
    mask = np.array([(is_matmul(n, c) or n in derived) and n not in unphysical for n, c in zip(names, cats)],
                    dtype=bool) & (ops["flops"].to_numpy() > 0)
    cand = ops[mask]
    if cand.empty:
        return []
    grouped = (cand.assign(name=cand["name"].astype(str), module=cand["module"].astype(str),
                           category=cand["category"].astype(str))
               .groupby(["module", "name"], sort=False)
               .agg(category=("category", "first"), program_id=("program_id", "first"), flops=("flops", "sum"),
                    bytes_accessed=("bytes_accessed", "sum"), total_time_ps=("total_time_ps", "sum"),
                    self_time_ps=("self_time_ps", "sum"))
               .reset_index())
    maths = OpMathIndex(ctx.join, op_hlo_texts(analysis))
    events = op_events(analysis, grouped["name"])
    static_busy = static_mxu_busy(ctx.compiled.llo)
    spills = _spills(ctx, cand)
    kernels = {name: k for p in ctx.compiled.programs for name, k in p.kernels.items()}
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
        math = maths.get(r.program_id, r.module, r.name)
        reasons, fixes = diagnose(math, mxu, intensity, ridge, fraction, unit)
        if math is None or math.main is None:
            reasons.append("its matmul's dims are not known (the trace's HLO text does not show them: pass the "
                           "XLA dump with `--dumps`)")
        if r.name in derived:
            reasons.append("custom call: FLOPs from " + ("its declared cost_estimate" if derived[r.name] ==
                                                         "cost_estimate" else "its operand and result shapes"))
        busy = static_busy.get(r.name)
        if busy is not None and busy < options.low_utilization:
            reasons.append(f"the compiled code keeps the MXUs busy in only {fmt_pct(busy)} of its bundles "
                           "(static LLO)")
        if math is not None and math.collectives:
            inside = ", ".join(f"`{c}`" for c in math.collectives[:2])
            reasons.append(f"it also runs {inside} (a collective fused with the matmul): its time includes the "
                           "collective's (see `exposed-collective`)")
        if spills.get(r.name, 0) > 0:
            reasons.append(f"its compiled code spills {spills[r.name]:,} vector registers (see `spill`)")
        kernel = kernels.get(r.name)
        if kernel is not None:
            mm = kernel.matmul_blocks
            reasons.append(f"Pallas `{kernel.name}` blocks "
                           + (f"bm x bk x bn {'x'.join(map(str, mm))}" if mm else kernel.blocks_text()))
            block_fix = mxu_block_fix(kernel, mxu, spills.get(r.name, 0)) if tpu else None
            if block_fix is not None:
                fixes.insert(0, block_fix)
        candidates.append((saving, r, util, share, intensity, target, reasons, fixes, math))
    candidates.sort(key=lambda c: (-c[0], c[1].name))
    findings = []
    host = analysis.profile.hosts[0].host if len(analysis.profile.hosts) == 1 else ""
    for saving, r, util, share, intensity, target, reasons, fixes, math in candidates[:options.max_findings]:
        step_share = saving / basis.step_ps if basis.step_ps else 0.0
        why = "; ".join(reasons) if reasons else "no cause visible in the trace"
        message = (f"`{r.name}` ({r.category}) runs at {fmt_pct(util)} of peak FLOP/s for {fmt_pct(share)} of "
                   f"device time: {why}")
        fix = "; ".join(fixes) if fixes else "inspect the fusion's tiling in the compiler dump (`--xla_dump_to`)"
        rate = r.flops / (r.total_time_ps / 1e12)
        values = [("time share", fmt_pct(share)), ("FLOP util", fmt_pct(util)),
                  ("FLOP/s", f"{rate / 1e12:.1f} T"), ("attainable target", fmt_pct(target))]
        if intensity is not None:
            values.append(("op. intensity", f"{intensity:.0f} FLOP/B" + (f" (ridge {ridge:.0f})" if ridge else "")))
        quantities = [Quantity(r.name, "FLOP utilization", util), Quantity(r.name, "FLOP/s", rate),
                      Quantity(r.name, "time share", share)]
        mm = math.main if math is not None else None
        if mm is not None:
            values.append(("matmul", mm.describe()))
            values.append(("matmul from", _BASIS[mm.basis]))
            if len(math.matmuls) > 1:
                values.append(("other matmuls", ", ".join(m.describe() for m in math.matmuls if m is not mm)))
            quantities.extend(matmul_quantities(r.name, mm))
        if r.name in static_busy:
            values.append(("static MXU busy", fmt_pct(static_busy[r.name])))
        explanation = (f"self time per step x (1 - {fmt_pct(util)} / {fmt_pct(target)} attainable), on the core "
                       "where the op takes longest")
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(step_share, RULE.severity), message=message,
            saving=Saving(int(round(saving)), Basis.MODELLED, explanation), fix=fix,
            evidence=(Evidence(r.name, tuple(values)),), host=host, ops=(r.name,), quantities=tuple(quantities)))
    if referred:
        referred.sort(key=lambda x: (-x[2], x[0].name))
        names = tuple(r.name for r, *_ in referred)
        first, util, share, intensity = referred[0]
        more = f" and {len(referred) - 1} more" if len(referred) > 1 else ""
        findings.append(Finding(
            rule=NAME, code=CODE, severity=Severity.INFO,
            message=(f"`{first.name}`{more} run at {fmt_pct(util)} of peak FLOP/s, on the HBM roof (operational "
                     f"intensity {intensity:.0f} FLOP/B < ridge {ridge:.0f}): see `memory-bound`"),
            saving=Saving(0, Basis.MODELLED, "no MXU-side saving: the ops are as fast as their bytes allow"),
            fix="move fewer bytes (see `tpudiag rule memory-bound`)",
            evidence=tuple(Evidence(r.name, (("time share", fmt_pct(sh)), ("FLOP util", fmt_pct(u)),
                                             ("op. intensity", f"{oi:.0f} FLOP/B (ridge {ridge:.0f})")))
                           for r, u, sh, oi in referred[:options.max_findings]),
            host=host, ops=names,
            quantities=tuple(q for r, u, sh, _ in referred[:options.max_findings]
                             for q in (Quantity(r.name, "FLOP utilization", u), Quantity(r.name, "time share", sh)))))
    return findings


_BASIS = {"dot_dimension_numbers": "the compiled HLO (dot_dimension_numbers)",
          "dim_labels": "the compiled HLO (convolution dim_labels and kernel window)",
          "operand shapes": "the op's operand and result shapes"}


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE, RuleInput.FLOPS),
            options_type=Options, check=check, doc=__doc__, uses=(RuleInput.LLO,),
            tables=(Table.OPS, Table.OP_STEP_WORST, Table.STEPS, Table.OP_METADATA))
