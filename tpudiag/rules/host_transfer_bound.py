"""Steps held up by async copies between host memory and HBM (offload, prefetch).

What it does
------------
Measures, per step, the time the core spends in async copies whose source or destination is
host memory (`S(5)` in the op's layout: arrays with JAX's `pinned_host` memory kind, offloaded
optimizer state, activations or a KV cache), on the core that waits most. Reports it when it is
at least `min_share` of the step, with the bytes each direction moves per step, the bandwidth the
copies achieved and the host link's nominal bandwidth for the generation.

Why it matters
--------------
The host link (PCIe) is about 50x slower than HBM: 5 GiB takes about 170 ms at 32 GB/s. A copy
the program waits for in its `copy-done` leaves the TensorCore idle for as long as the transfer
takes, and the step breakdown would otherwise count that wait as compute.

Evidence
--------
Per direction: copies and bytes per step, the time waited, the achieved bandwidth (bytes over the
union of the copies' windows, from `copy-start` to the end of `copy-done`) and the nominal link.
The ops waited in, most time first. The compute a step has to hide the copies behind, and the
HBM free at the program's peak (from the buffer assignment, when the compiled HLO is there).

How to fix
----------
Each lever is listed only where its precondition holds. Start the copy earlier so it overlaps
compute (the step needs compute to hide it behind: at least `min_overlap_compute` of the wait). Keep the array in HBM when it fits (the free
HBM at the program's peak covers the bytes). Move fewer bytes (only the slices a step uses). Keep
offloaded state in a narrower dtype (an f32 array as bf16 moves half the bytes).

Bad: `copy-done` waits 575 ms per step for 16 GB of f32 from host memory at 27 GB/s.
Good: the copies start a step ahead and finish behind compute; the breakdown shows no host transfers.

Savings estimate
----------------
Measured: the time per step spent in the host copies' ops on the core that waits most; hiding or
removing every transfer shortens a step by at most that.

Known limits
------------
Copies are found from the trace's op metadata (HLO text or shape with layout); a trace without
layouts shows none. Bytes are the arrays' logical bytes. The link figure is nominal, per chip and
direction, from public material (`model.hardware`); the achieved bandwidth is per core.

Options
-------
- `min_share` (0.1): host-copy time per step, as a fraction of the step, from which a finding is made.
- `high_share` (0.3): share from which a finding is high severity.
- `medium_share` (0.1): share from which a finding is medium severity.
- `max_ops_shown` (4): copy ops named, most time first.
- `min_overlap_compute` (0.05): the overlap lever needs compute per step of at least this share of the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analysis.host_transfers import transfer_rates
from tpudiag.model.findings import Basis, Evidence, Finding, Quantity, Saving, Severity
from tpudiag.model.memory import ProgramMemory
from tpudiag.model.report import HostTransferRate
from tpudiag.model.units import fmt_bandwidth, fmt_pct, fmt_time
from tpudiag.rules.base import (Rule, RuleContext, RuleInput, SeverityScale, Table, per_step_worst_core,
                                step_basis)

CODE = "TPD112"
NAME = "host-transfer-bound"
WIDE_DTYPES = ("f32", "f64")  # offloaded state a narrower dtype would halve


@dataclass(frozen=True)
class Options:
    min_share: float = 0.1
    high_share: float = 0.3
    medium_share: float = 0.1
    max_ops_shown: int = 4
    min_overlap_compute: float = 0.05

    def __post_init__(self):
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"min_share must be in [0, 1], got {self.min_share}")
        if self.max_ops_shown < 1:
            raise ValueError(f"max_ops_shown must be at least 1, got {self.max_ops_shown}")


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


@dataclass(frozen=True)
class HbmRoom:
    """HBM free at the peak of the program that runs the copies, from its buffer assignment."""

    module: str
    free_bytes: int
    limit_bytes: int
    peak_bytes: int


def _hbm_room(memory: tuple[ProgramMemory, ...], modules: set[str]) -> HbmRoom | None:
    rooms = [HbmRoom(p.module, p.hbm_limit_bytes - p.hbm_peak_bytes, p.hbm_limit_bytes, p.hbm_peak_bytes)
             for p in memory if p.module in modules and p.hbm_limit_bytes and p.hbm_peak_bytes is not None]
    return min(rooms, key=lambda r: (r.free_bytes, r.module), default=None)


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    steps = analysis.steps
    if steps.empty or not steps["host_transfer_ps"].any():
        return []
    basis = step_basis(analysis)
    wait = per_step_worst_core(steps, "host_transfer_ps", basis)
    share = wait / basis.step_ps if basis.step_ps else 0.0
    if share < options.min_share or wait <= 0:
        return []
    link = ctx.chip.host_link_bytes_per_s if ctx.chip is not None else None
    rates = transfer_rates(analysis.host_transfers, steps, link)
    ranked = sorted(((w, name) for r in rates for name, w in _op_waits(analysis, r).items()),
                    key=lambda x: (-x[0], x[1]))
    total = sum(w for w, _ in ranked)
    ops = [name for w, name in ranked if w >= 0.05 * total][:options.max_ops_shown]  # the ones waited in
    per_dir = "; ".join(_direction_text(r) for r in rates)
    listed = ", ".join(f"`{n}`" for n in ops)
    message = (f"host transfers hold each {fmt_time(basis.step_ps)} step for {fmt_time(wait)} ({fmt_pct(share)}), "
               f"waiting in {listed}: {per_dir}")
    compute = per_step_worst_core(steps, "compute_ps", basis)
    modules = set(analysis.ops.loc[analysis.ops["name"].astype(str).isin(
        {n for r in rates for n in r.ops}), "module"].astype(str))
    room = _hbm_room(ctx.memory, modules)
    to_device = sum(r.bytes_per_step for r in rates if r.direction == "host to HBM")
    levers = _levers(rates, compute if compute >= options.min_overlap_compute * wait else 0.0, wait, to_device, room)
    evidence = [Evidence(r.direction, _rate_values(r)) for r in rates]
    evidence.append(Evidence("step", (("host-copy wait/step", fmt_time(wait)), ("compute/step", fmt_time(compute)),
                                      ("step", fmt_time(basis.step_ps)))))
    evidence.append(_hbm_evidence(room, to_device))
    quantities = (Quantity("step", "host-copy wait per step (ps)", round(wait)),
                  *(Quantity(r.direction, "bytes per step", round(r.bytes_per_step)) for r in rates),
                  *(Quantity(r.direction, "achieved bytes/s", round(r.achieved_bytes_per_s))
                    for r in rates if r.achieved_bytes_per_s))
    scale = SeverityScale(options.high_share, options.medium_share)
    saving = Saving(int(round(wait)), Basis.MEASURED,
                    "time per step in the host copies' ops on the core that waits most; hiding or removing "
                    "every transfer saves at most this")
    return [Finding(rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message, saving=saving,
                    fix="; ".join(levers), evidence=tuple(evidence), ops=tuple(ops), quantities=quantities)]


def _op_waits(analysis, rate: HostTransferRate) -> dict[str, float]:
    t = analysis.host_transfers
    mine = t[t["direction"].astype(str) == rate.direction]
    return {str(k): float(v) for k, v in mine.groupby(mine["name"].astype(str))["wait_ps"].sum().items()}


def _direction_text(r: HostTransferRate) -> str:
    text = f"{r.direction} {_gb(r.bytes_per_step)} per step"
    if r.achieved_bytes_per_s:
        text += f" at {fmt_bandwidth(r.achieved_bytes_per_s)} per core"
    elif r.above_link:
        text += " (rate n/a: its windows imply more than the nominal link)"
    if r.link_bytes_per_s:
        text += f" (host link nominal {fmt_bandwidth(r.link_bytes_per_s)})"
    return text


def _rate_values(r: HostTransferRate) -> tuple[tuple[str, str], ...]:
    share = r.link_share
    return (("copies/step", f"{r.transfers_per_step:.3g}"), ("bytes/step", _gb(r.bytes_per_step)),
            ("waited/step", fmt_time(r.wait_ps)), ("achieved (per core)", fmt_bandwidth(r.achieved_bytes_per_s)),
            ("host link (nominal)", fmt_bandwidth(r.link_bytes_per_s) if r.link_bytes_per_s else "unknown"),
            ("of nominal", fmt_pct(share) if share is not None else "n/a"),
            ("dtypes", ", ".join(r.dtypes) or "unknown"), ("ops", ", ".join(r.ops)))


def _fits(room: HbmRoom | None, to_device: float) -> bool | None:
    return None if room is None else to_device <= room.free_bytes


def _hbm_evidence(room: HbmRoom | None, to_device: float) -> Evidence:
    if room is None:
        return Evidence("HBM free", (("at the program's peak", "unknown (no buffer assignment: the compiled HLO "
                                                                "gives it)"), ("prefetched/step", _gb(to_device))))
    fits = "fits" if _fits(room, to_device) else "does not fit"
    return Evidence("HBM free", (("program", room.module), ("peak", _gb(room.peak_bytes)),
                                 ("limit", _gb(room.limit_bytes)), ("free at the peak", _gb(room.free_bytes)),
                                 ("prefetched/step", _gb(to_device)), ("kept in HBM", fits)))


def _levers(rates: tuple[HostTransferRate, ...], compute_ps: float, wait_ps: float, to_device: float,
            room: HbmRoom | None) -> list[str]:
    """The levers whose precondition holds (or, for HBM room, cannot be told without the buffer assignment)."""
    levers = []
    if compute_ps > 0:
        levers.append(f"start the copies earlier so they overlap compute (the step has {fmt_time(compute_ps)} of "
                      f"compute to hide up to {fmt_time(min(compute_ps, wait_ps))} behind)")
    fits = _fits(room, to_device)
    if to_device and fits is None:
        levers.append(f"keep the prefetched arrays ({_gb(to_device)} per step) in HBM if they fit: free HBM is "
                      "unknown without the program's buffer assignment")
    elif to_device and fits:
        levers.append(f"keep the prefetched arrays in HBM: {_gb(to_device)} fits in the {_gb(room.free_bytes)} "
                      f"free at `{room.module}`'s peak")
    levers.append("move fewer bytes: copy only the slices a step uses, or offload less")
    wide = sorted({d for r in rates for d in r.dtypes if d in WIDE_DTYPES})
    if wide:
        levers.append(f"keep offloaded state in a narrower dtype: the copies move {'/'.join(wide)}, bf16 halves the "
                      "bytes where its precision allows")
    return levers


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=(RuleInput.TRACE,), options_type=Options,
            check=check, doc=__doc__, uses=(RuleInput.HLO,), tables=(Table.STEPS,))
