"""The terminal report, with rich. Readable without colour; NO_COLOR is honoured by rich itself."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tpudiag.model.findings import Finding, saving_amount
from tpudiag.model.profile import Platform
from tpudiag.model.report import BOUND_LEGENDS, OUTSIDE_STEPS, Breakdown, Distribution, OpRow, OpsShown, Report, skips_by_reason
from tpudiag.model.text import one_line
from tpudiag.render.console import markup as escape
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_flops, fmt_pct, fmt_time

BAR_WIDTH = 30


def _bar(fraction: float) -> str:
    filled = max(0, min(BAR_WIDTH, round(fraction * BAR_WIDTH)))
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def _header(report: Report) -> Group:
    s = report.summary
    lines = [Text.assemble(("tpudiag report", "bold"), f"  {one_line(s.input_path)}", f"  (run {one_line(s.run)})" if s.run else "")]
    if s.modelled:
        lines.append(Text("MODELLED capture: times are estimates from a compiled program, not measurements",
                          style="bold yellow"))
    gen = f" ({one_line(s.generation)})" if s.generation and s.generation.lower() not in s.device_type.lower() else ""
    device = one_line(s.device_type) or f"{s.platform} (device type not recorded)"
    lines.append(Text(f"Device: {device}{gen} · {len(s.hosts)} host{'s' * (len(s.hosts) != 1)} · "
                      + s.devices_text(cores=True)))
    if s.peak_flops_per_s:
        lines.append(Text(f"Peaks per {s.platform.core_word} ({s.gpu_peaks_source or s.peaks_source}): "
                          f"{fmt_flops(s.peak_flops_per_s)}, "
                          f"HBM {fmt_bandwidth(s.hbm_bytes_per_s)}"
                          + (f", {s.vmem.describe(fmt_bandwidth)}" if s.vmem is not None else "")))
    if s.step_time is not None:
        st = s.step_time
        source = f"({escape(one_line(s.step_program))})" if s.step_program else f"analysed (from {s.step_source})"
        text = (f"Steps: {st.count} {source} · step time mean {fmt_time(st.mean_ps)}, "
                f"p50 {fmt_time(st.p50_ps)}, p90 {fmt_time(st.p90_ps)}")
        if len(s.hosts) > 1:
            text += f" · spread across hosts {fmt_time(s.host_spread_ps)} (slowest: {one_line(s.slowest_host)})"
        lines.append(Text(text))
    elif s.platform is not Platform.CPU or s.busy_share is not None:
        # The spans are those of the cores that ran ops: a GPU plane without kernels has none
        counted = s.n_cores_with_ops if s.n_cores_with_ops is not None else s.n_cores
        word = s.platform.core_word
        busy = "" if s.busy_share is None else (
            f" · ops run {fmt_pct(s.busy_share)} of the time (busy / span of each {word}'s first to last op, "
            f"summed over {counted} {word}{'s' * (counted != 1)}"
            + (" that ran ops" if counted < s.n_cores else "") + f"), idle {fmt_pct(1 - s.busy_share)}")
        lines.append(Text(f"Steps: none found (no Steps line and no XLA Modules executions){busy}"))
    if s.dumps:
        lines.append(Text(f"Compiler dumps: {one_line(', '.join(s.dumps))}"))
    c = s.compiled
    if c is not None and (c.with_layout or c.with_llo or s.dumps):
        lines.append(Text(f"Compiled facts joined to {max(c.with_layout, c.with_llo)} of {c.n_ops} ops "
                          f"(layouts for {c.with_layout}, LLO spill counts for {c.with_llo}, estimated cycles for "
                          f"{c.with_cycles}; "
                          f"from {one_line(', '.join(c.sources)) or 'nothing'})"))
    return Group(*lines)


def breakdown_title(b: Breakdown, step_time: Distribution | None, word: str = "core") -> str:
    """The breakdown's basis, with the step time beside it when the two steps differ (`word`: what
    one core is called, `Platform.core_word`: a GPU is a GPU)."""
    if not b.step_differs(step_time):
        return f"mean per step and {word}"
    return (f"mean per step and {word}: a {fmt_time(b.step_ps)} step; the step time, "
            f"{fmt_time(step_time.mean_ps)}, is each step's slowest {word}")


def _breakdown_table(b: Breakdown, step_time: Distribution | None, word: str) -> Table:
    t = Table(title=f"Step breakdown ({breakdown_title(b, step_time, word)})", title_justify="left",
              show_edge=False)
    t.add_column("", no_wrap=True)
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", no_wrap=True)
    host = (("host transfers", b.host_transfer_ps),) if b.host_transfer_ps else ()
    for label, ps in (("compute", b.compute_ps), ("collectives", b.collective_ps), ("infeed/outfeed", b.io_ps),
                      *host, ("idle", b.idle_ps)):
        frac = ps / b.step_ps if b.step_ps else 0.0
        t.add_row(label, fmt_time(ps), fmt_pct(frac), _bar(frac))
    t.add_row(Text("duty cycle", style="bold"), "", fmt_pct(b.duty_cycle), "")
    return t


def _programs_table(report: Report) -> Table:
    t = Table(title="Programs (XLA Modules), by device time", title_justify="left", show_edge=False)
    for col in ("program", "id", "runs", "cores", "mean", "device time", "share", ""):
        t.add_column(col, justify="left" if col in ("program", "id", "") else "right",
                     overflow="fold" if col == "program" else "ellipsis", no_wrap=col != "program")
    for p in report.programs:
        t.add_row(escape(one_line(p.module)), str(p.program_id), str(p.executions), str(p.cores), fmt_time(p.mean_ps),
                  fmt_time(p.time_ps), fmt_pct(p.share), "the step" if p.step else "")
    return t


def _hosts_table(report: Report) -> Table:
    t = Table(title="Hosts", title_justify="left", show_edge=False)
    for col in ("host", "chips", "steps", "mean", "p50", "p90", "vs fastest", "duty cycle", "slowest core"):
        t.add_column(col, justify="left" if col in ("host", "slowest core") else "right")
    means = [h.step_time.mean_ps for h in report.hosts if h.step_time]
    fastest = min(means) if means else 0
    for h in report.hosts:
        st = h.step_time
        t.add_row(escape(h.host), str(h.n_chips), str(st.count if st else 0), fmt_time(st.mean_ps if st else None),
                  fmt_time(st.p50_ps if st else None), fmt_time(st.p90_ps if st else None),
                  f"+{fmt_time(st.mean_ps - fastest)}" if st else "n/a",
                  fmt_pct(h.breakdown.duty_cycle) if h.breakdown else "n/a", escape(h.slowest_core))
    return t



def _time_label(shown: OpsShown) -> str:
    """What the time columns hold: per step and core where there are steps, else the capture's total."""
    return "per step" if shown.per_step else "self time"


def _bound_cell(op: OpRow) -> str:
    """`bound by` as the ops table shows it: a VMEM-bound op with its share of the VMEM peak (no
    column of its own, so the table stays readable at 140 columns)."""
    if op.bound_by == "VMEM" and op.vmem_utilization is not None:
        return f"VMEM {fmt_pct(op.vmem_utilization)}"
    return op.bound_shown


def _ops_table(report: Report, ops: OpsShown) -> Table:
    """The compute ops (collectives have their own table), time per step and core."""
    multi_host = len(report.summary.hosts) > 1
    label = _time_label(ops)
    per = "mean per step and core" if label == "per step" else "summed over cores and occurrences"
    t = Table(title=f"Top ops by self time, {per} (of {ops.n_compute} ops besides collectives; totals in --format json)",
              title_justify="left", show_edge=False)
    t.add_column("#", justify="right")
    if multi_host:
        t.add_column("host")
    shown = ops.compute
    vmem = any(op.bound_by == "VMEM" for op in shown)
    for col in ("op", "category", label, "share", "occ", "FLOP util", "HBM BW util", "FLOP/B", "bound by"):
        t.add_column(col, justify="left" if col in ("op", "category", "bound by") else "right",
                     overflow="fold" if col == "op" else "ellipsis")
    # Compiled facts (tpudiag.analysis.join) get columns only when some shown op has them.
    padding = any(op.padded_bytes is not None for op in shown)
    spills = any(op.spill_stores is not None for op in shown)
    cycles = any(op.estimated_cycles is not None for op in shown)
    for col, wanted in (("padded", padding), ("spills", spills), ("cycles", cycles)):
        if wanted:
            t.add_column(col, justify="right")
    for i, (op, name) in enumerate(zip(shown, ops.compute_names), start=1):
        row = [str(i)]
        if multi_host:
            row.append(escape(op.host))
        row += [escape(name), escape(op.category), op.time_cell, fmt_pct(op.time_share),
                str(op.occurrences), fmt_pct(op.flop_utilization), fmt_pct(op.hbm_utilization),
                _intensity(op), escape(_bound_cell(op))]
        if padding:
            row.append(_padding_cell(op.padded_bytes, op.logical_bytes))
        if spills:
            row.append("-" if op.spill_stores is None else f"{op.spill_stores}/{op.spill_fills}")
        if cycles:
            row.append("-" if op.estimated_cycles is None else f"{op.estimated_cycles:,}")
        t.add_row(*row)
    legend = ["share: of core time; occ: occurrences over cores and steps; n/a: no rate, or one above the peak "
              "(see the warnings); FLOP/B: FLOPs per HBM byte"]
    if ops.names_shortened:
        legend.append("op: long kernel names shortened (template and call arguments as …, [N] tells alike ones "
                      "apart); full names in --format json")
    if any(op.bound_shown.endswith("*") for op in shown):
        ridge = report.summary.ridge_flops_per_byte
        legend.append("*: the bytes async copies brought into VMEM for it counted as its HBM bytes (modelled from "
                      f"the layouts): with FLOPs, bound by FLOP/B against the ridge ({ridge:,.0f} FLOP/B)"
                      if ridge else "")
    if ops.outside_steps:
        legend.append(OUTSIDE_STEPS)
    for value in sorted({op.bound_by for op in shown} & set(BOUND_LEGENDS)):
        legend.append(f"{value}: {BOUND_LEGENDS[value]}")
    if vmem:
        legend.append("VMEM N%: bound by VMEM bandwidth, its bytes in VMEM (modelled from the layouts) over its "
                      "time at N % of the VMEM peak in the header")
    if padding:
        legend.append("padded: operand and result bytes in their tiled layouts, ×N: times the logical bytes")
    if spills:
        legend.append("spills: VMEM spill stores/fills (LLO)")
    if cycles:
        legend.append("cycles: the compiler's estimate for one execution")
    t.caption = "; ".join(legend)
    t.caption_justify = "left"
    return t


def _intensity(op: OpRow) -> str:
    return "-" if op.hbm_intensity is None else f"{op.hbm_intensity:,.3g}"


def _collectives_table(report: Report, ops: OpsShown) -> Table | None:
    """Collectives apart: bytes each device sends, the group, achieved ICI bandwidth and its share of peak."""
    if not ops.n_collectives:
        return None
    multi_host = len(report.summary.hosts) > 1
    label = _time_label(ops)
    per = "mean per step and core" if label == "per step" else "summed over cores and occurrences"
    t = Table(title=f"Collectives, {per} (of {ops.n_collectives})", title_justify="left", show_edge=False)
    t.add_column("#", justify="right")
    if multi_host:
        t.add_column("host")
    for col in ("op", "family", label, "share", "occ", "group", "bytes/device", "ICI BW", "of ICI peak"):
        t.add_column(col, justify="left" if col in ("op", "family") else "right",
                     overflow="fold" if col == "op" else "ellipsis")
    for i, op in enumerate(ops.collectives, start=1):
        row = [str(i)] + ([escape(op.host)] if multi_host else [])
        group = f"{op.group_size}{'?' if op.group_source == 'assumed' else ''}" if op.group_size else "-"
        row += [escape(op.name), escape(op.family), op.time_cell, fmt_pct(op.time_share), str(op.occurrences),
                group, fmt_bytes(op.ici_bytes / op.occurrences) if op.occurrences else "-",
                fmt_bandwidth(op.ici_bw), fmt_pct(op.ici_utilization) + (" latency" if op.ici_latency_bound else "")]
        t.add_row(*row)
    t.caption = ("bytes/device: sent over ICI per occurrence, modelled from the payload and the ring algorithm; "
                 "group: participants (? assumed: every chip of the host); ICI BW over the transfer (the async "
                 "window for a start/done pair); peak: every ICI link of the chip, one way; latency: its bytes would cross "
                 "at peak in under the 2 µs fixed latency and it reached under 10 % of peak: latency-bound, fewer "
                 "and larger collectives help, not bandwidth")
    t.caption_justify = "left"
    return t


def _padding_cell(padded: int | None, logical: int | None) -> str:
    if padded is None:
        return "-"
    if not logical or padded < 1.005 * logical:
        return fmt_bytes(padded)
    return f"{fmt_bytes(padded)} ×{padded / logical:.2f}"  # x the logical bytes


EVIDENCE_ROWS = 4


def _saving_line(f: Finding) -> str:
    explanation = one_line(f.saving.explanation)
    if f.saving.ps > 0:
        return f"   saving ≤ {saving_amount(f.saving)} ({f.saving.basis}: {explanation})"
    if f.saving.bytes > 0:
        return f"   saving ≤ {saving_amount(f.saving)} ({f.saving.basis}: {explanation})"
    return f"   saving: not estimated ({explanation})"


def finding_lines(f: Finding, index: int) -> list[Text]:
    """One finding as printed: headline, saving and fix, then its first evidence rows."""
    lines = [Text.assemble(f"{index}. ", (f"[{f.severity.label()}] ", "bold"), (f"{f.code} {f.rule}", "cyan"),
                           f" {one_line(f.message)}"),
             Text(_saving_line(f)),
             Text(f"   fix: {one_line(f.fix)}")]
    for e in f.evidence[:EVIDENCE_ROWS]:
        values = one_line(", ".join(f"{label} {value}" for label, value in e.values))
        lines.append(Text(f"   · {one_line(e.subject)}: {values}", style="dim"))
    hidden = len(f.evidence) - EVIDENCE_ROWS
    if hidden > 0:
        lines.append(Text(f"   · … {hidden} more row{'s' * (hidden != 1)} in --format json", style="dim"))
    return lines


def _findings(report: Report) -> Group:
    title = Text("Findings", style="bold")
    if not report.findings:
        body = [Text("no findings")]
    else:
        body = [Text("Savings are upper bounds per rule and overlap: do not add them up.", style="dim")]
        for i, f in enumerate(report.findings, start=1):
            body.extend(finding_lines(f, i))
    for reason, rules in skips_by_reason(report.rules_skipped):
        body.append(Text(f"skipped {', '.join(rules)}: {one_line(reason)}", style="dim"))
    return Group(title, *body)


def render_findings(report: Report, console: Console) -> None:
    """The findings section alone (the static report prints its own tables above it)."""
    console.print(_findings(report))


def render_kernels(report: Report, console: Console) -> None:
    """The Pallas kernels: grid, blocks, VMEM and what the LLO dump says (compiler figures)."""
    if not report.kernels:
        return
    console.print()
    console.print(Text("Pallas kernels (compiler figures, static)", style="bold"))
    for k in report.kernels:
        console.print(Text(f"  `{one_line(k.op)}`"))
        for line in k.lines():
            console.print(Text(f"    {one_line(line)}"))


def render_terminal(report: Report, console: Console, top: int = 15) -> None:
    console.print(_header(report))
    s = report.summary
    if s.platform is Platform.CPU and not report.ops:
        console.print()
        console.print("This capture has no TPU or GPU device plane (a host-only capture, e.g. jax.profiler on a "
                      "CPU): there are no device ops to analyse.")
    if s.breakdown is not None:
        console.print()
        console.print(_breakdown_table(s.breakdown, s.step_time, s.platform.core_word))
        for t in s.host_transfers:
            console.print(Text(f"  host transfers, {t.line()}"))
    if report.programs and (s.step_program or len(report.programs) > 1):
        console.print()
        console.print(_programs_table(report))
    if len(report.hosts) > 1:
        console.print()
        console.print(_hosts_table(report))
    if report.ops:
        console.print()
        shown = OpsShown.of(report.ops, top)  # one pass over a pod's rows
        console.print(_ops_table(report, shown))
        collectives = _collectives_table(report, shown)
        if collectives is not None:
            console.print()
            console.print(collectives)
    render_kernels(report, console)
    console.print()
    console.print(_findings(report))
    if report.failures:
        console.print()
        console.print(Text("Host files not analysed", style="bold"))
        for f in report.failures:
            console.print(Text(f"  {one_line(f)}"))
    if report.warnings:
        console.print()
        console.print(Text("Warnings", style="bold"))
        for w in report.warnings:
            console.print(Text(f"  {one_line(w)}"))
