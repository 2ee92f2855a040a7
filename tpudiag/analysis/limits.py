"""Physical limits: an op whose rate is above the chip's peak is a measurement problem, not a fact.

A core cannot do more FLOP/s than its peak nor move HBM bytes faster than its bandwidth. When an
op's FLOPs or HBM bytes over its time (as XProf computes its rates) exceed the peak, the rate is
an artefact, and no rule may state it or build a saving on it. The likely cause, named in the
warning, depends on the op and the input:

- an async op in a measured trace: the trace counts a copy's or collective's bytes on its `-done`
  (or `-start`) while the transfer runs between the two, so bytes over the done's own time
  overstate the rate;
- another op in a measured trace: it runs at a precision whose peak is above the bf16 peak used
  here (int8 or fp8, on generations that have a faster one), its FLOP count holds work the core
  did not do (padding), its bytes are not all HBM traffic, or the peak is not this core's (another
  generation's, or per chip where the op runs on one core);
- a modelled capture (`tpudiag simulate`, static mode): none of these, since the model never
  times an op below its FLOPs and HBM roofline (`analysis.cost_model`) nor puts a DMA's bytes on a
  short done (`compiler.simulate`); a rate above peak there is a tpudiag bug.

Pure: reads the ops table and the device facts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tpudiag.model.hlo_names import async_role
from tpudiag.model.profile import DeviceInfo, PeaksSource
from tpudiag.model.units import fmt_bandwidth, fmt_pct

# Above peak by more than rounding: a modelled capture's times are whole picoseconds.
TOLERANCE = 1e-3


@dataclass(frozen=True)
class OverPeak:
    """One op whose rate is above its core's peak."""

    op: str
    quantity: str  # "FLOP/s" or "HBM bandwidth"
    rate: float  # per second
    peak: float
    cause: str
    time_ps: int = 0  # the op's total time, summed over occurrences

    @property
    def is_async(self) -> bool:
        return self.cause == ASYNC_CAUSE

    @property
    def fraction(self) -> float:
        return self.rate / self.peak

    def shown(self) -> str:
        rate = f"{self.rate / 1e12:.1f} TFLOP/s" if self.quantity == "FLOP/s" else fmt_bandwidth(self.rate)
        return f"`{self.op}` {rate} ({fmt_pct(self.fraction)})"


ASYNC_CAUSE = ("likely async ops whose transfer runs from start to done while the trace counts the bytes on "
               "one of them")
_SHOWN = 3  # ops named per warning; the rest are counted


def over_peak_warnings(found: list[OverPeak]) -> list[str]:
    """One warning per quantity and cause, naming the longest-running ops first."""
    groups: dict[tuple[str, str], list[OverPeak]] = {}
    for o in found:
        groups.setdefault((o.quantity, o.cause), []).append(o)
    out = []
    for (quantity, cause), items in groups.items():
        items.sort(key=lambda o: (-o.time_ps, o.op))
        peak = (f"{items[0].peak / 1e12:.0f} TFLOP/s" if quantity == "FLOP/s" else fmt_bandwidth(items[0].peak))
        named = ", ".join(o.shown() for o in items[:_SHOWN])
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        out.append(f"{quantity} above the core's peak of {peak}, which no core reaches: {named}{more}; {cause}; "
                   "rules state no rate or saving for these ops")
    return out


MODEL_CAUSE = "a modelled op is never timed below its roofline, so this is a tpudiag modelling error: please report it"


def _cause(name: str, quantity: str, device: DeviceInfo, modelled: bool) -> str:
    if modelled:
        return MODEL_CAUSE
    if async_role(name) is not None or name.split(".")[0].endswith(("-done", "-start")):
        return ASYNC_CAUSE
    source = "the trace's" if device.peaks_source is PeaksSource.TRACE else "the hardware table's"
    kind = f" for {device.device_type}" if device.device_type else ""
    peak = f"{source} peak{kind} is not this core's (another generation's, or per chip where the op runs on one core)"
    if quantity == "FLOP/s":
        return (f"likely it runs in int8 or fp8, whose peak can be above the bf16 peak used here, its FLOP count "
                f"holds work the core did not do (padding), or {peak}")
    return f"likely its bytes are not all HBM traffic (on-chip memory counted as HBM), or {peak}"


def over_peak(ops: pd.DataFrame, device: DeviceInfo, modelled: bool = False) -> list[OverPeak]:
    """Ops whose FLOP rate or HBM bandwidth, summed over their occurrences, exceeds the core's peak;
    `modelled`: the times are tpudiag's model, not a measurement (the cause then differs)."""
    if ops.empty:
        return []
    # Collectives move their bytes over ICI as much as HBM, and their trace bytes are not an HBM
    # rate; only their FLOPs are checked.
    collective = ops["family"].astype(str) != "" if "family" in ops.columns else pd.Series(False, index=ops.index)
    ops = ops.assign(hbm_bytes=ops["hbm_bytes"].where(~collective, 0))
    grouped = (ops.assign(name=ops["name"].astype(str))
               .groupby("name", sort=True)[["flops", "hbm_bytes", "total_time_ps"]].sum())
    grouped = grouped[grouped["total_time_ps"] > 0]
    seconds = grouped["total_time_ps"] / 1e12
    out = []
    for quantity, column, peak in (("FLOP/s", "flops", device.peak_flops_per_s),
                                   ("HBM bandwidth", "hbm_bytes", device.hbm_bytes_per_s)):
        if not peak:
            continue
        rate = grouped[column] / seconds
        for name, value in rate[rate > peak * (1 + TOLERANCE)].items():
            cause = _cause(str(name), quantity, device, modelled)
            out.append(OverPeak(str(name), quantity, float(value), float(peak), cause,
                                int(grouped.at[name, "total_time_ps"])))
    return out


def over_peak_names(ops: pd.DataFrame, device: DeviceInfo) -> frozenset[str]:
    """Names of the ops no rule may state a rate for (`over_peak`)."""
    return frozenset(o.op for o in over_peak(ops, device))
