"""Render a `StaticReport` (tpudiag compile) for the terminal or as JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
from rich.console import Console
from rich.table import Table

from tpudiag.compiler.static_report import CollectiveMode, StaticReport
from tpudiag.model.report import Report
from tpudiag.model.units import fmt_bytes, fmt_time
from tpudiag.render.console import markup as m


def _int_or_none(value) -> int | None:
    return None if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) else int(value)


def static_report_dict(report: StaticReport) -> dict:
    ops = []
    for row in report.ops.itertuples(index=False):
        ops.append({
            "position": int(row.position), "name": row.name, "opcode": row.opcode, "category": row.category,
            "family": row.family, "async_role": row.async_role, "partner": row.partner,
            "estimated_cycles": _int_or_none(row.estimated_cycles), "cycles_source": row.cycles_source,
            "compute_ps": _int_or_none(row.compute_ps), "flops": float(row.flops), "flops_ps": int(row.flops_ps),
            "hbm_bytes": int(row.hbm_bytes), "hbm_ps": int(row.hbm_ps),
            "logical_bytes": int(row.logical_bytes), "padded_bytes": int(row.padded_bytes),
            "payload_bytes": int(row.payload_bytes), "group_size": int(row.group_size), "ici_ps": int(row.ici_ps),
            "window_ps": int(row.window_ps), "duration_ps": int(row.duration_ps),
            "spill_stores": _int_or_none(row.spill_stores), "spill_fills": _int_or_none(row.spill_fills),
        })
    return {
        "kind": "tpudiag.static_report",
        "basis": "modelled: compiler estimates, never measured",
        "target": report.target, "topology": report.topology, "generation": report.generation,
        "device_kind": report.device_kind, "n_devices": report.n_devices, "mesh": report.mesh,
        "module": report.module, "compile_s": report.compile_s, "wall_s": report.wall_s,
        "dump_bytes": report.dump_bytes, "static_profile": report.static_profile,
        "clock_hz": report.clock_hz, "clock_note": report.clock_note,
        "hbm_bytes_per_s": report.model.hbm_bytes_per_s,
        "ici_model": {"bytes_per_s": report.model.ici.bytes_per_s, "latency_ps": report.model.ici.latency_ps},
        "total_estimated_cycles": report.total_cycles, "total_compute_ps": report.total_compute_ps,
        "ops_without_cycles": report.ops_without_cycles,
        "ops": ops,
        "collectives": [dataclasses.asdict(c) for c in report.collectives],
        "padding": [{**dataclasses.asdict(p), "factor": p.factor} for p in report.padding],
        "memory": report.memory,
        "warnings": list(report.warnings),
    }


def _cycles(value) -> str:
    v = _int_or_none(value)
    return "-" if v is None else f"{v:,}"


def render_static_terminal(report: StaticReport, console: Console, top: int = 20,
                           max_collectives: int = 30) -> None:
    mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items())
    # Names from the dumps (module, ops, target) are escaped: these strings are parsed as rich markup.
    console.print(f"[bold]tpudiag compile[/]  {m(report.target)}  for {m(report.topology)} "
                  f"({m(report.device_kind)}, {report.n_devices} device{'s' if report.n_devices != 1 else ''}, mesh {mesh})")
    timing = f"compile {report.compile_s:.1f} s" if report.compile_s is not None else "compile time unknown"
    if report.wall_s is not None:
        timing += f" ({report.wall_s:.1f} s with the worker process)"
    size = fmt_bytes(report.dump_bytes) if report.dump_bytes is not None else "?"
    console.print(f"Module `{m(report.module)}` · {timing} · dumps {size} · static LLO profile: "
                  f"{'yes' if report.static_profile else 'no (classic cost model only)'}")
    console.print(f"Clock: {report.clock_note}. All times below are modelled, not measured.")
    ops = report.ops
    total = (f"{report.total_cycles:,} cycles" +
             (f" = {fmt_time(report.total_compute_ps)}" if report.total_compute_ps is not None else ""))
    note = "; collectives get 0 cycles from the static profile" if report.static_profile else ""
    if report.ops_without_cycles:
        note += "; those are timed at their FLOPs/bytes roofline"
    console.print(f"Σ estimated compute: {total} over {len(ops)} ops "
                  f"({report.ops_without_cycles} without a compiler estimate{note})\n")

    table = Table(title=f"Ops by estimated time (top {min(top, len(ops))} of {len(ops)})", show_edge=False)
    for col, justify in (("#", "right"), ("op", "left"), ("category", "left"), ("cycles", "right"),
                         ("compute", "right"), ("FLOPs time", "right"), ("HBM time", "right"),
                         ("ICI/transfer", "right"), ("time", "right"), ("padded / logical", "right"),
                         ("spills st/ld", "right")):
        table.add_column(col, justify=justify)
    if report.clock_hz:  # rank by modelled standalone time
        ranked = ops.sort_values(["duration_ps", "position"], ascending=[False, True])
    else:  # no clock: rank by cycles, then HBM time
        ranked = ops.assign(_c=ops["estimated_cycles"].astype("float64").fillna(-1)).sort_values(
            ["_c", "hbm_ps", "position"], ascending=[False, False, True])
    ranked = ranked.head(top)
    for i, row in enumerate(ranked.itertuples(index=False), start=1):
        compute = fmt_time(_int_or_none(row.compute_ps)) if _int_or_none(row.compute_ps) is not None else "-"
        transfer = max(int(row.ici_ps), int(row.window_ps))
        pad = (f"{fmt_bytes(row.padded_bytes)} / {fmt_bytes(row.logical_bytes)}"
               if row.padded_bytes != row.logical_bytes else fmt_bytes(row.padded_bytes))
        spills = "-" if _int_or_none(row.spill_stores) is None else \
            f"{_int_or_none(row.spill_stores)}/{_int_or_none(row.spill_fills)}"
        table.add_row(str(i), f"`{m(row.name)}`", m(row.category), _cycles(row.estimated_cycles), compute,
                      fmt_time(int(row.flops_ps)) if row.flops_ps else "-", fmt_time(int(row.hbm_ps)),
                      fmt_time(transfer) if transfer else "-", fmt_time(int(row.duration_ps)), pad, spills)
    console.print(table)

    console.print()
    if report.collectives:
        ct = Table(title="Collective schedule (entry computation order)", show_edge=False)
        for col in ("pos", "collective", "family", "mode", "done", "ops between", "group", "payload", "ICI model"):
            ct.add_column(col, justify="right" if col in ("pos", "ops between", "group", "payload", "ICI model")
                          else "left")
        shown = report.collectives[:max_collectives]
        for c in shown:
            mode = c.mode + (f" ({c.thread})" if c.thread else "")
            between = "-" if c.mode is CollectiveMode.SYNC else (f"{c.ops_between}" + (" (adjacent)" if c.ops_between == 0 else ""))
            ct.add_row(str(c.start_position), f"`{m(c.name)}`", m(c.family), mode, f"`{m(c.done)}`" if c.done else "-",
                       between, str(c.group_size or "-"), fmt_bytes(c.payload_bytes), fmt_time(c.modelled_ps))
        console.print(ct)
        if len(report.collectives) > len(shown):
            console.print(f"… {len(report.collectives) - len(shown)} more collectives in --format json")
        console.print(f"ICI model: latency {fmt_time(report.model.ici.latency_ps)} + factor x bytes / "
                      f"{report.model.ici.bytes_per_s / 1e9:g} GB/s (ring factors; see docs/compile.md)")
    else:
        console.print("Collective schedule: no collectives in the entry computation")

    console.print()
    if report.padding:
        pt = Table(title="Largest tile padding (entry instructions wasting >= 4 KiB)", show_edge=False)
        for col in ("instruction", "shape", "logical", "padded", "factor"):
            pt.add_column(col, justify="left" if col in ("instruction", "shape") else "right")
        for p in report.padding:
            pt.add_row(f"`{m(p.name)}`", m(p.shape), fmt_bytes(p.logical_bytes), fmt_bytes(p.padded_bytes),
                       f"{p.factor:.2f}x")
        console.print(pt)
    else:
        console.print("Padding: no entry instruction wastes 4 KiB or more to its tiled layout")
    spill_ops = ops[ops["spill_stores"].fillna(0) > 0]
    if len(spill_ops):
        names = ", ".join(f"`{m(r.name)}` {int(r.spill_stores)}/{int(r.spill_fills)}" for r in
                          spill_ops.sort_values("spill_stores", ascending=False).head(8).itertuples())
        console.print(f"\nSpills (VMEM stores/fills, bundle profile): {names}")
    elif ops["spill_stores"].notna().any():
        console.print("\nSpills: none in the bundle profile")
    if report.memory:
        console.print("Memory (compiler, HBM): " + ", ".join(
            f"{k.replace('_in_bytes', '').replace('_size', '')} {fmt_bytes(v)}" for k, v in report.memory.items()))
    for w in report.warnings[:5]:
        console.print(f"[yellow]warning:[/] {m(w)}", highlight=False)


def static_diagnosis_dict(report: Report, static: StaticReport | None) -> dict:
    """The static mode's JSON: the trace report's contract keys (`summary` with `mode: static`,
    `findings`, `rules_skipped`, `warnings`) plus the static report's own keys; `ops` are the
    static report's per-op estimates (empty when no program could be read)."""
    from tpudiag.render.json_format import report_to_dict

    doc = report_to_dict(report)
    if static is None:
        return {**doc, "kind": "tpudiag.static_report", "ops": []}
    return {**doc, **static_report_dict(static), "summary": doc["summary"], "warnings": doc["warnings"]}


def render_static_diagnosis_json(report: Report, static: StaticReport | None) -> str:
    return json.dumps(static_diagnosis_dict(report, static), indent=2)


def render_static_diagnosis_terminal(report: Report, static: StaticReport | None, console: Console,
                                     top: int = 20) -> None:
    """The static report's tables, then the rules' findings and every warning."""
    from rich.text import Text

    from tpudiag.render.terminal import render_findings, render_kernels

    if static is not None:
        render_static_terminal(static, console, top=top)
    else:
        console.print(Text(f"tpudiag report  {report.summary.input_path}  (compiler dumps, no modelled timeline)",
                           style="bold"))
    render_kernels(report, console)
    console.print()
    render_findings(report, console)
    shown = set(static.warnings[:5]) if static is not None else set()  # the static tables printed these
    rest = [w for w in report.warnings if w not in shown]
    if rest:
        console.print()
        console.print(Text("Warnings", style="bold"))
        for w in rest:
            console.print(Text(f"  {w}"))
