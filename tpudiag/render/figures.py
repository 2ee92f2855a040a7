"""PNG figures for the markdown report, drawn with matplotlib from Report fields only.

matplotlib is imported lazily (inside `write_figures`) and used through its object API with the
Agg canvas, so no global backend is switched and `tpudiag report` without figures never loads it.
It ships in the `report` extra (`pip install tpudiag[report]`).

Figures are written as `<stem>-<key>.png` in the directory given; nothing else is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tpudiag.errors import UsageError
from tpudiag.model.memory import largest_hbm_program
from tpudiag.model.report import Report
from tpudiag.model.text import one_line
from tpudiag.writers.files import atomic_open

PS_PER_MS = 1e9
ROOFLINE_LABELS = 5  # ops labelled by name on the roofline, by self time
DPI = 110
MARKER_MAX_STEPS = 60  # above this, per-host step lines are drawn without point markers


@dataclass(frozen=True)
class FigureFile:
    key: str  # step-breakdown, roofline, categories, host-steps, memory
    title: str
    path: Path
    alt: str  # text for the markdown image, what the picture shows


def _mpl():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UsageError("figures need matplotlib", hint="pip install 'tpudiag[report]', or pass --no-figures") from exc
    return Figure, FigureCanvasAgg


def _plain(text: str) -> str:
    """A label for matplotlib: `$` would start mathtext; controls show escaped (a glyph warning would quote them raw)."""
    return one_line(text).replace("$", r"\$")


def _finite(*values: float | None) -> bool:
    """Whether every value is a finite number: matplotlib raises on infinite or NaN axis limits."""
    return all(v is not None and math.isfinite(v) for v in values)


def _save(fig, canvas_type, path: Path) -> None:
    canvas_type(fig)
    # No Software/date metadata: the same report gives the same bytes.
    with atomic_open(path, "wb") as fh:  # a temp file renamed into place: never a partial or followed-link PNG
        fig.savefig(fh, format="png", dpi=DPI, metadata={"Software": None})


def _step_breakdown(report: Report, path: Path, Figure, Canvas) -> FigureFile | None:
    b = report.summary.breakdown
    if b is None or not b.step_ps or not _finite(b.step_ps, b.compute_ps, b.collective_ps, b.io_ps, b.idle_ps):
        return None
    parts = [("compute", b.compute_ps, "#4C72B0"), ("collectives", b.collective_ps, "#DD8452"),
             ("infeed/outfeed", b.io_ps, "#8172B3"),
             *((("host transfers", b.host_transfer_ps, "#55A868"),) if b.host_transfer_ps else ()),
             ("idle", b.idle_ps, "#BBBBBB")]
    fig = Figure(layout="constrained", figsize=(7.5, 2.4))
    ax = fig.add_subplot()
    left = 0.0
    for label, ps, color in parts:
        ms = ps / PS_PER_MS
        ax.barh([0], [ms], left=left, color=color, label=f"{label} {ms:.2f} ms")
        left += ms
    ax.set_yticks([])
    ax.set_xlabel("time per step (ms), mean over steps and cores")
    ax.set_title(f"Where a {b.step_ps / PS_PER_MS:.2f} ms step goes")
    fig.legend(ncol=4, loc="outside lower center", frameon=False, fontsize=8)
    _save(fig, Canvas, path)
    return FigureFile("step-breakdown", "Step-time breakdown", path,
                      "Stacked bar: compute, collectives, infeed/outfeed and idle time per step")


BOUND_COLORS = {"Compute": "#4C72B0", "HBM": "#DD8452", "VMEM": "#55A868"}  # others (latency, host link): grey
COLOR_NAMES = {"Compute": "blue", "HBM": "orange", "VMEM": "green"}
OTHER_COLOR = "#8C8C8C"
LEVEL_MARKERS = {"HBM": "o", "VMEM": "s"}


@dataclass(frozen=True)
class RooflinePoint:
    """One op as the roofline draws it: at its intensity at the memory level that binds it (the
    level whose roof is lowest there), and at its other levels as hollow points."""

    number: int
    name: str
    intensity: float  # FLOP per byte at `level`
    flop_rate: float
    level: str  # "HBM" (its HBM bytes and what its copies brought) or "VMEM" (its VMEM bytes)
    bound_by: str
    self_time_ps: int
    others: tuple[tuple[str, float], ...] = ()  # (level, intensity) of its other memory levels


def _vmem_roof(o, vmem) -> float | None:
    """Bytes/s of the VMEM roof the op is judged against: the direction (read or write) its bytes
    take longest in, as `analysis.ops` decides it; None without a VMEM peak."""
    if vmem is None:
        return None
    write = o.vmem_write_bytes / vmem.write_bytes_per_s > o.vmem_read_bytes / vmem.read_bytes_per_s
    return vmem.write_bytes_per_s if write else vmem.read_bytes_per_s


def roofline_points(report: Report) -> list[RooflinePoint]:
    """The ops the roofline draws, by self time, at each memory level where they have an intensity
    (FLOPs per HBM byte, copies' bytes counted; FLOPs per VMEM byte). The filled point is at the
    level that binds: the op's `bound_by` when that is a memory, else the level whose roof is lowest
    at its intensity (with no VMEM peak, HBM where it has HBM bytes). An op with no bytes at a level
    gets no intensity there; an op with no FLOP rate (none, or one above the peak) is not drawn."""
    s = report.summary
    out = []
    for o in report.ops:
        if not o.flop_rate or o.family or not _finite(o.flop_rate):
            continue
        levels: dict[str, float] = {}
        if o.hbm_intensity is not None and _finite(o.hbm_intensity):
            levels["HBM"] = o.hbm_intensity
        vmem_x = o.vmem_intensity
        if vmem_x is None and s.vmem is None and o.flops > 0 and o.vmem_read_bytes + o.vmem_write_bytes > 0:
            vmem_x = o.flops / (o.vmem_read_bytes + o.vmem_write_bytes)  # no VMEM roof: drawn, judged by none
        if vmem_x is not None and _finite(vmem_x):
            levels["VMEM"] = vmem_x
        if not levels:
            continue
        if o.bound_by in levels:
            level = o.bound_by
        else:
            roofs = {"HBM": s.hbm_bytes_per_s, "VMEM": _vmem_roof(o, s.vmem)}
            known = {k: x * roofs[k] for k, x in levels.items() if roofs[k]}
            level = min(known, key=known.get) if known else next(iter(levels))
        others = tuple((k, x) for k, x in levels.items() if k != level)
        out.append(RooflinePoint(len(out) + 1, o.name, levels[level], o.flop_rate, level, o.bound_by,
                                 o.self_time_ps, others))
    return out


def _overlaps(box, placed) -> bool:
    return any(box.overlaps(other) for other in placed)


def _draw_roof(ax, grid, bw: float, peak: float, **style) -> None:
    """A memory roof: bandwidth x FLOP/B up to where it meets the compute roof."""
    ridge = peak / bw
    xs = [x for x in grid if x <= ridge] + [ridge]
    ax.plot(xs, [x * bw for x in xs], **style)


def roofline_title(points: list[RooflinePoint], vmem, above: bool = False) -> str:
    """What the figure draws, said once: its roofs, what the colours and markers mean; `above`:
    some point sits above its HBM roof (bytes its copies brought while other ops ran)."""
    roofs = ["HBM", *(["VMEM"] if vmem is not None else []), "compute"]
    colours = sorted({p.bound_by for p in points}, key=lambda b: (b not in BOUND_COLORS, b))
    named = ", ".join(f"{COLOR_NAMES.get(b, 'grey')}: {b}" for b in colours)
    at = sorted({p.level for p in points} | {k for p in points for k, _ in p.others}, key=list(LEVEL_MARKERS).index)
    markers = ", ".join(f"{'circles' if k == 'HBM' else 'squares'}: FLOP per {k} byte" for k in at)
    hollow = any(p.others for p in points)
    return (f"Per-op roofline: {', '.join(roofs[:-1])} and {roofs[-1]} roofs (colour = bound by; {named}); "
            f"{markers}" + ("; filled: the level that binds, hollow: the op's other level" if hollow else "")
            + ("; no VMEM roof (no source gives this chip's VMEM bandwidth)"
               if vmem is None and "VMEM" in at else "")
            + ("; a point above the HBM roof counts bytes its copies brought from HBM while other ops ran"
               if above else ""))


def roofline_figure(report: Report, Figure, renderer_of):
    """The roofline figure and the texts it labels points with (`renderer_of(fig)` gives a renderer,
    to place labels without overlap); None when there is nothing to draw."""
    s = report.summary
    ridge = s.ridge_flops_per_byte
    points = roofline_points(report)
    # An infinite or NaN peak (a corrupt capture) has no roofline to draw.
    if ridge is None or not points or not _finite(ridge, s.peak_flops_per_s, s.hbm_bytes_per_s) or ridge <= 0:
        return None
    vmem = s.vmem if s.vmem is not None and _finite(s.vmem.read_bytes_per_s, s.vmem.write_bytes_per_s) else None
    shown = points[:ROOFLINE_LABELS]
    fig = Figure(layout="constrained", figsize=(7.5, 4.8 + 0.2 * len(shown)))
    ax, key = fig.subplots(2, 1, height_ratios=[4.8, 0.4 + 0.2 * len(shown)])
    xs = [p.intensity for p in points] + [x for p in points for _, x in p.others]
    ridges = [ridge] + ([s.peak_flops_per_s / vmem.read_bytes_per_s] if vmem else [])
    lo, hi = min(xs + ridges) / 10, max(xs + ridges) * 10
    grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
    _draw_roof(ax, grid, s.hbm_bytes_per_s, s.peak_flops_per_s, color=BOUND_COLORS["HBM"], lw=1.5,
               label="HBM roof (peak bandwidth x FLOP/B)")
    if vmem is not None:
        both = vmem.read_bytes_per_s == vmem.write_bytes_per_s
        _draw_roof(ax, grid, vmem.read_bytes_per_s, s.peak_flops_per_s, color=BOUND_COLORS["VMEM"], lw=1.5,
                   label=f"VMEM {'' if both else 'read '}roof ({_plain(vmem.source)})")
        if not both:
            _draw_roof(ax, grid, vmem.write_bytes_per_s, s.peak_flops_per_s, color=BOUND_COLORS["VMEM"], lw=1.2,
                       ls=":", label="VMEM write roof")
    ax.plot([min(ridges), hi], [s.peak_flops_per_s] * 2, color=BOUND_COLORS["Compute"], lw=1.5,
            label="compute roof (peak FLOP/s)")
    ax.axvline(ridge, color="grey", ls="--", lw=1)
    ax.annotate(f"HBM ridge {ridge:.0f} FLOP/B", (ridge, 0), xycoords=("data", "axes fraction"),
                textcoords="offset points", xytext=(4, 6), fontsize=8, color="grey")
    total = sum(p.self_time_ps for p in points) or 1
    for level, marker in LEVEL_MARKERS.items():
        at = [p for p in points if p.level == level]
        if at:
            ax.scatter([p.intensity for p in at], [p.flop_rate for p in at],
                       s=[20 + 600 * p.self_time_ps / total for p in at], marker=marker,
                       c=[BOUND_COLORS.get(p.bound_by, OTHER_COLOR) for p in at], alpha=0.7,
                       edgecolors="black", linewidths=0.5)
        other = [(p, x) for p in points for k, x in p.others if k == level]
        if other:
            ax.scatter([x for _, x in other], [p.flop_rate for p, _ in other], s=18, marker=marker,
                       facecolors="none", edgecolors=[BOUND_COLORS.get(p.bound_by, OTHER_COLOR) for p, _ in other],
                       linewidths=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    # At least two decades on each axis, so only the major ticks (powers of ten) are labelled.
    ax.set_ylim(min(min(p.flop_rate for p in points) / 3, s.peak_flops_per_s / 100), s.peak_flops_per_s * 2)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("FLOP per byte at each memory level (HBM: its HBM bytes and what its copies brought; "
                  "VMEM: modelled from the layouts)", fontsize=8)
    ax.set_ylabel("achieved FLOP/s per core")
    above = any(p.level == "HBM" and p.flop_rate > p.intensity * s.hbm_bytes_per_s * 1.001 for p in points)
    ax.set_title(roofline_title(points, vmem, above), fontsize=8, wrap=True)
    ax.legend(loc="upper left", fontsize=7)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    # Number the largest points; each number goes where it overlaps no other label, else it is left
    # out (the key below still lists the op, and says so).
    renderer = renderer_of(fig)
    placed, labels, unplaced = [], [], set()
    for p in shown:
        for dx, dy in ((6, 6), (6, -12), (-14, 6), (-14, -12), (10, 0), (-18, 0), (0, 12), (0, -16)):
            t = ax.annotate(str(p.number), (p.intensity, p.flop_rate), textcoords="offset points", xytext=(dx, dy),
                            fontsize=8, fontweight="bold")
            box = t.get_window_extent(renderer)
            if not _overlaps(box, placed):
                placed.append(box)
                labels.append(t)
                break
            t.remove()
        else:
            unplaced.add(p.number)
    key.axis("off")
    rows = [[str(p.number) + (" (unlabelled: crowded)" if p.number in unplaced else ""), _plain(p.name),
             p.bound_by, f"{p.intensity:,.3g} FLOP/B ({p.level})"] for p in shown]
    table = key.table(cellText=rows, colLabels=["#", "op", "bound by", "intensity"], loc="center", cellLoc="left",
                      colLoc="left", edges="horizontal")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    return fig, labels


def _roofline(report: Report, path: Path, Figure, Canvas) -> FigureFile | None:
    made = roofline_figure(report, Figure, lambda fig: Canvas(fig).get_renderer())
    if made is None:
        return None
    fig, _ = made
    _save(fig, Canvas, path)
    return FigureFile("roofline", "Per-op roofline", path,
                      "Log-log scatter of each op's FLOPs per byte at each memory level against achieved FLOP/s, "
                      "under the chip's HBM, VMEM (where its bandwidth is known) and compute roofs, with the HBM "
                      "ridge marked; the largest ops numbered, with a key below")


def _categories(report: Report, path: Path, Figure, Canvas) -> FigureFile | None:
    cats = [c for c in report.categories if c.self_time_ps > 0 and _finite(c.time_share)]
    if not cats:
        return None
    cats = list(reversed(cats[:12]))
    fig = Figure(layout="constrained", figsize=(7.5, 0.5 + 0.35 * len(cats)))
    ax = fig.add_subplot()
    ax.barh([_plain(c.category) for c in cats], [100 * c.time_share for c in cats], color="#4C72B0")
    for i, c in enumerate(cats):
        ax.annotate(f"{100 * c.time_share:.1f}%", (100 * c.time_share, i), textcoords="offset points",
                    xytext=(3, -3), fontsize=8)
    ax.set_xlabel("share of core time (self time of the category's ops)")
    ax.set_title("Time by op category")
    ax.margins(x=0.15)
    _save(fig, Canvas, path)
    return FigureFile("categories", "Time by op category", path,
                      "Horizontal bars: share of core time per HLO op category")


def _host_steps(report: Report, path: Path, Figure, Canvas) -> FigureFile | None:
    hosts = [h for h in report.hosts if h.step_times_ps and _finite(*h.step_times_ps)]
    if len(hosts) < 2:
        return None
    fig = Figure(layout="constrained", figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    for h in hosts:
        ax.plot(h.step_numbers, [t / PS_PER_MS for t in h.step_times_ps], lw=1, label=_plain(h.host),
                marker="o" if len(h.step_numbers) <= MARKER_MAX_STEPS else None, ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms), slowest core")
    ax.set_title("Step time per host")
    if len(hosts) <= 12:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(True, lw=0.3, alpha=0.5)
    _save(fig, Canvas, path)
    return FigureFile("host-steps", "Step time per host", path, "Lines: each host's step time, step by step")


GIB = float(1 << 30)


def _memory(report: Report, path: Path, Figure, Canvas) -> FigureFile | None:
    p = largest_hbm_program(report.memory)
    hbm = p.hbm if p is not None else None
    if hbm is None or not hbm.timeline_bytes:
        return None
    xs = list(range(len(hbm.timeline_bytes)))
    base = hbm.whole_program_bytes / GIB
    temps = [t / GIB for t in hbm.timeline_bytes]
    fig = Figure(layout="constrained", figsize=(7.5, 3.8))
    ax = fig.add_subplot()
    ax.fill_between(xs, 0, [base] * len(xs), step="mid", color="#4C72B0", alpha=0.8,
                    label=f"arguments, outputs, constants {base:.2f} GiB (whole program)")
    ax.fill_between(xs, base, [base + t for t in temps], step="mid", color="#DD8452", alpha=0.9,
                    label="temporaries live")
    ax.axhline(hbm.peak_bytes / GIB, color="black", lw=1, ls=":",
               label=f"reserved peak {hbm.peak_bytes / GIB:.2f} GiB (temporaries' heap at its largest)")
    if p.hbm_limit_bytes:
        ax.axhline(p.hbm_limit_bytes / GIB, color="#C44E52", lw=1.5,
                   label=f"usable HBM {p.hbm_limit_bytes / GIB:.2f} GiB ({_plain(p.usable_source)})")
    if hbm.peak_position is not None:
        ax.axvline(hbm.peak_position, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("program position (the compiler's schedule)")
    ax.set_ylabel("HBM (GiB)")
    ax.set_title(f"HBM over the program: {_plain(p.module)}")
    ax.set_ylim(0, max(base + max(temps, default=0), hbm.peak_bytes / GIB, (p.hbm_limit_bytes or 0) / GIB) * 1.15)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, lw=0.3, alpha=0.5)
    _save(fig, Canvas, path)
    return FigureFile("memory", "HBM over the program", path,
                      "Stacked area: HBM held for the whole program and temporaries live at each program position, "
                      "with the reserved peak and the usable HBM as lines")


def write_figures(report: Report, out_dir: Path, stem: str) -> dict[str, FigureFile]:
    """Draw every figure the report has data for into `out_dir`; keyed by `FigureFile.key`."""
    Figure, Canvas = _mpl()
    out: dict[str, FigureFile] = {}
    for key, draw in (("step-breakdown", _step_breakdown), ("roofline", _roofline), ("categories", _categories),
                      ("host-steps", _host_steps), ("memory", _memory)):
        made = draw(report, out_dir / f"{stem}-{key}.png", Figure, Canvas)
        if made is not None:
            out[key] = made
    return out
