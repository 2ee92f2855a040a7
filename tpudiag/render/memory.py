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
`vmem_ops[]` (`op`, `scoped_bytes`, `source`, `op_name`, `kernel`); `errors[]`; `warnings`. Sizes are integer bytes.
"""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from tpudiag.model.memory import MemoryReport, OomError, ProgramMemory, SpaceMemory
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
    capacity = f"{fmt_bytes(p.hbm_capacity_bytes)} HBM" if p.hbm_capacity_bytes else "HBM size unknown"
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


def program_renderables(p: ProgramMemory, top: int = TOP_BUFFERS) -> list[RenderableType]:
    """One program's memory as rich renderables: the terminal command and the TUI both show these."""
    out: list[RenderableType] = [
        Text.assemble(("Program ", "bold"), (one_line(p.module), "bold cyan"), f"  {one_line(p.path)}"),
        Text(f"  {_limit_line(p)}")]
    if p.error is not None:
        out.append(Text(f"  compiler error: {one_line(p.error.message)}", style="red"))
    out.append(_spaces_table(tuple(s for s in p.spaces if s.peak_bytes)))
    hbm = p.hbm
    if p.compiler_peak_bytes is not None and hbm is not None:
        out.append(Text(f"  memory_analysis() peak: {fmt_bytes(p.compiler_peak_bytes)} "
                        f"(buffer assignment: {fmt_bytes(hbm.peak_bytes)})", style="dim"))
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
        out.append(Text("\nLevers, by modelled HBM saving (upper bounds; they overlap, never add them)", style="bold"))
        for i, lv in enumerate(p.levers, start=1):
            first = "  ← first: the cheapest that is enough" if lv.key == p.first else ""
            out.append(Text(f"  {i}. {one_line(lv.title)}: frees up to {fmt_bytes(lv.saving_bytes)}{first}"))
            out.append(Text(f"     do: {one_line(lv.fix)}", style="dim"))
    out += [Text(f"warning: {one_line(w)}", style="yellow") for w in p.warnings]
    return out


def memory_renderables(report: MemoryReport, top: int = TOP_BUFFERS) -> list[RenderableType]:
    """The whole memory report, program by program, then errors joined to no program and notes."""
    out: list[RenderableType] = []
    for p in report.programs:
        out += program_renderables(p, top) + [Text("")]
    joined = {id(p.error) for p in report.programs if p.error is not None}
    out += [Text(f"error given ({e.space}): {one_line(e.message)}", style="red")
            for e in report.errors if id(e) not in joined]
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
        "vmem_scoped_limit_bytes": p.vmem_scoped_limit_bytes, "vmem_limit_source": p.vmem_limit_source,
        "vmem_capacity_bytes": p.vmem_capacity_bytes, "vmem_ops": [asdict(v) for v in p.vmem_ops],
        "warnings": list(p.warnings),
    }


def memory_json(report: MemoryReport) -> dict:
    return {"input": report.input_path, "programs": [_program_json(p) for p in report.programs],
            "errors": [asdict(e) for e in report.errors], "warnings": list(report.warnings)}
