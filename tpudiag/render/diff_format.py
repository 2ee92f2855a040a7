"""Shared wording and number formats of the diff renderers (terminal, markdown, JSON)."""

from __future__ import annotations

from tpudiag.analysis.diff import Attribution, Change, Diff, Part, PartKind
from tpudiag.model.units import fmt_bytes, fmt_time


def fmt_delta(ps: float) -> str:
    return ("+" if ps > 0 else "-" if ps < 0 else "±") + fmt_time(abs(ps))


def fmt_relative(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def fmt_ci(c: Change) -> str:
    if c.ci_low_ps is None or c.ci_high_ps is None:
        return "n/a"
    if c.ci_low_ps == c.ci_high_ps:
        return fmt_delta(c.ci_low_ps)
    return f"{fmt_delta(c.ci_low_ps)} … {fmt_delta(c.ci_high_ps)}"


def noise_rule(diff: Diff) -> str:
    o = diff.options
    lo, hi = (round(100 * q) for q in o.quantiles)
    return (f"A change is reported only when it exceeds its noise band: the largest of {100 * o.min_relative:g}% "
            f"of the base value, either run's spread over steps (half its p{lo}-p{hi} range) and, for ops, "
            f"collectives and breakdown parts, {100 * o.min_step_share:g}% of the base step time; and its "
            f"{100 * o.confidence:g}% bootstrap interval ({o.resamples} resamples of the steps) must exclude zero. "
            "Step time is compared by its median over steps; the rest by their mean per step and core.")


def change_cells(c: Change) -> list[str]:
    """base, new, delta, relative, band, confidence interval, verdict."""
    return [fmt_time(c.base.centre_ps), fmt_time(c.new.centre_ps), fmt_delta(c.delta_ps), fmt_relative(c.relative),
            f"±{fmt_time(c.noise_band_ps)}", fmt_ci(c), c.verdict]


def compiled_cells(o) -> list[str]:
    """Padding bytes base -> new, spills base -> new, for an `OpChange` with compiled facts."""
    def pad(f):
        return "n/a" if f is None or f.padding_bytes is None else fmt_bytes(f.padding_bytes)

    def spills(f):
        return "n/a" if f is None or f.spills is None else str(f.spills)

    return [f"{pad(o.base_compiled)} → {pad(o.new_compiled)}", f"{spills(o.base_compiled)} → {spills(o.new_compiled)}"]


PART_COLUMNS = ("part", "what", "base", "new", "change", "noise band", "collective windows")
_KIND_TEXT = {PartKind.OP: "op", PartKind.APPEARED: "op, new only", PartKind.GONE: "op, base only",
              PartKind.FAMILY: "collective family", PartKind.IDLE: "idle time",
              PartKind.UNATTRIBUTED: "not attributed"}


def part_name(p: Part) -> str:
    """The op (`base → new` when renamed), the family or the part's label; unescaped."""
    if p.kind is PartKind.OP and p.base_name != p.name:
        return f"{p.base_name} → {p.name}"
    return p.name


def part_cells(p: Part) -> list[str]:
    """what, base, new, change, noise band, collective windows (for the columns after the name)."""
    what = _KIND_TEXT[p.kind]
    if p.kind is PartKind.OP and p.matched_by != "name":
        what += f" (matched by {p.matched_by})"
    elif p.kind is PartKind.FAMILY:
        what += f" ({p.n_ops[0]} → {p.n_ops[1]} ops)"
    c = p.change
    base = fmt_time(c.base.centre_ps) if c is not None else ""
    new = fmt_time(c.new.centre_ps) if c is not None else ""
    band = f"±{fmt_time(c.noise_band_ps)}" if c is not None else "n/a"
    return [what, base, new, fmt_delta(p.delta_ps), band, p.exposure.text() if p.exposure is not None else ""]


def shown_parts(a: Attribution, top: int) -> tuple[list[Part], Part | None]:
    """The largest `top` parts that moved, and the unattributed rest wherever it ranks; the others
    are summed by `rest_text`."""
    moved = [p for p in a.parts if p.delta_ps or p.kind is PartKind.UNATTRIBUTED]
    shown = moved[:top]
    rest = next((p for p in moved[top:] if p.kind is PartKind.UNATTRIBUTED), None)
    return shown, rest


def rest_text(a: Attribution, shown: list[Part], rest: Part | None) -> str:
    """`12 smaller parts: +1.2 µs`, '' when every part that moved is shown."""
    hidden = [p for p in a.parts if (p.delta_ps or p.kind is PartKind.UNATTRIBUTED) and p not in shown
              and p is not rest]
    if not hidden:
        return ""
    return f"{len(hidden)} smaller part{'s' * (len(hidden) != 1)}: {fmt_delta(sum(p.delta_ps for p in hidden))}"


def attribution_summary(a: Attribution) -> str:
    """One line: how much of the change named ops and families account for."""
    share = a.named_share
    pct = "n/a" if share is None else f"{100 * share:.0f}%"
    return (f"The step-time change {fmt_delta(a.total_ps)} splits into the parts below, which add up to it: "
            f"named ops and collective families {fmt_delta(a.named_ps)} ({pct} of the change), idle time and the "
            f"unattributed rest {fmt_delta(a.total_ps - a.named_ps)}. Per step and core; a collective family holds "
            "all its ops.")


def exposure_moves(diff: Diff) -> list:
    """Matched collectives whose windows moved between exposed and hidden."""
    return [o for o in diff.ops if o.exposure is not None and o.exposure.moved]


def no_steps_line(diff: Diff) -> str:
    """Why no step time is compared, and what op times are instead."""
    return (f"Step time: not compared (a run has no steps). Op times are each op's total self time per core "
            f"over the capture ({fmt_time(diff.base_capture_ps)} base, {fmt_time(diff.new_capture_ps)} new).")
