"""`tpudiag memory`: the device memory of compiled programs as a terminal table, JSON or markdown.

One section per source of memory facts in `MemoryReport` (today: the compiled programs); a new
source adds its own `_terminal_*` / JSON key / markdown function here and a line in each of
`render_memory_terminal`, `memory_json` and `memory_markdown`, leaving the existing keys alone.

JSON contract (stable keys; everything else may grow): `input`, `programs[]` with `module`,
`generation`, `hbm_capacity_bytes`, `hbm_usable_bytes`, `usable_source`, `hbm_peak_bytes`,
`does_not_fit`, `first_lever` (key of the lever to try first), `oom_recorded`, `compiler_peak_bytes`, `error` (null or `space`, `kind`,
`required_bytes`, `available_bytes`, `message`), `spaces[]` (`space`, `color`, `peak_bytes`,
`argument_bytes`, `output_bytes`, `temp_bytes`, `constant_bytes`, `alias_bytes`, `peak_position`,
`groups[]` (`label`, `kind`, `count`, `size_bytes`, `source`),
`live_at_peak[]`: `name`, `instruction`, `kind`, `size_bytes`, `logical_bytes`, `shape`,
`op_name`, `source_file`, `source_line`), `levers[]` (`key`, `title`, `saving_bytes`,
`explanation`, `fix`), `vmem_scoped_limit_bytes`, `vmem_limit_source`, `vmem_capacity_bytes`,
`vmem_ops[]` (`op`, `scoped_bytes`, `source`, `op_name`, `kernel`), `workload`, `workload_evidence`,
`near_fraction`, `headroom_bytes`, `capacity_source`, `mesh_devices`; `errors[]` (with `form`,
`form_text`, the breakdowns and `allocations[]`); `standalone_errors[]` (`error`, `levers[]`,
`first_lever`); `folded_programs`; `warnings`. Sizes are integer bytes (docs/json.md).
"""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from tpudiag.model.memory import MemoryLever, MemoryReport, OomAnalysis, OomError, ProgramMemory, SpaceMemory
from tpudiag.model.text import one_line
from tpudiag.model.units import fmt_bytes, fmt_pct

TOP_BUFFERS = 15


def _short_source(path: str, line) -> str:
    """`file.py:12` for a table (the full path is in the JSON)."""
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"


def _pct(part: int | None, whole: int | None) -> str:
    return fmt_pct(part / whole) if part is not None and whole else "-"


def _limit_line(p: ProgramMemory) -> str:
    peak, limit = p.hbm_peak_bytes, p.hbm_limit_bytes
    source = f" ({p.capacity_source})" if p.hbm_capacity_bytes and p.capacity_source else ""
    capacity = f"{fmt_bytes(p.hbm_capacity_bytes)} HBM{source}" if p.hbm_capacity_bytes else "HBM size unknown"
    usable = f", {fmt_bytes(p.hbm_usable_bytes)} usable ({p.usable_source})" if p.hbm_usable_bytes else ""
    chip = f"{p.generation}: " if p.generation else ""
    verdict = ""
    if peak is not None and limit:
        verdict = (f"; does NOT fit: {fmt_bytes(peak - limit)} over" if p.does_not_fit
                   else f"; peak is {_pct(peak, limit)} of usable")
    elif p.does_not_fit:
        verdict = "; the compiler ran out of memory"
    return f"{chip}{capacity}{usable}{verdict}"


def _spaces_table(spaces: tuple[SpaceMemory, ...]) -> Table:
    t = Table(title=None, show_edge=False, pad_edge=False, box=None)
    for col in ("space", "peak", "arguments", "outputs", "temporaries", "constants", "aliased"):
        t.add_column(col, justify="left" if col == "space" else "right")
    for s in spaces:
        t.add_row(s.space, fmt_bytes(s.peak_bytes), fmt_bytes(s.argument_bytes), fmt_bytes(s.output_bytes),
                  fmt_bytes(s.temp_bytes), fmt_bytes(s.constant_bytes), fmt_bytes(s.alias_bytes))
    return t


def _groups_table(s: SpaceMemory, top: int) -> Table:
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col, justify in (("#", "right"), ("argument or op", "left"), ("kind", "left"), ("buffers", "right"),
                         ("size", "right"), ("of peak", "right"), ("source", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for i, g in enumerate(s.groups[:top], start=1):
        t.add_row(str(i), one_line(g.label), g.kind, str(g.count), fmt_bytes(g.size_bytes),
                  _pct(g.size_bytes, s.peak_bytes), one_line(_short_source(*g.source.rsplit(":", 1))) if g.source else "-")
    return t


def _vmem_table(p: ProgramMemory, top: int) -> Table:
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col, justify in (("#", "right"), ("op", "left"), ("kind", "left"), ("scoped VMEM", "right"),
                         ("of limit", "right"), ("JAX op", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for i, v in enumerate(p.vmem_ops[:top], start=1):
        t.add_row(str(i), one_line(v.op), "Pallas kernel" if v.kernel else "XLA op", fmt_bytes(v.scoped_bytes),
                  _pct(v.scoped_bytes, p.vmem_scoped_limit_bytes), one_line(v.op_name) or "-")
    return t


def _buffers_table(s: SpaceMemory, top: int) -> Table:
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col, justify in (("#", "right"), ("buffer", "left"), ("kind", "left"), ("size", "right"),
                         ("padding", "right"), ("shape", "left"), ("op", "left"), ("source", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for i, b in enumerate(s.live_at_peak[:top], start=1):
        pad = b.padding_bytes
        t.add_row(str(i), one_line(b.name), b.kind + (" (donated)" if b.aliased else ""), fmt_bytes(b.size_bytes),
                  fmt_bytes(pad) if pad else "-", one_line(b.shape.split("{")[0]), one_line(b.op_name) or "-",
                  one_line(_short_source(b.source_file, b.source_line)) if b.source_line else "-")
    return t


def _compiler_peak_note(p: ProgramMemory) -> str:
    """Why `memory_analysis()` says more than the HBM buffer assignment, where the VMEM heap explains it:
    on TPU its peak counts HBM arguments and outputs plus the VMEM temporaries' heap (measured
    exactly on one-chip v5e compiles: 4 + 4 MiB of HBM and a 6 MiB VMEM heap gave 14 MiB)."""
    hbm, vmem = p.hbm, p.space("vmem")
    if p.compiler_peak_bytes is None or hbm is None or vmem is None or p.compiler_peak_bytes <= hbm.peak_bytes:
        return ""
    counted = hbm.argument_bytes + hbm.output_bytes + vmem.temp_bytes
    rest = p.compiler_peak_bytes - counted
    note = f"; it counts the {fmt_bytes(vmem.temp_bytes)} VMEM heap beside HBM's arguments and outputs"
    return note + (f", {fmt_bytes(rest)} more unexplained" if rest > 0.01 * p.compiler_peak_bytes else "")


def _workload_line(p: ProgramMemory) -> str:
    if not p.workload:
        return ""
    mesh = f", partitioned over {p.mesh_devices} devices" if p.mesh_devices > 1 else ""
    return f"{'a training step' if p.workload == 'training' else 'inference'}{mesh}: {p.workload_evidence}"


def _levers_renderables(levers: tuple[MemoryLever, ...], first: str, need: str,
                        order: str = "by modelled HBM saving") -> list[RenderableType]:
    out: list[RenderableType] = [Text(f"\nLevers, {order} (upper bounds; they overlap, never add them)", style="bold")]
    for i, lv in enumerate(levers, start=1):
        mark = "  ← first: the cheapest that is enough" if lv.key == first else ""
        out.append(Text(f"  {i}. {one_line(lv.title)}: frees up to {fmt_bytes(lv.saving_bytes)}{mark}"))
        if lv.precondition:
            out.append(Text(f"     because: {one_line(lv.precondition)}", style="dim"))
        out.append(Text(f"     do: {one_line(lv.fix)}", style="dim"))
    if not first:
        out.append(Text(f"  no single lever frees {need} alone: combine them", style="yellow"))
    return out


def _need_text(p: ProgramMemory) -> str:
    peak, limit = p.hbm_peak_bytes, p.hbm_limit_bytes
    if peak is None or limit is None:
        return "enough"
    if p.does_not_fit:
        return f"the {fmt_bytes(max(peak - limit, 0))} overrun"
    return f"the {fmt_bytes(peak - p.near_fraction * limit)} above {fmt_pct(p.near_fraction)} of usable"


def _headroom_line(p: ProgramMemory) -> str:
    room, limit = p.headroom_bytes, p.hbm_limit_bytes
    if room is None or not limit:
        return ""
    return (f"  no lever needed: {fmt_bytes(room)} of headroom ({_pct(room, limit)} of usable HBM free; "
            f"levers are offered from {fmt_pct(p.near_fraction)} of usable on)")


def program_renderables(p: ProgramMemory, top: int = TOP_BUFFERS) -> list[RenderableType]:
    """One program's memory as rich renderables: the terminal command and the TUI both show these."""
    out: list[RenderableType] = [
        Text.assemble(("Program ", "bold"), (one_line(p.module), "bold cyan"), f"  {one_line(p.path)}"),
        Text(f"  {_limit_line(p)}")]
    if p.workload:
        out.append(Text(f"  {one_line(_workload_line(p))}"))
    if p.error is not None:
        out.append(Text(f"  compiler error: {one_line(p.error.message)}", style="red"))
    out.append(_spaces_table(tuple(s for s in p.spaces if s.peak_bytes)))
    hbm = p.hbm
    if p.compiler_peak_bytes is not None and hbm is not None:
        out.append(Text(f"  memory_analysis() peak: {fmt_bytes(p.compiler_peak_bytes)} "
                        f"(buffer assignment: {fmt_bytes(hbm.peak_bytes)}){_compiler_peak_note(p)}", style="dim"))
    if hbm is not None and hbm.groups:
        out.append(Text("\nWhat holds HBM at the peak, by jit argument or JAX op", style="bold"))
        out.append(_groups_table(hbm, top))
    if hbm is not None and hbm.live_at_peak:
        where = f" (program position {hbm.peak_position})" if hbm.peak_position is not None else ""
        out.append(Text(f"\nLive in HBM at the peak{where}, largest first", style="bold"))
        out.append(_buffers_table(hbm, top))
        hidden = len(hbm.live_at_peak) - top
        if hidden > 0:
            out.append(Text(f"  … {hidden} more: `tpudiag memory --format json`", style="dim"))
    if p.vmem_ops:
        out.append(Text(f"\nScoped VMEM per op, largest first: limit {fmt_bytes(p.vmem_scoped_limit_bytes)} "
                        f"({p.vmem_limit_source or 'unknown'}), chip {fmt_bytes(p.vmem_capacity_bytes)}", style="bold"))
        out.append(_vmem_table(p, top))
    if p.levers:
        out += _levers_renderables(p.levers, p.first, _need_text(p))
    elif not p.needs_levers and _headroom_line(p):
        out.append(Text(_headroom_line(p), style="green"))
    elif p.needs_levers:
        out.append(Text("  no lever's precondition holds in the buffers at the peak", style="yellow"))
    out += [Text(f"warning: {one_line(w)}", style="yellow") for w in p.warnings]
    return out


def _allocations_table(e: OomError, top: int) -> Table:
    t = Table(show_edge=False, pad_edge=False, box=None)
    for col, justify in (("#", "right"), ("size", "right"), ("shape", "left"), ("unpadded", "right"),
                         ("padding", "right"), ("op", "left"), ("XLA label", "left"), ("type", "left")):
        t.add_column(col, justify=justify, overflow="fold")
    for a in e.allocations[:top]:
        pad = (f"{fmt_bytes(a.padding_bytes)} ({a.expansion:.1f}x)" if a.padding_bytes and a.expansion
               else fmt_bytes(a.padding_bytes) if a.padding_bytes else "-")
        op = " ".join(x for x in (a.op_type, a.op_name) if x) or "-"
        t.add_row(str(a.rank), fmt_bytes(a.size_bytes), one_line(a.shape.split("{")[0]) or "-",
                  fmt_bytes(a.unpadded_bytes) if a.unpadded_bytes is not None else "-", pad, one_line(op),
                  one_line(a.instruction) or "-", one_line(a.allocation_type) or "-")
    return t


def _parts_text(parts) -> str:
    return ", ".join(f"{one_line(x.name)} {fmt_bytes(x.size_bytes) if x.size_bytes is not None else 'unknown'}"
                     for x in parts)


def oom_renderables(a: OomAnalysis, top: int = TOP_BUFFERS) -> list[RenderableType]:
    """An OOM text analysed on its own: the overrun, the breakdowns, the largest allocations, the levers."""
    e = a.error
    out: list[RenderableType] = [
        Text.assemble(("Out of memory ", "bold"), (f"({e.space})", "bold red")),
        Text(f"  read as {one_line(e.form_text)}", style="dim"),
        Text(f"  {one_line(e.message)}", style="red")]
    if e.kind == "hbm-allocation":
        out.append(Text(f"  needs {fmt_bytes(e.required_bytes)} where {fmt_bytes(e.available_bytes)} is free: "
                        f"{fmt_bytes(e.over_by_bytes)} short"))
    else:
        out.append(Text(f"  needs {fmt_bytes(e.required_bytes)} of {fmt_bytes(e.available_bytes)}: "
                        f"{fmt_bytes(e.over_by_bytes)} over"))
    if e.requirement:
        out.append(Text(f"  the program's requirement by kind: {_parts_text(e.requirement)}"))
    if e.usage:
        out.append(Text(f"  total usage: {_parts_text(e.usage)}"))
    if e.persistent:
        out.append(Text(f"  persistent: {_parts_text(e.persistent)}"))
    if e.output_bytes is not None:
        out.append(Text(f"  outputs {fmt_bytes(e.output_bytes)}, sharing {fmt_bytes(e.output_shared_bytes or 0)} "
                        "with the arguments"))
    if e.programs:
        out.append(Text(f"  program named: {', '.join(one_line(n) for n in e.programs)}"))
    if e.allocations:
        out.append(Text(f"\nLargest allocations in {e.space}, as the error lists them", style="bold"))
        out.append(_allocations_table(e, top))
    if a.levers:
        out += _levers_renderables(a.levers, a.first, f"the {fmt_bytes(max(e.over_by_bytes, 0))} overrun",
                                   "in the order the error's facts give them: padding, temporaries, donation, remat")
    elif e.space == "hbm":
        out.append(Text("  no lever follows from this text alone: rerun with XLA_FLAGS=--xla_dump_to=DIR and "
                        "`tpudiag memory DIR --error FILE`", style="yellow"))
    return out


def memory_renderables(report: MemoryReport, top: int = TOP_BUFFERS) -> list[RenderableType]:
    """The whole memory report, program by program, then errors joined to no program and notes."""
    out: list[RenderableType] = []
    for a in report.standalone:
        out += oom_renderables(a, top) + [Text("")]
    folded = [report.programs[i] for i in report.folded]
    for i, p in enumerate(report.programs):
        if i not in report.folded:
            out += program_renderables(p, top) + [Text("")]
    if folded:
        largest = max(p.hbm_peak_bytes or 0 for p in folded)
        out.append(Text(f"{len(folded)} more program{'s' * (len(folded) != 1)} of at most {fmt_bytes(largest)} of "
                        f"HBM each: {', '.join(one_line(p.module) for p in folded[:5])}"
                        f"{' …' if len(folded) > 5 else ''} (`--format json` lists them)", style="dim"))
    out += [Text(f"warning: {one_line(w)}", style="yellow") for w in report.warnings]
    return out


def render_memory_terminal(report: MemoryReport, console: Console, top: int = TOP_BUFFERS) -> None:
    console.print(Text.assemble(("tpudiag memory", "bold"), f"  {one_line(report.input_path)}"))
    console.print()
    for item in memory_renderables(report, top):
        console.print(item)


def _error_json(e: OomError | None) -> dict | None:
    return None if e is None else asdict(e)


def _program_json(p: ProgramMemory) -> dict:
    return {
        "module": p.module, "path": p.path, "generation": p.generation,
        "hbm_capacity_bytes": p.hbm_capacity_bytes, "hbm_usable_bytes": p.hbm_usable_bytes,
        "usable_source": p.usable_source, "hbm_peak_bytes": p.hbm_peak_bytes, "does_not_fit": p.does_not_fit, "first_lever": p.first,
        "oom_recorded": p.oom_recorded, "compiler_peak_bytes": p.compiler_peak_bytes, "error": _error_json(p.error),
        "spaces": [{**{k: v for k, v in asdict(s).items() if k not in ("live_at_peak", "timeline_bytes", "groups")},
                    "groups": [asdict(g) for g in s.groups],
                    "live_at_peak": [asdict(b) for b in s.live_at_peak]} for s in p.spaces],
        "levers": [asdict(lv) for lv in p.levers],
        "workload": p.workload, "workload_evidence": p.workload_evidence, "near_fraction": p.near_fraction,
        "headroom_bytes": p.headroom_bytes, "capacity_source": p.capacity_source, "mesh_devices": p.mesh_devices,
        "vmem_scoped_limit_bytes": p.vmem_scoped_limit_bytes, "vmem_limit_source": p.vmem_limit_source,
        "vmem_capacity_bytes": p.vmem_capacity_bytes, "vmem_ops": [asdict(v) for v in p.vmem_ops],
        "warnings": list(p.warnings),
    }


def memory_json(report: MemoryReport) -> dict:
    return {"input": report.input_path, "programs": [_program_json(p) for p in report.programs],
            "errors": [{**asdict(e), "form_text": e.form_text} for e in report.errors],
            "warnings": list(report.warnings),
            "standalone_errors": [{"error": {**asdict(a.error), "form_text": a.error.form_text},
                                   "levers": [asdict(lv) for lv in a.levers], "first_lever": a.first}
                                  for a in report.standalone],
            "folded_programs": [report.programs[i].module for i in report.folded]}
