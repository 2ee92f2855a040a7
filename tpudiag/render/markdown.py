"""The report as markdown, for a researcher who does not know XLA: plain words first, details after.

Renders with GitHub and with editor previews (CommonMark + GFM tables). Every string that comes
from the input (op names, categories, hosts, paths, source lines, finding text that quotes them)
goes through `code` or `text`, so a crafted op name cannot break a table, open a link or inject
HTML. Figures are PNG files made by `tpudiag.render.figures`; this module only links them.

Numbers come from the Report; the only arithmetic here is a share of the step for display.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from tpudiag.version import __version__
from tpudiag.model.findings import Finding, saving_amount
from tpudiag.model.profile import Platform
from tpudiag.model.report import BOUND_LEGENDS, OUTSIDE_STEPS, Breakdown, Mode, OpRow, OpsShown, Report, skips_by_reason
from tpudiag.model.text import one_line, printable, short_kernel_name
from tpudiag.model.memory import ProgramMemory, largest_hbm_program
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_flops, fmt_pct, fmt_time

TOP_OPS = 15
TOP_PROBLEMS = 3
TOP_MEMORY_GROUPS = 8

# Characters with a meaning in CommonMark/GFM inline text, escaped with a backslash.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")


def _one_line(value: object) -> str:
    return one_line(value)  # whitespace collapsed and controls shown escaped (tpudiag.model.text)


def text(value: object, strip: bool = True) -> str:
    """Input-derived prose, inert: no emphasis, links, autolinks, HTML or table cell breaks."""
    s = _one_line(value) if strip else printable(re.sub(r"\s+", " ", str(value)))
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    # Autolinks need these characters as typed; an escape breaks the match. GFM links `http://…` and
    # `www.…`; editor previews (markdown-it linkify) also link bare domains such as `model.py`.
    s = s.replace("://", r"\:\/\/")
    # A domain's label may end in any character linkify does not treat as a boundary (an unassigned
    # code point, a zero-width space, `~`), not only in a word character: escape every such dot.
    s = re.sub(r"(?<=\S)\.(?=[A-Za-z])", r"\\.", s)
    return s


def code(value: object) -> str:
    """Input-derived identifier as a code span. In table cells, `table` escapes its pipes (GFM `\\|`)."""
    s = _one_line(value)
    if not s:
        return ""
    longest = max((len(run) for run in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    if s.startswith("`") or s.endswith("`"):
        s = f" {s} "
    return f"{fence}{s}{fence}"


def prose(value: object) -> str:
    """Tool-written prose that quotes names in backticks (findings): quoted parts as code, the rest as text."""
    parts = re.split(r"`([^`]*)`", _one_line(value))
    return "".join(code(p) if i % 2 else text(p, strip=False) for i, p in enumerate(parts))


_PIPE = re.compile(r"(\\*)\|")


def cell(value: str) -> str:
    """A rendered fragment made safe for a GFM table cell: every unescaped pipe gets a backslash.

    GFM splits rows on pipes not escaped by an odd run of backslashes, before parsing code spans, so
    this applies inside code spans too (GitHub and markdown-it show `\\|` there as a plain pipe).
    """
    return _PIPE.sub(lambda m: m.group(1) + ("\\|" if len(m.group(1)) % 2 == 0 else "|"), value)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GFM table; `align` holds one of l/r per column (default left)."""
    marks = [("---:" if a == "r" else ":---") for a in (align or "l" * len(header))]
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "| " + " | ".join(marks) + " |"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out


def _plain_category(category: str) -> str:
    c = category.lower()
    if "convolution" in c or c in ("dot", "dot fusion"):
        return "matrix multiplications"
    if "all-" in c or "reduce-scatter" in c or "collective" in c or c in ("send", "recv"):
        return "communication between chips"
    if "loop fusion" in c or "input fusion" in c or "output fusion" in c:
        return "element-wise and reduction work, usually limited by memory bandwidth"
    if c in ("copy", "transpose", "data formatting", "copy-start", "copy-done") or "copy" in c:
        return "data movement (copies and layout changes)"
    if "infeed" in c or "outfeed" in c:
        return "data transfer to and from the host"
    return "other operations"


def _image(figures: Mapping[str, tuple[str, str]], key: str) -> list[str]:
    """`![alt](link)` for a written figure; `figures` maps key -> (link, alt)."""
    if key not in figures:
        return []
    link, alt = figures[key]
    return ["", f"![{text(alt)}]({quote(link, safe='/:.-_~')})"]


def _step_sentence(report: Report) -> str:
    s = report.summary
    st = s.step_time
    device = text(s.device_type or s.platform)
    # a CPU capture is one device, the host's CPU run by XLA's CPU threads: no chip count
    where = device if s.platform is Platform.CPU else f"{s.devices_text()} of {device}"
    if len(s.hosts) > 1:
        where += f" on {len(s.hosts)} hosts"
    if s.platform is Platform.CPU and not report.ops:
        return ("This is a host-only capture (no TPU or GPU device plane, e.g. `jax.profiler` on a CPU): there are "
                "no device ops or steps to analyse.")
    if st is None:
        return f"No training steps were found in this capture ({where}), so there is no step time to break down."
    steps = f"{st.count} step{'s' * (st.count != 1)}"
    spread = "" if st.min_ps == st.max_ps else f"; steps ranged from {fmt_time(st.min_ps)} to {fmt_time(st.max_ps)}"
    if s.step_program:
        return (f"A step is one execution of {code(s.step_program)}, the program that repeats and holds the most "
                f"device time; it takes **{fmt_time(st.mean_ps)}** on average on its slowest {s.platform.core_word} (median "
                f"{fmt_time(st.p50_ps)}, 90th percentile {fmt_time(st.p90_ps)}, over {steps} on {where}"
                f"{spread}).")
    return (f"Each step takes **{fmt_time(st.mean_ps)}** on average (median {fmt_time(st.p50_ps)}, "
            f"90th percentile {fmt_time(st.p90_ps)}, over {steps} on {where}{spread}).")


IDLE_WORTH_EXPLAINING = 0.01  # share of the step from which the summary says what idle time usually means


# Who spends the step, and what their idle time usually waits for, by platform: on a CPU the host
# is the device, so its idle time is not "waiting for the host".
_SPENDERS = {Platform.TPU: ("The chips", "between chips", "the chips are waiting for the host"),
             Platform.GPU: ("The GPUs", "between GPUs", "the GPUs are waiting for the host"),
             Platform.CPU: ("XLA's CPU threads", "between devices", "XLA's threads are waiting for the program")}


def _breakdown_sentence(b: Breakdown, platform: Platform = Platform.TPU) -> str:
    who, between, waiting = _SPENDERS[platform]

    def share(ps: float) -> str:
        return fmt_pct(ps / b.step_ps if b.step_ps else None)

    host = (f"{share(b.host_transfer_ps)} waiting for async copies to or from host memory (offload, prefetch), "
            if b.host_transfer_ps else "")
    # Beside async host copies, "transfers to and from the host" would name two things alike.
    io = "on infeed and outfeed" if b.host_transfer_ps else "on transfers to and from the host"
    sentence = (f"{who} spend {share(b.compute_ps)} of a step computing, {share(b.collective_ps)} waiting for "
                f"communication {between} (collectives), {share(b.io_ps)} {io}, "
                f"{host}and {share(b.idle_ps)} idle.")
    # The explanation only where there is idle time worth explaining (not the 15.6 µs of 784 ms,
    # 0.0 %, between the real v6e capture's back-to-back executions).
    if b.step_ps and b.idle_ps >= IDLE_WORTH_EXPLAINING * b.step_ps:
        sentence += (f" Idle time usually means {waiting} (Python overhead, data loading or "
                     "synchronisation).")
    return sentence


def _estimated(f: Finding) -> bool:
    return bool(f.saving.ps or f.saving.bytes)


def _saving_amount(f: Finding, step_ps: float | None) -> str:
    """`1.2 ms per step (8.0% of the step)`, or the bytes of device memory of a memory finding."""
    share = f" ({fmt_pct(f.saving.ps / step_ps)} of the step)" if step_ps and f.saving.ps else ""
    return saving_amount(f.saving) + share


def _summary(report: Report) -> list[str]:
    s = report.summary
    out = ["## Summary", ""]
    if s.mode == Mode.STATIC:
        out += ["> **Compiler estimate, not measured.** No capture: these times come from the compiler's own "
                "estimate of the dumped program, laid out on a modelled timeline (cycles at the chip's clock, "
                "else the FLOPs/bytes roofline).", ""]
    elif s.modelled:
        out += ["> **Modelled, not measured.** This capture was written by `tpudiag simulate` from a compiled "
                "program: its times are estimates.", ""]
    out.append(f"- {_step_sentence(report)}")
    if s.breakdown is not None:
        out.append(f"- {_breakdown_sentence(s.breakdown, s.platform)}")
    if report.categories:
        parts = [f"{code(c.category)} ({_plain_category(c.category)}) {fmt_pct(c.time_share)}"
                 for c in report.categories[:3]]
        out.append(f"- The op categories with the most {s.chip_word} time: " + "; ".join(parts) + ".")
    if report.ops:
        op = report.ops[0]
        out.append(f"- The single most expensive operation is {code(short_kernel_name(op.name))} ({text(op.category)}), with "
                   f"{fmt_pct(op.time_share)} of {s.chip_word} time.")
    out.append("")
    out.append("### Top problems")
    out.append("")
    if not report.findings:
        out.append("The rules found no problem worth reporting.")
    else:
        step = s.step_time.mean_ps if s.step_time else None
        for i, f in enumerate(report.findings[:TOP_PROBLEMS], start=1):
            saving = (f"Could save up to {_saving_amount(f, step)}, {text(f.saving.basis)}." if _estimated(f)
                      else "Saving not estimated.")
            out.append(f"{i}. **{prose(f.message)}** {saving} What to change: {prose(f.fix)}")
        out += ["", "Savings are upper bounds, each estimated on its own. Problems can overlap (fixing one may "
                "shrink another), so do not add the savings up."]
    out.append("")
    return out


def breakdown_section(report: Report, figures: Mapping[str, tuple[str, str]]) -> list[str]:
    b = report.summary.breakdown
    if b is None:
        return []
    rows = []
    host = (("host transfers (async copies to or from host memory)", b.host_transfer_ps),) if b.host_transfer_ps else ()
    for label, ps in (("compute", b.compute_ps), ("collectives (communication)", b.collective_ps),
                      ("infeed/outfeed" if host else "infeed/outfeed (host transfers)", b.io_ps), *host,
                      ("idle", b.idle_ps)):
        rows.append([label, fmt_time(ps), fmt_pct(ps / b.step_ps if b.step_ps else None)])
    rows.append(["**busy (duty cycle)**", fmt_time(b.step_ps - b.idle_ps), f"**{fmt_pct(b.duty_cycle)}**"])
    st = report.summary.step_time
    word = report.summary.platform.core_word
    basis = (f"Mean per step and {word}. Compute, collectives, host transfers and idle add up to the step time."
             if not b.step_differs(st) else
             f"Mean per step and {word}: they add up to the mean {word}'s step, {fmt_time(b.step_ps)}; the step "
             f"time, {fmt_time(st.mean_ps)}, is each step's slowest {word}.")
    return (["## Where the step time goes", "", basis, ""]
            + table(["part of the step", "time", "share"], rows, "lrr")
            + ([""] + [f"- Host transfers, {text(t.line())}" for t in report.summary.host_transfers]
               if report.summary.host_transfers else [])
            + _image(figures, "step-breakdown") + [""])


def programs_section(report: Report) -> list[str]:
    """The XLA programs by device time, when there are several or one of them is the step."""
    if not report.programs or not (report.summary.step_program or len(report.programs) > 1):
        return []
    rows = [[code(p.module), str(p.program_id), str(p.executions), str(p.cores), fmt_time(p.mean_ps),
             fmt_time(p.time_ps), fmt_pct(p.share), "the step" if p.step else ""] for p in report.programs]
    return (["## Programs", "", "Every XLA program the device ran (`XLA Modules`): executions on the core that ran "
             "it most, the cores that ran it, its mean execution, and its device time summed over cores.", ""]
            + table(["program", "id", "executions", "cores", "mean", "device time", "share", ""], rows,
                    "llrrrrrl") + [""])


def categories_section(report: Report, figures: Mapping[str, tuple[str, str]]) -> list[str]:
    if not report.categories:
        return []
    rows = [[code(c.category), text(_plain_category(c.category)), str(c.n_ops), fmt_time(c.self_time_ps),
             fmt_pct(c.time_share)] for c in report.categories]
    return (["## Time by op category", "", "Self time summed over every op, occurrence and core (core-time).", ""]
            + table(["category", "what it is", "ops", "self time", "share"], rows, "llrrr")
            + _image(figures, "categories") + [""])



def _ops_section(report: Report, figures: Mapping[str, tuple[str, str]], top: int) -> list[str]:
    if not report.ops:
        return []
    multi = len(report.summary.hosts) > 1
    shown = OpsShown.of(report.ops, top)  # one pass over a pod's rows
    per_step = shown.per_step
    label = "per step" if per_step else "self time"
    compute = shown.compute
    header = ["#"] + (["host"] if multi else []) + ["op", "category", label, "share", "FLOP util",
                                                    "HBM BW util", "FLOP/B", "bound by", "source"]
    rows = []
    for i, (op, name) in enumerate(zip(compute, shown.compute_names), start=1):
        rows.append([str(i)] + ([code(op.host)] if multi else []) + [
            code(name), text(op.category), op.time_cell, fmt_pct(op.time_share),
            fmt_pct(op.flop_utilization), fmt_pct(op.hbm_utilization),
            "-" if op.hbm_intensity is None else f"{op.hbm_intensity:,.3g}", text(op.bound_shown), code(op.source)])
    align = "r" + ("l" if multi else "") + "llrrrrrll"
    when = ("*per step* is the op's self time per step and core (mean)" if per_step
            else "*self time* is summed over cores and occurrences (no steps)")
    gpu = report.summary.platform is Platform.GPU
    levels = ("the achieved rates over the GPU's peaks; an op is *bound by* the level (compute, HBM) whose "
              "utilization is the highest, *latency* when it has none. n/a is no rate, or one above the peak (see "
              "the warnings). FLOP/B is FLOPs per HBM byte." if gpu else
              "the achieved rates over the per-core peaks; an op is *bound by* the level (compute, HBM, VMEM) whose "
              "utilization is the highest, *latency* when it has none; VMEM's counts its bytes in VMEM (`S(1)`, "
              "modelled from the layouts) against the VMEM peak in the methods, where one is known. n/a is no "
              "rate, or one above the peak (see the warnings). FLOP/B is FLOPs per HBM "
              "byte; where async copies brought an op's operands into VMEM, their bytes count as its HBM bytes "
              "(modelled from the layouts) and it is bound by its FLOP/B against the ridge (marked \\*).")
    intro = (f"The {len(compute)} ops besides collectives with the most self time, of {shown.n_compute}; "
             f"{when}, *share* its share of {'GPU' if gpu else 'core'} time (totals in the JSON). FLOP util and HBM "
             f"BW util are {levels}")
    if shown.outside_steps:
        intro += f" *{OUTSIDE_STEPS.replace(':', '*:', 1)}."
    for value in sorted({op.bound_by for op in compute} & set(BOUND_LEGENDS)):
        intro += f" *{value}*: {BOUND_LEGENDS[value]}."
    if shown.names_shortened:
        intro += (" Long kernel names are shortened (template and call arguments as …, [N] tells alike ones "
                  "apart); the JSON has them in full.")
    out = ["## Top ops", "", intro, ""] + table(header, rows, align)
    collectives = shown.collectives
    if collectives:
        rows = []
        for i, op in enumerate(collectives, start=1):
            group = f"{op.group_size}{' (assumed)' if op.group_source == 'assumed' else ''}" if op.group_size else "-"
            rows.append([str(i)] + ([code(op.host)] if multi else []) + [
                code(op.name), text(op.family), op.time_cell, fmt_pct(op.time_share), group,
                fmt_bytes(op.ici_bytes / op.occurrences) if op.occurrences else "-", fmt_bandwidth(op.ici_bw),
                fmt_pct(op.ici_utilization) + (" (latency-bound)" if op.ici_latency_bound else "")])
        out += ["", "### Collectives", "",
                f"The {len(collectives)} collectives with the most self time, of {shown.n_collectives}. "
                "*bytes/device*: what each device sends over ICI per occurrence, modelled from the payload and "
                "the ring algorithm of its family; *group*: participants (assumed: every chip of the host, where "
                "the trace names no replica groups); *ICI BW*: those bytes over the transfer (the async window "
                "for a start/done pair), against the chip's ICI peak (every link, one way); *latency-bound*: its "
                "bytes would cross at peak in under the 2 µs fixed latency and it reached under 10 % of peak, so "
                "fewer and larger collectives help, not bandwidth.", ""]
        out += table(["#"] + (["host"] if multi else []) + ["op", "family", label, "share", "group", "bytes/device",
                                                            "ICI BW", "of ICI peak"], rows,
                     "r" + ("l" if multi else "") + "llrrrrrr")
    if "roofline" in figures:
        if report.summary.platform is Platform.GPU:
            out += ["", "On the roofline, ops left of the ridge are limited by HBM bandwidth, ops right of it by "
                    "compute; the gap between a point and its roof is headroom. Each op is drawn at its FLOPs per "
                    "HBM byte; colour is what binds it; the largest ops are numbered, with a key under the plot. "
                    "Ops without FLOPs (copies, elementwise fusions, kernels without cost data) are not drawn."]
        else:
            out += ["", "On the roofline, ops left of the ridge are limited by memory bandwidth, ops right of it by "
                "compute; the gap between a point and its roof is headroom. There is a roof per memory level: "
                "HBM, and VMEM where a source gives the chip's VMEM bandwidth (the trace's own peaks, else the "
                "table in the methods). Each op is drawn at its FLOPs per HBM byte (circles, counting what its "
                "copies brought into VMEM) and per VMEM byte (squares, modelled from the layouts), filled at "
                "the level that binds it and hollow at the other; an op with no bytes at a level has no point "
                "there. Colour is what binds the op; the largest ops are numbered, with a key under the plot. "
                "Ops without FLOPs (collectives, copies) are not drawn."]
        out += _image(figures, "roofline")
    elif figures:
        out += ["", "No roofline figure: no op here records both FLOPs and bytes accessed, or the chip's peaks "
                "are unknown."]
    return out + [""]


def _evidence(f: Finding) -> list[str]:
    if not f.evidence:
        return []
    labels = list(dict.fromkeys(label for e in f.evidence for label, _ in e.values))
    rows = []
    for e in f.evidence:
        values = dict(e.values)
        rows.append([code(e.subject)] + [prose(values.get(label, "")) for label in labels])
    return ["", "Evidence:", ""] + table(["subject"] + [text(label) for label in labels], rows,
                                           "l" + "r" * len(labels))


def finding_section(f: Finding, number: str = "") -> list[str]:
    """One finding: its heading (`### {number}rule (code, severity)`), message, ops, saving, evidence, fix."""
    out = [f"### {number}{text(f.rule)} ({text(f.code)}, {f.severity.label()})", "", prose(f.message), ""]
    if f.host:
        out += [f"- Host: {code(f.host)}"]
    if f.ops:
        out += ["- Ops: " + ", ".join(code(o) for o in f.ops)]
    if _estimated(f):
        out += [f"- Estimated saving: up to {_saving_amount(f, None)} ({text(f.saving.basis)}). "
                f"{prose(f.saving.explanation)}"]
    else:
        out += [f"- Saving: not estimated. {prose(f.saving.explanation)}"]
    out += _evidence(f)
    return out + ["", f"**What to change in your model or config:** {prose(f.fix)}", ""]


def _findings_section(report: Report) -> list[str]:
    out = ["## Findings", ""]
    if not report.findings:
        out += ["No findings.", ""]
    for i, f in enumerate(report.findings, start=1):
        out += finding_section(f, f"{i}. ")
    if report.rules_skipped:
        out += ["Rules not run, for lack of input:", ""]
        out += [f"- {', '.join(text(r) for r in rules)}: {prose(reason)}"
                for reason, rules in skips_by_reason(report.rules_skipped)]
        out.append("")
    return out


def memory_section(programs: Sequence[ProgramMemory], figures: Mapping[str, tuple[str, str]]) -> list[str]:
    """The device-memory section of the program with the largest HBM peak (the report and the TUI's export)."""
    p = largest_hbm_program(tuple(programs))
    if p is None:
        return []
    hbm = p.hbm
    peak, limit = p.hbm_peak_bytes, p.hbm_limit_bytes
    if peak is not None and limit and p.does_not_fit:
        verdict = (f"**The program does not fit:** it needs {fmt_bytes(peak)} of HBM, {fmt_bytes(peak - limit)} "
                   f"more than the {fmt_bytes(limit)} {text(p.limit_words)}.")
    elif p.does_not_fit:
        verdict = "**The compiler ran out of memory** compiling this program."
    elif peak is not None and limit:
        verdict = (f"The program peaks at {fmt_bytes(peak)} of HBM, {fmt_pct(peak / limit)} of the "
                   f"{fmt_bytes(limit)} {text(p.limit_words)}.")
    else:
        verdict = f"The program peaks at {fmt_bytes(peak)} of HBM; the chip's HBM size is unknown."
    intro = (f"From the compiler's buffer assignment of {code(p.module)}: arguments and outputs are held for "
             "the whole program, temporaries share one heap sized for the most that are live at once.")
    rows = [[text(s.space), fmt_bytes(s.peak_bytes), fmt_bytes(s.argument_bytes), fmt_bytes(s.output_bytes),
             fmt_bytes(s.temp_bytes), fmt_bytes(s.alias_bytes)] for s in p.spaces if s.peak_bytes]
    out = ["## Device memory", "", verdict, "", intro, ""]
    out += table(["memory space", "peak", "arguments", "outputs", "temporaries", "aliased (donated)"], rows,
                 "lrrrrr")
    out += _image(figures, "memory")
    if hbm.groups:
        out += ["", "What holds HBM at the peak, by jit argument or by the JAX op that makes it:", ""]
        out += table(["argument or op", "kind", "buffers", "size", "source"],
                     [[code(g.label), text(g.kind), str(g.count), fmt_bytes(g.size_bytes),
                       code(g.source) if g.source else "-"] for g in hbm.groups[:TOP_MEMORY_GROUPS]], "llrrl")
    if p.levers:
        out += ["", "What would lower the peak, by modelled bytes freed (upper bounds that overlap: never add "
                    "them):", ""]
        out += table(["change", "frees up to", "how"],
                     [[prose(lv.title), fmt_bytes(lv.saving_bytes), code(lv.fix)] for lv in p.levers], "lrl")
    return out + [""]


def _hosts_section(report: Report, figures: Mapping[str, tuple[str, str]]) -> list[str]:
    if len(report.hosts) < 2:
        return []
    rows = []
    for h in report.hosts:
        st = h.step_time
        rows.append([code(h.host), str(h.n_chips), str(st.count if st else 0),
                     fmt_time(st.mean_ps if st else None), fmt_time(st.p90_ps if st else None),
                     fmt_pct(h.breakdown.duty_cycle) if h.breakdown else "n/a", code(h.slowest_core)])
    s = report.summary
    intro = (f"Spread of mean step time across hosts: {fmt_time(s.host_spread_ps)}; slowest host "
             f"{code(s.slowest_host)}. Every host waits for the slowest one at each synchronising collective.")
    return (["## Hosts", "", intro, ""]
            + table(["host", "chips", "steps", "mean step", "p90 step", "duty cycle", "slowest core"], rows,
                     "lrrrrrl")
            + _image(figures, "host-steps") + [""])


def _methods(report: Report, figures_note: str) -> list[str]:
    s = report.summary
    if s.modelled:
        measured = ("Nothing in this report was measured on hardware: op times come from a performance model "
                    "of the compiled program (`tpudiag simulate`).")
    else:
        costs = ("FLOPs and bytes per op, from the HLO the capture embeds where it does, as XProf charges GPU "
                 "kernels (FLOPs of dots and convolutions only; custom calls XLA does not cost, and kernels no "
                 "HLO op launched, have none)"
                 if s.platform is Platform.GPU else "FLOPs and bytes per op (XLA's cost analysis, recorded in the trace)")
        measured = ("**Measured:** step boundaries, op start times and durations, from the device trace. "
                    f"**From the compiler:** {costs}. "
                    "**Derived:** rates, utilizations and the compute-bound/HBM-bound label (counts over measured "
                    "time, over the peaks below). **Estimated:** the savings of findings, each labelled measured, modelled "
                    "or compiler estimate by how it was obtained.")
    out = ["## Methods", "", measured, ""]
    out.append(f"- Input: {code(s.input_path)}" + (f", run {code(s.run)}" if s.run else ""))
    for h in report.hosts:
        out.append(f"  - host {code(h.host)}: {code(h.path)} ({h.n_events} device events, "
                   f"{h.n_cores} core{'s' * (h.n_cores != 1)})")
    if s.dumps:
        out.append("- Compiler dumps: " + ", ".join(code(d) for d in s.dumps))
    out.append(f"- Steps from: {text(s.step_source)}. A step's time is the slowest core's (and, over hosts, "
               "the slowest host's); the breakdown is the mean per step and core.")
    if s.peak_flops_per_s:
        ridge = s.ridge_flops_per_byte
        source = s.gpu_peaks_source or s.peaks_source
        out.append(f"- Hardware peaks per {'GPU' if s.platform is Platform.GPU else 'core'} ({text(source)}): "
                   f"{fmt_flops(s.peak_flops_per_s)}, "
                   f"HBM {fmt_bandwidth(s.hbm_bytes_per_s)}"
                   + (f"; roofline ridge at {ridge:.0f} FLOP/byte" if ridge else "")
                   + (f"; {text(s.vmem.describe(fmt_bandwidth))}" if s.vmem is not None else "")
                   + (f"; generation {text(s.generation)}" if s.generation else ""))
    else:
        out.append("- Hardware peaks: none known for this device, so utilizations are not available.")
    out.append(f"- Tool: tpudiag {__version__}")
    if figures_note:
        out.append(f"- Figures: {figures_note}")
    for failure in report.failures:
        out.append(f"- Not analysed: {text(failure)}")
    return out + [""]


def kernels_section(report: Report) -> list[str]:
    """The Pallas kernels, one list item per kernel (compiler figures)."""
    if not report.kernels:
        return []
    out = ["## Pallas kernels", "", "Read from each kernel's serialised Mosaic body and the compiler's dumps "
           "(static figures, not measured).", ""]
    for k in report.kernels:
        lines = k.lines()
        out.append(f"- {code(k.op)}: {text(lines[0])}")
        out += [f"  - {text(line)}" for line in lines[1:]]
    return out + [""]


def render_markdown(report: Report, figures: Mapping[str, tuple[str, str]] | None = None,
                    figures_note: str = "", top: int = TOP_OPS) -> str:
    """The markdown report. `figures` maps a figure key to (link relative to the report, alt text)."""
    figures = figures or {}
    s = report.summary
    title = f"# Performance report: {code(s.input_path if s.mode == Mode.STATIC else (s.run or s.input_path))}"
    out = [title, ""]
    out += _summary(report)
    out += breakdown_section(report, figures)
    out += programs_section(report)
    out += categories_section(report, figures)
    out += _ops_section(report, figures, top)
    out += kernels_section(report)
    out += _findings_section(report)
    out += memory_section(report.memory, figures)
    out += _hosts_section(report, figures)
    if report.warnings:
        out += ["## Warnings", ""] + [f"- {text(w)}" for w in report.warnings] + [""]
    out += _methods(report, figures_note)
    return document(out)


def document(lines: Sequence[str]) -> str:
    """The markdown file from its lines; a last net shows any control character that slipped through escaped."""
    return printable("\n".join(lines).rstrip(), keep_newlines=True) + "\n"
