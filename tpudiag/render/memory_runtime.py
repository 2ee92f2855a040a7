"""Memory as measured at run time, for `tpudiag memory`: the allocator's timeline from a capture,
and JAX's live buffers by source line (`--pprof`). Terminal tables and JSON-ready dicts.

Every number here is measured (the allocator's own counters, the runtime's live buffers); the
compiled view beside it is the compiler's plan.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tpudiag.analysis.memory_timeline import sampled
from tpudiag.model.allocator import AllocatorTimeline, HostMemoryTimeline
from tpudiag.model.live_buffers import LiveBytes
from tpudiag.model.text import one_line
from tpudiag.model.units import fmt_bytes, fmt_pct, fmt_time
from tpudiag.render.console import markup

_BARS = " ▁▂▃▄▅▆▇█"
SPARK_WIDTH = 32


def sparkline(timeline, width: int = SPARK_WIDTH) -> str:
    """Bytes in use over the capture in `width` characters, each the highest of its stretch of events."""
    values = sampled(timeline, width)["in_use_bytes"].to_numpy()
    top = values.max() if len(values) else 0
    if top <= 0:
        return ""
    return "".join(_BARS[int(round(v / top * (len(_BARS) - 1)))] for v in values)


def _share(part: int, whole: int) -> str:
    return fmt_pct(part / whole) if whole > 0 else "n/a"


def render_timelines_terminal(hosts: list[HostMemoryTimeline], console: Console, top: int = 10) -> None:
    for host in hosts:
        console.print(Text.assemble(("Memory over time", "bold"),
                                    f" (measured: the allocator's events in the capture) · host {markup(host.host)}"))
        for warning in host.warnings:
            console.print(Text(f"  warning: {one_line(warning)}", style="yellow"))
        if not host.allocators:
            console.print("  no allocator events in this capture (the runtime did not trace its allocator)")
            continue
        t = Table(show_edge=False)
        for col, right in (("memory space", False), ("events", True), ("peak in use", True), ("at", True),
                           ("of capacity", True), ("capacity", True), ("lifetime peak", True),
                           ("timeline (in use, max per stretch)", False)):
            t.add_column(col, justify="right" if right else "left", overflow="fold" if not right else "ellipsis")
        for a in host.allocators:
            t.add_row(markup(a.allocator), f"{a.events:,}", fmt_bytes(a.peak_bytes), fmt_time(a.peak_time_ps),
                      _share(a.peak_bytes, a.capacity_bytes), fmt_bytes(a.capacity_bytes),
                      fmt_bytes(a.lifetime_peak_bytes), sparkline(a.timeline))
        console.print(t)
        console.print("  at: on the capture's time axis, as `tpudiag report` places host events · capacity: in use "
                      "+ free at the peak · lifetime peak: since the allocator was made")
        # The live set of the space with the highest peak; with many devices alike, the others are in JSON.
        worst = max(host.allocators, key=lambda a: a.peak_bytes)
        _at_peak_table(worst, console, top)
        others = len(host.allocators) - 1
        if others:
            console.print(f"  live set at the peak of the other {others} memory space{'s' if others > 1 else ''}: "
                          "`--format json`")


_DETAIL_COLUMNS = (("op", lambda r: r.op), ("region", lambda r: r.region_type),
                   ("type", lambda r: "" if r.data_type == 0 else r.data_type_name), ("shape", lambda r: r.shape))


def _at_peak_table(a: AllocatorTimeline, console: Console, top: int) -> None:
    if not a.at_peak:
        return
    rows = sorted(a.at_peak, key=lambda r: -r.total_bytes)[:top]
    t = Table(title=f"Live at the peak of {markup(a.allocator)} ({fmt_bytes(a.peak_bytes)}, step {a.peak_step}; "
                    "largest first)", title_justify="left", show_edge=False)
    for col in ("bytes", "share", "count", "each"):
        t.add_column(col, justify="right")
    t.add_column("what")
    # Producers that do not say the op, region, type or shape (JAX's GPU allocator) get no empty columns.
    details = [(name, get) for name, get in _DETAIL_COLUMNS if any(get(r) for r in rows if r.attributed)]
    for name, _ in details:
        t.add_column(name, overflow="fold")
    for r in rows:
        # the op where the producer names it (a detail column), else the enclosing host events
        what = (r.annotation or "allocation") if r.attributed else r.op
        t.add_row(fmt_bytes(r.total_bytes), _share(r.total_bytes, a.peak_bytes), str(r.occurrences),
                  fmt_bytes(r.allocation_bytes), markup(what),
                  *[markup(get(r) or "-") if r.attributed else "" for _, get in details])
    console.print(t)
    if len(a.at_peak) > top:
        console.print(f"  … {len(a.at_peak) - top} more (`--top`, or `--format json` for all)")


def timelines_to_dict(hosts: list[HostMemoryTimeline], max_points: int) -> list[dict]:
    return [{"host": h.host, "path": h.path, "allocators": [_allocator_dict(a, max_points) for a in h.allocators],
             "warnings": list(h.warnings)} for h in hosts]


def _allocator_dict(a: AllocatorTimeline, max_points: int) -> dict:
    graph = sampled(a.timeline, max_points)
    return {
        "allocator": a.allocator, "events": a.events, "peak_bytes": a.peak_bytes, "peak_time_ps": a.peak_time_ps,
        "peak_heap_bytes": a.peak_heap_bytes, "peak_stack_bytes": a.peak_stack_bytes, "peak_step": a.peak_step,
        "capacity_bytes": a.capacity_bytes, "lifetime_peak_bytes": a.lifetime_peak_bytes,
        "fragmentation_at_peak": a.fragmentation_at_peak,
        "timeline": [[int(t), int(b)] for t, b in zip(graph["time_ps"].to_numpy(), graph["in_use_bytes"].to_numpy())],
        "at_peak": [{"total_bytes": r.total_bytes, "allocation_bytes": r.allocation_bytes,
                     "requested_bytes": r.requested_bytes, "occurrences": r.occurrences, "op": r.op,
                     "region_type": r.region_type, "data_type": r.data_type_name, "shape": r.shape,
                     "attributed": r.attributed, "annotation": r.annotation} for r in a.at_peak],
    }


def render_live_bytes_terminal(live: LiveBytes, console: Console, top: int = 15) -> None:
    console.print(Text.assemble(("Live device buffers by source line", "bold"),
                                f" (measured: jax.profiler.save_device_memory_profile, {markup(live.path)})"))
    devices = ", ".join(f"{markup(d.device or '?')} {fmt_bytes(d.bytes)}" for d in live.by_device)
    console.print(f"  {fmt_bytes(live.total_bytes)} in {live.total_buffers:,} buffers on {len(live.by_device)} "
                  f"device(s){': ' + devices if devices else ''}")
    if live.executables:
        code = f", {fmt_bytes(live.executable_bytes)} of generated code" if live.executable_bytes else ""
        console.print(f"  and {live.executables:,} loaded executables{code} (not counted above)")
    if live.by_line.empty:
        console.print("  no live buffers in this profile")
        return
    t = Table(show_edge=False)
    for col, right in (("bytes", True), ("share", True), ("buffers", True), ("devices", True), ("source line", False),
                       ("function", False)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in live.by_line.head(top).itertuples():
        where = f"{r.file}:{r.line}" + (" (inside JAX)" if r.internal else "")
        t.add_row(fmt_bytes(r.bytes), _share(int(r.bytes), live.total_bytes), f"{r.buffers:,}", str(r.devices),
                  markup(where), markup(r.function))
    console.print(t)
    if len(live.by_line) > top:
        console.print(f"  … {len(live.by_line) - top} more lines (`--top`, or `--format json` for all)")
    console.print("  each buffer is counted at the innermost line of its Python stack outside JAX")


def live_bytes_to_dict(live: LiveBytes) -> dict:
    rows = live.by_line
    return {
        "path": live.path, "total_bytes": live.total_bytes, "total_buffers": live.total_buffers,
        "executables": live.executables, "executable_bytes": live.executable_bytes,
        "devices": [{"device": d.device, "buffers": d.buffers, "bytes": d.bytes} for d in live.by_device],
        "by_line": [{"file": str(f), "line": int(n), "function": str(fn), "buffers": int(b), "bytes": int(by),
                     "devices": int(d), "internal": bool(i)}
                    for f, n, fn, b, by, d, i in zip(rows["file"], rows["line"], rows["function"], rows["buffers"],
                                                       rows["bytes"], rows["devices"], np.asarray(rows["internal"]))],
    }
