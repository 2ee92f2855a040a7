"""Terminal table for a block-size sweep. Every number says what it is: measured, estimated, computed."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tpudiag.kernels_lab.kernel_tune import KernelTuneResult
from tpudiag.kernels_lab.sweep import SweepResult
from tpudiag.render.console import markup


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def render_sweep(result: SweepResult, console: Console) -> None:
    xla = result.xla
    scaled = f", problem scaled down {result.scale_down}x" if result.scale_down > 1 else ""
    device = result.device_kind or result.generation
    console.print(f"`{result.op_name}` ({result.family}) on {result.topology} ({device}){scaled}", markup=False,
                  highlight=False)
    console.print(f"basis: {result.basis_text}", markup=False, highlight=False)
    lines = []
    if xla.measured_s is not None:
        lines.append(f"XLA op {xla.captured_basis} in the capture: {_us(xla.measured_s)} us per occurrence "
                     "(full problem, on the captured device)")
    if xla.est_cycles is not None:
        at = (f" = {_us(xla.est_s)} us at {result.clock_hz / 1e9:g} GHz, {_us(max(xla.est_s, xla.hbm_floor_s))} us "
              "with the HBM floor" if xla.est_s is not None else "")
        lines.append(f"XLA reference compiled for {result.topology}: {xla.est_cycles:,} estimated cycles{at} "
                     "(compiler estimate)")
    if xla.optimal_s is not None:
        lines.append(f"XLA reference compiled for {result.topology}: {_us(xla.optimal_s)} us by XLA's cost model "
                     "(`optimal_seconds`, modelled)")
    if xla.reference_measured_s is not None:
        lines.append(f"XLA reference measured on the attached TPU: {_us(xla.reference_measured_s)} us "
                     "(median of 10 runs)")
    if xla.est_cycles is None and (xla.status != "ok" or xla.reason):
        lines.append(f"XLA reference: {xla.reason}" if xla.status == "ok" else
                     f"XLA reference: {xla.status} {xla.reason}".rstrip())
    lines.append(f"XLA HBM floor: {_us(xla.hbm_floor_s)} us ({xla.hbm_floor_basis} / HBM bandwidth, computed)")
    for line in lines:
        console.print("  " + line, markup=False, highlight=False)
    if result.left_out:
        console.print("  the reproduction leaves out: " + "; ".join(result.left_out), markup=False, highlight=False)
    if result.reference_warning:
        console.print(f"warning: {result.reference_warning}", markup=False, highlight=False)

    timed = result.clock_hz is not None
    measured = any(r.measured_s is not None for r in result.results)
    ici = any(r.ici_s is not None for r in result.results)
    columns = [("#", True), ("blocks", True), ("steps", True), ("VMEM MiB", True), ("est. cycles", True),
               ("est. us", timed), ("ICI us", ici), ("floor us", True), ("ranked us", timed or ici),
               ("measured us", measured),
               ("x XLA", True), ("compile s", True), ("status", True)]
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name, shown in columns:
        if shown:
            table.add_column(name, justify="left" if name in ("blocks", "status") else "right", no_wrap=True)
    rank = 0
    notes: list[str] = []
    for r in result.results:
        ok = r.status == "ok"
        rank += ok
        if measured:  # measured against measured, estimate against estimate
            ratio = (f"{r.measured_s / xla.reference_measured_s:.2f}"
                     if ok and r.measured_s and xla.reference_measured_s else "-")
        else:
            ratio = (f"{r.est_cycles / xla.est_cycles:.2f}" if ok and r.est_cycles and xla.est_cycles else "-")
        status = r.status
        if r.reason:  # reasons are long: a numbered note under the table, one per distinct reason
            if r.reason not in notes:
                notes.append(r.reason)
            status = f"{r.status} [{notes.index(r.reason) + 1}]"
        cells = [str(rank) if ok else "-", r.label, f"{r.grid_steps:,}", f"{r.vmem_bytes / 2**20:.1f}",
                 f"{r.est_cycles:,}" if r.est_cycles is not None else "-", _us(r.est_s), _us(r.ici_s),
                 _us(r.hbm_floor_s),
                 _us(r.bounded_s), _us(r.measured_s), ratio,
                 f"{r.compile_s:.1f}" if r.compile_s is not None else "-", status]
        table.add_row(*[c for c, (_, shown) in zip(cells, columns, strict=True) if shown])
    console.print(table)
    for i, note in enumerate(notes, start=1):
        console.print(f"[{i}] {note}", markup=False, highlight=False)
    console.print("est. = compiler estimate (static LLO profile, modelled); floor = bytes the blocking moves / HBM "
                  "bandwidth (computed); "
                  + ("ICI = bytes sent / ICI link bandwidth (modelled); ranked = max(ICI, floor);" if ici else
                     "ranked = max(est., floor);") + " x XLA = est. cycles / the XLA reference's est. "
                  "cycles (measured / measured when timed on a TPU); VMEM MiB = our double-buffered estimate; "
                  "steps = grid steps", markup=False,
                  highlight=False, style="dim")
    console.print(f"results: `{result.jsonl}`", markup=False, highlight=False)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f}"


def render_kernel_tune(result: KernelTuneResult, console: Console) -> None:
    """`lab tune MODULE:FN`: the ranked candidates, every figure the compiler's model."""
    console.print(f"`{result.target}` on {result.topology} ({result.generation}), {len(result.candidates)} "
                  f"candidate(s), {result.jobs} compile(s) at a time", markup=False, highlight=False)
    console.print(f"basis: {result.basis}", markup=False, highlight=False)
    names = list(result.candidates[0].params) if result.candidates else []
    timed = result.clock_hz is not None
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("#", justify="right")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    headers = ["est. cycles (modelled)"] + (["est. us (modelled)"] if timed else []) + [
        "spills st/ld (modelled)", "VMEM MiB / limit (modelled)", "status"]
    for h in headers:
        table.add_column(h, justify="left" if h == "status" else "right", no_wrap=True)
    rank = 0
    notes: list[str] = []
    for c in result.candidates:
        ok = c.status == "ok" and c.est_cycles is not None
        rank += ok
        cycles = f"{c.est_cycles:,}" if c.est_cycles is not None else "-"
        us = [f"{c.est_cycles / result.clock_hz * 1e6:,.1f}" if c.est_cycles is not None else "-"] if timed else []
        spills = "-" if c.spill_stores is None and c.spill_fills is None else \
            f"{c.spill_stores or 0}/{c.spill_fills or 0}"
        fits = {True: "", False: " over"}.get(c.vmem_fits, "")
        vmem = f"{_mib(c.vmem_bytes)} / {_mib(c.vmem_limit_bytes)}{fits}"
        status = c.status
        if c.reason:  # one numbered note under the table per distinct reason, as the sweep's table does
            if c.reason not in notes:
                notes.append(c.reason)
            status += f" [{notes.index(c.reason) + 1}]"
        status += " (cached)" if c.cached else ""
        table.add_row(str(rank) if ok else "-", *(markup(str(c.params.get(n, ""))) for n in names), cycles, *us,
                      spills, vmem, status)
    console.print(table)
    for i, note in enumerate(notes, start=1):
        console.print(f"[{i}] {note}", markup=False, highlight=False)
    best = result.best
    if best is not None:
        shown = " ".join(f"{k}={v}" for k, v in best.params.items())
        console.print(f"best (modelled): {shown}, {best.est_cycles:,} estimated cycles", markup=False,
                      highlight=False)
        console.print(f"reproduce: `{result.command(best.params)}`", markup=False, highlight=False)
        console.print(f"its dumps: `{best.dump}` (cache: `{result.cache_dir}`)", markup=False, highlight=False)
