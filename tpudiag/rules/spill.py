"""Ops whose compiled LLO spills vector registers to VMEM.

What it does
------------
Reads per-op spill and fill counts from the LLO dumps (`--dumps DIR`, the LLO parser's per-op
table: VMEM spill stores, fills and bundles) and flags ops that spill, joined to the trace by op name so the
ones that cost device time come first.

Why it matters
--------------
A spill is a vector store to VMEM and a fill a load back: they take load/store slots from the
real work and lengthen the bundle schedule. Large XLA fusions and Pallas kernels with big blocks
spill hundreds to thousands of times (a 512,2048,512 Pallas matmul block: 873 spills, 1,897
fills on v5e).

Evidence
--------
Per op: spills, fills, bundles (when the dump has them) and the op's self time in the trace.

How to fix
----------
Reduce the live vector state: smaller Pallas block sizes, fewer values kept live across a loop,
splitting a fusion whose intermediates do not fit in the 64 vector registers.

On a Pallas matmul kernel whose serialised body is at hand (`parsers.mosaic`), the finding names its
blocks (bm x bk x bn) and the fix names the block dim whose halving shrinks one grid step's vector
tiles most (A bm x bk, B bk x bn, the f32 product bm x bn), keeping it a multiple of 128, with the
`lab tune FILE:FN --param KEYWORD=...` command that compiles both deviceless: fewer live bytes do
not promise fewer spills (the compiler decides), so the fix says what halves and how to check. FN
is the top-level function around the `pallas_call` (the custom call's source line) and KEYWORD its
keyword for the dim (`bn`, `block_n`, `tn`, ...), read from the source when its file is here; else
the command says `MODULE:FN` / `NAME` and what to substitute.

Bad: a Pallas kernel with 1024-row f32 blocks kept live: 82 spills.
Good: the same kernel with 256-row blocks: 0 spills.

Savings estimate
----------------
Compiler estimate: self time per step x (spills + fills) / bundles, when the dump gives the
op's bundle count (its program's schedule analysis, else the bundle profile: the static bundles of
the op in the top-level program, which a misc-only dump has too); otherwise not estimated (0). An upper bound: a spill can share its bundle
with other work.

Known limits
------------
Needs LLO dumps from the same compilation as the trace; skipped without them. Ops are matched by
name; an op missing from the trace is reported with no time. On an LLO dump alone (no trace and
no TPU generation to model one) spills are still reported, with no saving.

Options
-------
- `min_spills` (1): report ops with at least this many spills plus fills.
- `max_findings` (5): report at most this many ops.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.kernels import halving, tune_command
from tpudiag.model.llo import LloDump
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, StepBasis, Table, op_events,
                                per_step_worst_core, step_basis)

CODE = "TPD104"
NAME = "spill"


@dataclass(frozen=True)
class Options:
    min_spills: int = 1
    max_findings: int = 5
    high_share: float = 0.15
    medium_share: float = 0.03

    def __post_init__(self):
        if self.min_spills < 1:
            raise ValueError(f"min_spills must be at least 1, got {self.min_spills}")
        if self.max_findings < 1:
            raise ValueError(f"max_findings must be at least 1, got {self.max_findings}")


@dataclass(frozen=True)
class OpSpills:
    """What the rule needs per op from an LLO dump."""

    op: str
    spills: int
    fills: int
    bundles: int | None = None


def _na_int(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def op_spills(dumps: Iterable[LloDump]) -> list[OpSpills]:
    """Per-op spill records from LLO dumps' per-op tables (`ops`: `name`, `spill_stores`,
    `spill_fills` and, when the dump has it, `bundles`; NA = the dump says nothing)."""
    out = []
    for dump in dumps:
        df = dump.ops
        if df.empty:
            continue
        bundles = df["bundles"] if "bundles" in df.columns else [None] * len(df)
        out.extend(OpSpills(str(n), _na_int(s) or 0, _na_int(f) or 0, _na_int(b) or None)
                   for n, s, f, b in zip(df["name"], df["spill_stores"], df["spill_fills"], bundles))
    return out


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    records = [r for r in op_spills(ctx.compiled.llo) if r.spills + r.fills >= options.min_spills]
    if not records:
        return []
    # Without a timeline (an LLO dump of unknown generation) spills are still counted; the saving
    # is then 0: the time they cost is unknown.
    timed = analysis is not None and analysis.n_events > 0
    basis = step_basis(analysis) if timed else StepBasis(1, 0.0, True)
    scale = SeverityScale(options.high_share, options.medium_share)
    # Kernels the timeline does not list are timed as the entry op the join rolled their spills into.
    inside = ctx.join.runs_inside if timed and ctx.join is not None else {}
    events = op_events(analysis, {inside.get(r.op, r.op) for r in records}) if timed else None
    candidates = []
    for rec in records:
        timed_as = inside.get(rec.op, rec.op)
        self_per_step = per_step_worst_core(events[events["name"] == timed_as], "self_ps", basis) if timed else 0.0
        fraction = min(1.0, (rec.spills + rec.fills) / rec.bundles) if rec.bundles else 0.0
        candidates.append((self_per_step * fraction, self_per_step, rec, fraction))
    candidates.sort(key=lambda c: (-c[0], -c[1], -(c[2].spills + c[2].fills), c[2].op))
    kernels = {name: k for p in ctx.compiled.programs for name, k in p.kernels.items()}
    findings = []
    for saving, self_per_step, rec, fraction in candidates[:options.max_findings]:
        step_share = saving / basis.step_ps if basis.step_ps else 0.0
        # A modelled timeline (static mode, `simulate`) is not a trace: its times are estimates.
        where = "modelled" if timed and analysis.profile.modelled else "in the trace"
        in_trace = f"{fmt_time(self_per_step)} per step {where}" if self_per_step else f"not {where}"
        owner = inside.get(rec.op)
        if owner:
            in_trace = f"inside `{owner}`, " + (f"which takes {fmt_time(self_per_step)} per step {where}"
                                                 if self_per_step else f"not {where}")
        message = f"`{rec.op}` spills {rec.spills} vector registers and fills {rec.fills} ({in_trace})"
        if rec.bundles:
            message += f"; {fmt_pct(fraction)} of its {rec.bundles} bundles"
            explanation = (f"self time per step of `{owner}`, which runs it, x (spills + fills) / bundles" if owner
                           else "self time per step x (spills + fills) / bundles")
        else:
            explanation = "the dump gives spill counts but no bundle count"
        values = [("spills", str(rec.spills)), ("fills", str(rec.fills))]
        if rec.bundles:
            values.append(("bundles", str(rec.bundles)))
        if owner:
            values.append(("runs inside", owner))
        values.append(("self time/step", fmt_time(self_per_step)))
        fix = "reduce live vector state: smaller block sizes or fewer values live across the loop"
        kernel = kernels.get(rec.op)
        if kernel is not None:
            values.append(("kernel", kernel.describe()))
            half = halving(kernel)
            if half is not None:
                message += f"; Pallas `{kernel.name}` blocks bm x bk x bn {'x'.join(map(str, kernel.matmul_blocks))}"
                fix = (f"smaller blocks: {half.text()}; compare candidates deviceless with "
                       f"{tune_command(kernel, half.dim, (half.after, half.before))}")
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(step_share, RULE.severity) if rec.bundles else Severity.LOW,
            message=message, saving=Saving(int(round(saving)), Basis.COMPILER_ESTIMATE, explanation),
            fix=fix,
            evidence=(Evidence(rec.op, tuple(values)),),
            host=analysis.profile.hosts[0].host if timed and len(analysis.profile.hosts) == 1 else "",
            ops=(rec.op, owner) if owner else (rec.op,)))
    return findings


RULE = Rule(code=CODE, name=NAME, severity=Severity.MEDIUM, inputs=(RuleInput.LLO,), options_type=Options,
            check=check, doc=__doc__, uses=(RuleInput.TRACE,), tables=(Table.OP_STEP_WORST, Table.STEPS), tpu_only=True)
