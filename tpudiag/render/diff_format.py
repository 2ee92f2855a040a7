"""Shared wording and number formats of the diff renderers (terminal, markdown, JSON)."""

from __future__ import annotations

from tpudiag.analysis.diff import Change, Diff
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
