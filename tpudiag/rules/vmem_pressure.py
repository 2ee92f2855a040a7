"""Kernels and fusions whose scoped VMEM is at or over their limit, and VMEM out-of-memory errors.

What it does
------------
Compares the scoped VMEM each op of the compiled program uses while it runs (a Pallas kernel's
blocks and scratch, a fusion's windows) with the scoped VMEM limit and the chip's VMEM. The
per-op figure comes from the LLO VMEM report (`--xla_jf_dump_to`) when dumped, else from the
op's `used_scoped_memory_configs` in the compiled HLO. It reports a Pallas kernel at or above
`near_fraction` of the default scoped limit (a larger block will not compile), any op above that
limit (it runs only because it raised its own), and a VMEM `RESOURCE_EXHAUSTED` message given
with `--error FILE` (or recorded by a failed `tpudiag compile`): the scoped form (one op over the
scoped limit) and the capacity forms (the program over the chip's VMEM).

Why it matters
--------------
A Pallas kernel whose blocks do not fit the scoped limit fails to compile with
`CompileTimeScopedVmemOom`; near the limit, the next block size in a sweep fails the same way.
Raising `vmem_limit_bytes` works up to the chip's VMEM (128 MiB on v5e and v6e, 64 MiB on v5p
and TPU7x) and leaves less for XLA's own prefetching around the kernel.

Evidence
--------
The op, its scoped VMEM, the limit and where it comes from (the compiler's error, or the
generation's default as measured: 16 MiB on v5e and v5p, 32 MiB on v6e and TPU7x), the chip's
VMEM, and the error message when there is one.

How to fix
----------
Smaller blocks (fewer rows or columns per grid step), fewer buffering levels, or a larger
`pltpu.CompilerParams(vmem_limit_bytes=...)` up to the chip's VMEM.

Bad: f32 1024 x 1024 x 1024 matmul blocks on v5e: 28 MiB of scoped VMEM against a 16 MiB limit.
Good: 512 x 512 x 512 blocks (well under 16 MiB), or `vmem_limit_bytes=64 << 20`.

Savings estimate
----------------
None in time: a VMEM error stops the compile, and headroom is not speed. A finding over a limit
carries the bytes over it.

Known limits
------------
An XLA fusion or collective near the limit is not reported: XLA sizes its own tiles to fit the
limit, so being close to it is by design and there is nothing for the user to change.
Needs the compiled HLO with its buffer assignment (an XLA dump); an LLO dump alone is not read.
A kernel that set its own `vmem_limit_bytes` is compared with the default limit, since the dumps
do not record the limit it asked for.

Options
-------
- `near_fraction` (0.9): report an op whose scoped VMEM is at least this fraction of the scoped limit.
- `max_findings` (5): report at most this many ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model.findings import Basis, Evidence, Finding, Saving, Severity
from tpudiag.model.memory import OomError, ProgramMemory, VmemUse
from tpudiag.model.units import fmt_bytes, fmt_pct
from tpudiag.rules.base import Rule, RuleContext, RuleInput, Table

CODE = "TPD110"
NAME = "vmem-pressure"


@dataclass(frozen=True)
class Options:
    near_fraction: float = 0.9
    max_findings: int = 5

    def __post_init__(self):
        if not 0 < self.near_fraction <= 1:
            raise ValueError(f"near_fraction must be in (0, 1], got {self.near_fraction}")
        if self.max_findings < 1:
            raise ValueError(f"max_findings must be at least 1, got {self.max_findings}")


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    programs = ctx.memory
    errors = [e for e in ctx.compiled.oom_errors if e.space == "vmem"]
    errors += [p.error for p in programs if p.error is not None and p.error.space == "vmem" and p.error not in errors]
    capacity = ctx.chip.vmem_bytes if ctx.chip is not None else None
    findings = [_error_finding(e, capacity) for e in errors]
    ops = [(p, v) for p in programs for v in p.vmem_ops if _near(p, v, options)]
    ops.sort(key=lambda pv: (-pv[1].scoped_bytes, pv[1].op))
    findings += [_op_finding(p, v) for p, v in ops[:options.max_findings]]
    return findings


def _near(p: ProgramMemory, v: VmemUse, options: Options) -> bool:
    # Near the limit matters only where the user picks the blocks: XLA tiles its own ops to fit it.
    limit = p.vmem_scoped_limit_bytes
    if limit is None:
        return False
    return v.scoped_bytes > limit or (v.kernel and v.scoped_bytes >= options.near_fraction * limit)


def _op_finding(p: ProgramMemory, v: VmemUse) -> Finding:
    limit, capacity = p.vmem_scoped_limit_bytes, p.vmem_capacity_bytes
    what = "Pallas kernel" if v.kernel else "op"
    chip = f"; the chip has {fmt_bytes(capacity)} of VMEM" if capacity else ""
    over = v.scoped_bytes - limit
    if over > 0:
        message = (f"{what} `{v.op}` uses {fmt_bytes(v.scoped_bytes)} of scoped VMEM, {fmt_bytes(over)} over the "
                   f"{fmt_bytes(limit)} scoped limit ({p.vmem_limit_source}): it compiled with a raised limit{chip}")
        fix = "keep `vmem_limit_bytes` within the chip's VMEM, or use smaller blocks to leave XLA room around it"
    else:
        message = (f"{what} `{v.op}` uses {fmt_bytes(v.scoped_bytes)} of scoped VMEM, {fmt_pct(v.scoped_bytes / limit)} "
                   f"of the {fmt_bytes(limit)} scoped limit ({p.vmem_limit_source}){chip}")
        fix = "a larger block will not compile: raise pltpu.CompilerParams(vmem_limit_bytes=...) before growing it"
    values = (("scoped VMEM", fmt_bytes(v.scoped_bytes)), ("limit", fmt_bytes(limit)),
              ("chip VMEM", fmt_bytes(capacity) if capacity else "-"), ("from", v.source))
    return Finding(rule=NAME, code=CODE, severity=Severity.LOW, message=message,
                   saving=Saving(0, Basis.MODELLED, "VMEM headroom is not time; the bytes over the default limit", bytes=max(over, 0)), fix=fix,
                   evidence=(Evidence(v.op, values + ((("op", v.op_name),) if v.op_name else ())),), ops=(v.op,))


def _error_finding(e: OomError, capacity: int | None) -> Finding:
    physical = f"; the chip has {fmt_bytes(capacity)} of VMEM" if capacity else ""
    op = f"`{e.hlo}` " if e.hlo else ""
    scoped = e.kind == "scoped"
    what = "scoped VMEM limit" if scoped else "VMEM"
    message = (f"{op}needs {fmt_bytes(e.required_bytes)} of VMEM, {fmt_bytes(e.over_by_bytes)} over the "
               f"{fmt_bytes(e.available_bytes)} {what}{physical}")
    fix = ("raise the limit (pltpu.CompilerParams(vmem_limit_bytes=...), up to the chip's VMEM) or use smaller blocks"
           if scoped else "use smaller blocks or fewer buffering levels: the kernel exceeds the chip's VMEM")
    return Finding(rule=NAME, code=CODE, severity=Severity.HIGH, message=message,
                   saving=Saving(0, Basis.MODELLED, "the bytes over the limit", bytes=max(e.over_by_bytes, 0)),
                   fix=fix, evidence=(Evidence("compiler error", (("message", e.message),)),),
                   ops=(e.hlo,) if e.hlo else (), blocking=True)


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.HLO,), options_type=Options,
            check=check, doc=__doc__, uses=(RuleInput.LLO,), tables=(Table.OPS,), tpu_only=True)
