"""The current TUI view as markdown, and where to write it. No Textual here.

Each function takes the objects a view shows and formats them; nothing is computed. The file
goes where the user says, or to the current directory, and never into the trace directory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tpudiag.analysis.drilldown import OpDetail, OpFilter, op_padding, spills
from tpudiag.analysis.stragglers import HostStepMatrix
from tpudiag.analysis.timeline import StepTimeline
from tpudiag.errors import UsageError
from tpudiag.model.findings import Finding, saving_amount
from tpudiag.model.memory import MemoryReport
from tpudiag.model.report import OpRow, Report
from tpudiag.model.text import printable
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_flops, fmt_pct, fmt_time
from tpudiag.render.markdown import (breakdown_section, categories_section, code, document, finding_section, prose,
                                     table, text)
from tpudiag.writers.files import check_not_input


def _table(header: list[str], rows: list[list[object]]) -> str:
    # Every cell is input-derived or harmless: escaped as markdown prose (no HTML, links or images
    # from an op name); the report's table writer escapes its pipes.
    return "\n".join(table(header, [[text(c) for c in row] for row in rows]))


def memory_md(memory: MemoryReport) -> str:
    """The memory screen: the report's device-memory section, for the program with the largest peak."""
    from tpudiag.render.markdown import memory_section

    body = memory_section(memory.programs, {}) or ["No compiled program with a buffer assignment."]
    return document([f"# tpudiag memory: {code(memory.input_path)}", "", *body])


def overview_md(report: Report) -> str:
    s = report.summary
    out = [f"# tpudiag overview: {code(s.input_path)}", ""]
    out.append(f"- device: {text(s.device_type or s.platform)}, {len(s.hosts)} host(s), {s.n_chips} chips, "
               f"{s.n_cores} cores")
    if s.step_time:
        out.append(f"- steps: {s.step_time.count} (from {text(s.step_source)}), mean {fmt_time(s.step_time.mean_ps)}, "
                   f"p90 {fmt_time(s.step_time.p90_ps)}")
    out.append("")
    out += breakdown_section(report, {}) + categories_section(report, {})  # the markdown report's sections
    out += ["## Verdict", "", prose(verdict(report))]
    return document(out)


def verdict(report: Report) -> str:
    """One line: the top finding, or what is known when there is none."""
    if not report.findings:
        return "no findings"
    f = report.findings[0]
    return f"[{f.severity.label()}] {f.rule}: {f.message}"


def findings_md(report: Report, selected: Finding | None, explanation: str = "") -> str:
    out = ["# tpudiag findings", ""]
    if not report.findings:
        out.append("no findings")
    else:
        out.append(_table(["#", "severity", "code", "rule", "saving ≤", "message"],
                          [[i, f.severity.label(), f.code, f.rule, saving_amount(f.saving), f.message]
                           for i, f in enumerate(report.findings, start=1)]))
    if selected is not None:
        out += ["", *finding_section(selected)]  # as the markdown report writes a finding
        if explanation:
            out += [explanation, ""]
    for skip in report.rules_skipped:
        out.append(f"- skipped {text(skip.rule)}: {prose(skip.reason)}")
    return document(out)


# The sortable measures first, so a narrow terminal cuts the descriptive columns, not the numbers.
OP_HEADER = ["op", "per step", "share", "FLOP util", "HBM BW", "padding", "spills", "host", "category", "program"]


def op_cells(op: OpRow) -> list[str]:
    """The ops table's cells, shared by the TUI table and the markdown export."""
    sp = spills(op)
    return [op.name, op.time_cell, fmt_pct(op.time_share), fmt_pct(op.flop_utilization),
            fmt_bandwidth(op.hbm_bw) if op.hbm_bytes else "n/a", fmt_pct(op_padding(op)),
            "n/a" if sp is None else str(sp), op.host, op.category, op.program]


def ops_md(ops: tuple[OpRow, ...], f: OpFilter, sort_label: str, descending: bool) -> str:
    out = ["# tpudiag ops", ""]
    shown = [f"sorted by {sort_label} ({'descending' if descending else 'ascending'})"]
    for label, value in (("text", f.text), ("category", f.category), ("host", f.host), ("program", f.program)):
        if value:
            shown.append(f"{label} = {code(value)}")
    out += ["; ".join(shown), "", _table(OP_HEADER, [op_cells(op) for op in ops])]
    return document(out)


def ici_line(op: OpRow) -> str:
    """A collective's ICI traffic: bytes per device, the group, achieved bandwidth and share of peak."""
    group = f"group of {op.group_size}" + (" (assumed: every chip of the host)" if op.group_source == "assumed" else "")
    return (f"{fmt_bytes(op.ici_bytes / max(op.occurrences, 1))} per device per occurrence (modelled: ring "
            f"{op.family}, {group}) · {fmt_bandwidth(op.ici_bw)} ({fmt_pct(op.ici_utilization)} of the chip's ICI peak)")


def spaces_line(op: OpRow) -> str:
    """Bytes by memory space (modelled from the layouts), per occurrence, and how bound_by was decided."""
    n = max(op.occurrences, 1)
    parts = [f"{label} {fmt_bytes(r / n)} read, {fmt_bytes(w / n)} written"
             for label, r, w in (("HBM", op.hbm_read_bytes, op.hbm_write_bytes),
                                 ("VMEM", op.vmem_read_bytes, op.vmem_write_bytes),
                                 ("host", op.host_read_bytes, op.host_write_bytes)) if r or w]
    if op.copied_hbm_bytes:
        parts.append(f"{fmt_bytes(op.copied_hbm_bytes / n)} brought from HBM by async copies")
    if op.moves:
        parts.append(f"moves {op.moves}")
    return ("; ".join(parts) or "none in the HLO text") + f" per occurrence (modelled) · bound by {op.bound_by} " \
        f"({op.bound_basis or 'utilization'})"


def op_detail_md(d: OpDetail) -> str:
    op = d.op
    out = [f"# {code(op.name)} on {code(op.host)} (program {code(op.program)})", ""]
    hlo = printable(d.hlo_text, keep_newlines=True) if d.hlo_text else "(HLO text not recorded in the trace)"
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", hlo)), default=0))  # longer than any run inside
    out += [fence, hlo, fence, ""]
    out.append(f"- shape with layout: {code(op.shape_with_layout or 'n/a')}")
    out.append(f"- source: {code(op.source or 'n/a')}")
    if d.tf_op:
        out.append(f"- name stack: {code(d.tf_op)}")
    out.append(f"- self time {fmt_time(op.self_time_ps)} ({fmt_pct(op.time_share)}), total "
               f"{fmt_time(op.total_time_ps)}, {op.occurrences} occurrences")
    out.append(f"- FLOP/s {fmt_flops(op.flop_rate)} ({fmt_pct(op.flop_utilization)} of peak), HBM "
               f"{fmt_bandwidth(op.hbm_bw)} ({fmt_pct(op.hbm_utilization)}), bound by {text(op.bound_by)}")
    out.append(f"- bytes by memory space: {text(spaces_line(op))}")
    if op.family:
        out.append(f"- ICI: {text(ici_line(op))}")
    out.append(f"- padding {fmt_pct(d.padding)}{text(bytes_note(op), strip=False)}")
    out.append(f"- LLO: {prose(llo_line(d))}")
    if d.kernel is not None:
        lines = d.kernel.lines()
        out.append(f"- Pallas kernel: {text(lines[0])}")
        out += [f"  - {text(line)}" for line in lines[1:]]
    for f in d.findings:
        out.append(f"- finding {text(f.code)} {text(f.rule)}: {prose(f.message)}")
    return document(out)


def bytes_note(op: OpRow) -> str:
    """Where the padding share comes from, with the bytes when the compiled join gave them."""
    padded, logical = getattr(op, "padded_bytes", None), getattr(op, "logical_bytes", None)
    if padded is None or logical is None:
        return "  (of the result's tiled layout)" if op.shape_with_layout and ":T(" in op.shape_with_layout else ""
    return f"  ({fmt_bytes(padded)} in tiled layouts for {fmt_bytes(logical)} of data, operands and result)"


def llo_line(d: OpDetail) -> str:
    """The op's LLO facts, or why there are none."""
    op = d.op
    stores, fills = getattr(op, "spill_stores", None), getattr(op, "spill_fills", None)
    cycles = getattr(op, "estimated_cycles", None)
    if stores is None and fills is None and cycles is None:
        if d.llo_available:
            return "n/a: the dumps given do not cover this op"
        return "n/a: no compiler dumps for this capture (`tpudiag tui PATH --dumps DIR`)"
    parts = []
    if stores is not None or fills is not None:
        parts.append(f"VMEM spills {d.spills} (stores {stores if stores is not None else 'n/a'}, "
                     f"fills {fills if fills is not None else 'n/a'})")
    if cycles is not None:
        parts.append(f"estimated {cycles:,} cycles per execution (compiler estimate)")
    return "  ·  ".join(parts)


def timeline_md(t: StepTimeline) -> str:
    out = [f"# tpudiag step {t.step} timeline", ""]
    rows = []
    for lane in t.lanes:
        gap = lane.gaps[0] if lane.gaps else None
        rows.append([lane.label, fmt_time(lane.dur_ps), fmt_time(lane.compute_ps), fmt_time(lane.collective_ps),
                     fmt_time(lane.in_flight_ps), fmt_time(lane.idle_ps),
                     f"{fmt_time(gap.dur_ps)} at +{fmt_time(gap.offset_ps)}" if gap else "none"])
    out.append(_table(["lane", "step", "compute", "exposed collectives", "async in flight", "idle",
                       "longest idle gap"], rows))
    return document(out)


def hosts_md(m: HostStepMatrix) -> str:
    out = ["# tpudiag hosts", ""]
    header = ["host", "mean", "behind fastest", "straggler on"] + [f"step {s}" for s in m.steps]
    rows = [[r.host, fmt_time(r.mean_ps), fmt_time(r.behind_fastest_ps),
             ", ".join(map(str, r.straggler_steps)) or "-"] + [fmt_time(t) for t in r.times_ps] for r in m.rows]
    out.append(_table(header, rows))
    return document(out)


def export_target(requested: str, view: str, trace_dir: Path, cwd: Path | None = None,
                  dumps: Sequence[Path] = ()) -> Path:
    """The file to write: `requested` (relative to `cwd`), or `tpudiag-<view>.md` in `cwd`.

    A directory gets the default file name inside it. Raises UsageError when the file would land
    in the trace directory or a compiler dump directory: exports never write next to an input.
    """
    cwd = Path.cwd() if cwd is None else cwd
    default = f"tpudiag-{view}.md"
    text = requested.strip()
    target = Path(text).expanduser() if text else Path(default)
    if not target.is_absolute():
        target = cwd / target
    if target.is_dir():
        target = target / default
    target = target.resolve()
    trace = trace_dir.resolve()
    if target == trace or trace in target.parents:
        raise UsageError("refusing to write into the trace directory", path=target,
                         hint="name a file outside the capture, e.g. `./report.md`")
    check_not_input(target, dumps, "the export")
    return target
