"""Programs whose device memory peak is near or over the chip's HBM, with the levers that lower it.

What it does
------------
Reads each compiled program's buffer assignment (an XLA dump, `--dumps DIR`, or a `tpudiag
compile` output) into its memory peak: arguments, outputs, temporaries and constants, the
buffers live at the moment the temporaries peak, and the chip's usable HBM. It reports a program
whose peak is at least `near_fraction` of the usable HBM, or that ran out of memory (the dump's
`*.oom_intermediate_module.txt`, or a `RESOURCE_EXHAUSTED` text given with `--error FILE` that
names the program or matches its size). An `--error` text joined to no program is reported on its
own: its overrun, its largest allocation and the levers its own list supports. It names the
largest contributors at the peak and the levers whose precondition holds: donation
(`donate_argnums`) of arguments whose updated value the program returns in the same shape;
for a training step (it has a backward pass), rematerialisation of forward activations kept for
it (`jax.checkpoint`), a smaller microbatch, and where optimiser state is recognised, host
offload or bf16 storage of it; FSDP where parameters are sharded fewer ways than the mesh has
devices; from an error's list, the padding fix of a padded allocation and the largest
temporaries by op. VMEM, the other memory a program can run out of, is `vmem-pressure` (TPD110).

Why it matters
--------------
Running out of HBM is the most common way a TPU program fails: the compile stops with
`RESOURCE_EXHAUSTED` and nothing runs. Near the limit, the next larger batch or layer fails, and
XLA already trades time for memory (it rematerialises on its own: `.remat` instructions). An
Adam step on v5e (16 GiB, 15.75 GiB usable) with 10 layers of bf16 [8192, 8192] and no donation
peaks at 14.2 GB; 13 layers need 17.00 GiB and do not compile.

Evidence
--------
The peak split into arguments, outputs, temporaries and aliased bytes; the usable HBM and where
that figure comes from; the buffers live at the peak grouped by jit argument (`params`, `m`) or
by the JAX op that makes them, with their size, count and source line; each lever with its
modelled saving and the precondition it checked. `tpudiag memory` lists every buffer (size,
padding, instruction, op, line), says whether the program is a training step or inference, and
below `near_fraction` says the headroom instead of offering levers.

How to fix
----------
First the cheapest lever that is enough on its own, in this order: a padding or layout change,
the largest temporaries, donation, remat, a smaller microbatch, narrower dtypes, host offload,
FSDP. When no lever alone is enough, the view says so: combine them.

Bad: `jax.jit(train_step)` returns new params, m and v beside the old ones: 6.7 GB held twice.
Good: `jax.jit(train_step, donate_argnums=(0, 1, 2))`: the outputs reuse the argument buffers.

Savings estimate
----------------
Modelled, in bytes of HBM, never in time: donation frees the outputs that could reuse a
same-shaped argument, less the temporaries that grow back (those that borrowed the outputs'
buffers, and values the compiler rematerialised to fit and would keep: on the 10-layer Adam step
it models 4.0 GiB where the recompile with donation dropped 4.0 GiB, the outputs being 6.25 GiB);
remat the forward activations live at the peak; FSDP each under-sharded array's bytes times
(1 - its shards / the mesh's devices); host offload the f32 optimiser state; halving the
microbatch half of the temporaries at the peak and of the batch arguments; bf16 half of the f32
optimiser state; from an error's list, its padding and its largest temporaries. Each is an upper
bound and levers overlap: never add them up.

Known limits
------------
Needs the buffer assignment (`*-buffer-assignment.txt`, written by `--xla_dump_to`, or the
HloProto a capture embeds when it has one). The live set at the peak needs the live-range dump
(`*-live-range.txt`); without it every temporary counts as live. The usable HBM is the
compiler's own figure only when an OOM message gives it; otherwise the v5e figure measured
from that message, else the chip's public capacity. Training is told by ops named
`transpose(jvp(...))` (JAX's backward pass); optimiser state by argument names (`opt_state`,
`mu`, `m`, ...) or by a later jit argument repeating the parameters' shapes. FSDP needs the
`sharding` of the entry parameters (XLA text dumps; not read from HloProtos). JAX argument names
for `donate_argnums` come from the parameters' op names and assume the arguments are flattened
in order.

Options
-------
- `near_fraction` (0.8): report a program whose HBM peak is at least this fraction of the usable HBM.
- `max_buffers` (5): list at most this many groups of buffers at the peak (by jit argument or JAX op) as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analysis.device_memory import NEAR_FRACTION, oom_analysis
from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.memory import MemoryGroup, OomError, ProgramMemory
from tpudiag.model.units import fmt_bytes, fmt_pct
from tpudiag.rules.base import Rule, RuleContext, RuleInput, Table

CODE = "TPD109"
NAME = "hbm-pressure"

@dataclass(frozen=True)
class Options:
    near_fraction: float = NEAR_FRACTION
    max_buffers: int = 5

    def __post_init__(self):
        if not 0 < self.near_fraction <= 1:
            raise ValueError(f"near_fraction must be in (0, 1], got {self.near_fraction}")
        if self.max_buffers < 1:
            raise ValueError(f"max_buffers must be at least 1, got {self.max_buffers}")


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    findings = [f for p in ctx.memory for f in _program_findings(p, options)]
    joined = [p.error for p in ctx.memory if p.error is not None]
    # An HBM message joined to no program (none matches it, or no dump): still say it does not fit.
    findings += [_error_only_finding(e) for e in ctx.compiled.oom_errors
                 if e.space == "hbm" and not any(e is j for j in joined)]
    return findings


def _program_findings(p: ProgramMemory, options: Options) -> list[Finding]:
    out: list[Finding] = []
    hbm, peak, limit = p.hbm, p.hbm_peak_bytes, p.hbm_limit_bytes
    if hbm is None or peak is None:
        return out
    fits = not p.does_not_fit
    if fits and (limit is None or peak < options.near_fraction * limit):
        return out
    over = peak - limit if limit is not None else 0
    first = p.first_lever
    largest = max(p.levers, key=lambda lv: lv.saving_bytes, default=None)
    split = (f"arguments {fmt_bytes(hbm.argument_bytes)}, outputs {fmt_bytes(hbm.output_bytes)}, "
             f"temporaries {fmt_bytes(hbm.temp_bytes)}, aliased {fmt_bytes(hbm.alias_bytes)}")
    if fits:  # near its limit: a program without one returned above
        message = (f"`{p.module}` peaks at {fmt_bytes(peak)} of HBM, {fmt_pct(peak / limit)} of {fmt_bytes(limit)} "
                   f"{p.limit_words} ({split})")
    else:
        how = (f"needs {fmt_bytes(peak)} of HBM, {fmt_bytes(over)} over {fmt_bytes(limit)} {p.limit_words}" if limit
               else f"ran out of HBM at {fmt_bytes(peak)}")
        message = f"`{p.module}` does not fit: it {how} ({split})"
    if hbm.groups:
        top = hbm.groups[0]
        message += f"; largest: {_group_text(top)} {fmt_bytes(top.size_bytes)}"
    if first is not None:
        message += f"; first: {first.title}"
    evidence = [Evidence(_group_text(g), (("size", fmt_bytes(g.size_bytes)), ("buffers", str(g.count)),
                                          ("source", g.source or "-")))
                for g in hbm.groups[:options.max_buffers]]
    evidence += [Evidence(f"lever: {lv.key}", (("frees up to", fmt_bytes(lv.saving_bytes)), ("do", lv.fix)))
                 for lv in p.levers]
    if p.error is not None and p.error.space == "hbm":
        evidence.insert(0, Evidence("compiler error", (("message", p.error.message),)))
    lever = first or largest
    saving = lever.saving_bytes if lever is not None else 0
    if first is not None:
        explanation = f"{first.key}: {first.explanation}; levers overlap, never add them"
    elif largest is not None:
        explanation = (f"no single lever is enough; the largest, {largest.key}: {largest.explanation}; "
                       "levers overlap, never add them")
    else:
        explanation = "no lever's precondition holds in the buffers at the peak"
    return out + [Finding(
        rule=NAME, code=CODE, severity=Severity.MEDIUM if fits else Severity.HIGH, message=message,
        saving=Saving(0, Basis.MODELLED, explanation, bytes=saving),
        fix=lever.fix if lever is not None else "lower the peak: shrink the batch or the model, or use more devices",
        evidence=tuple(evidence), ops=tuple(b.instruction for b in hbm.live_at_peak[:options.max_buffers]),
        blocking=not fits)]


def _group_text(g: MemoryGroup) -> str:
    if g.kind == "argument":
        return f"argument `{g.label}`"
    kind = ("temporaries" if g.kind == "temporary" else f"{g.kind}s") if g.count != 1 else g.kind
    return f"{kind} of `{g.label}`"


def _error_only_finding(e: OomError) -> Finding:
    """The error text on its own: its overrun, its largest allocation, and the levers its list supports."""
    analysis = oom_analysis(e)
    message = (f"the program does not fit: it needs {fmt_bytes(e.required_bytes)} of HBM, "
               f"{fmt_bytes(e.over_by_bytes)} over the {fmt_bytes(e.available_bytes)} available")
    if e.allocations:
        top = e.allocations[0]
        padded = f", padded {top.expansion:.1f}x" if top.expansion else ""
        message += f"; largest allocation: {fmt_bytes(top.size_bytes)} `{top.shape.split('{')[0]}`{padded}"
    # the cheapest that is enough, else the first the error's facts give (padding, temporaries, ...)
    lever = analysis.first_lever or next(iter(analysis.levers), None)
    if lever is not None:
        message += f"; first: {lever.title}"
    evidence = [Evidence("compiler error", (("message", e.message), ("form", e.form_text)))]
    evidence += [Evidence(f"lever: {lv.key}", (("frees up to", fmt_bytes(lv.saving_bytes)), ("do", lv.fix),
                                               ("because", lv.precondition))) for lv in analysis.levers]
    why = (f"{lever.key}: {lever.explanation}" if lever is not None
           else "no buffer assignment to model levers from: dump with XLA_FLAGS=--xla_dump_to=DIR and pass DIR")
    return Finding(
        rule=NAME, code=CODE, severity=Severity.HIGH, message=message,
        saving=Saving(0, Basis.MODELLED, why, bytes=lever.saving_bytes if lever is not None else 0),
        fix=lever.fix if lever is not None else
        "rerun the compile with XLA_FLAGS=--xla_dump_to=DIR and run `tpudiag report DIR --error FILE`",
        evidence=tuple(evidence), blocking=True)


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.HLO,), options_type=Options,
            check=check, doc=__doc__, tables=(Table.OPS,))
