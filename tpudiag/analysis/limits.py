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

The ops table (`analysis.ops`) holds no such rate: `above_peak` decides it there, per row at its
host's peak, and the rate is NaN. `over_peak` reads those marks once per analysis
(`Analysis.over_peak`), naming the ops for the report's warnings and for the rules, which state no
rate or saving for them. Collectives are checked against the
chip's ICI peak too, over the time their transfer took.

Pure: reads the ops table and the device facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.model.hlo_names import async_role
from tpudiag.model.profile import DeviceInfo, PeaksSource
from tpudiag.model.units import fmt_bandwidth, fmt_pct

# Above peak by more than rounding: a modelled capture's times are whole picoseconds.
TOLERANCE = 1e-3


def above_peak(rates: np.ndarray, peak: float | None) -> np.ndarray:
    """Which of `rates` (per second) are above `peak` by more than rounding; none without a peak."""
    rates = np.asarray(rates, dtype=np.float64)
    if not peak:
        return np.zeros(rates.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(rates) > peak * (1 + TOLERANCE)


@dataclass(frozen=True)
class OverPeak:
    """One op whose rate is above its core's peak."""

    op: str
    quantity: str  # "FLOP/s", "HBM bandwidth" or "ICI bandwidth"
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


def over_peak_warnings(found: Sequence[OverPeak]) -> list[str]:
    """One warning per quantity and cause, naming the longest-running ops first; the rates are shown
    as n/a everywhere else."""
    groups: dict[tuple[str, str], list[OverPeak]] = {}
    for o in found:
        groups.setdefault((o.quantity, o.cause), []).append(o)
    out = []
    for (quantity, cause), items in groups.items():
        items.sort(key=lambda o: (-o.time_ps, o.op))
        peak = (f"{items[0].peak / 1e12:.0f} TFLOP/s" if quantity == "FLOP/s" else fmt_bandwidth(items[0].peak))
        # An async op's rate as timed (bytes over a µs-long start or done) says nothing about the
        # hardware, and can be millions of percent of the peak: only its name is worth showing.
        named = ", ".join(f"`{o.op}`" if o.is_async else o.shown() for o in items[:_SHOWN])
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        whose = "chip's ICI" if quantity == "ICI bandwidth" else "core's"
        out.append(f"{quantity} above the {whose} peak of {peak}, which none reaches: {named}{more}; {cause}; "
                   "shown as n/a, and rules state no rate or saving for these ops")
    return out


MODEL_CAUSE = "a modelled op is never timed below its roofline, so this is a tpudiag modelling error: please report it"


def _cause(name: str, quantity: str, device: DeviceInfo, modelled: bool) -> str:
    if quantity == "ICI bandwidth":
        return ("likely the payload or replica group modelled for it is not what moved (without `replica_groups` "
                "in the HLO text every chip of the host is assumed), or the trace's time is not the transfer's")
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


def over_peak(ops: pd.DataFrame, devices: Mapping[str, DeviceInfo], modelled: bool = False) -> tuple[OverPeak, ...]:
    """The ops whose rate the ops table nulled (`analysis.ops` decides, per row, with `above_peak`
    at its host's peak): a FLOP rate or HBM bandwidth over its total time, or an ICI bandwidth over
    its transfer time, that is NaN where the amount and the time are not zero. One per op and
    quantity, its fastest row's rate (recomputed here to be named in the warning, never shown as a
    rate); `devices`: each host's device, by host name; `modelled`: the times are tpudiag's model,
    not a measurement (the cause then differs). Made once per analysis (`Analysis.over_peak`)."""
    if ops.empty:
        return ()
    hosts = ops["host"].astype(str).to_numpy()
    total = ops["total_time_ps"].to_numpy(dtype=np.float64)
    checks = [("FLOP/s", "flops", "flop_rate", total, lambda d: d.peak_flops_per_s),
              ("HBM bandwidth", "hbm_bytes", "hbm_bw", total, lambda d: d.hbm_bytes_per_s)]
    if "ici_bw" in ops.columns:
        checks.append(("ICI bandwidth", "ici_bytes", "ici_bw", ops["ici_time_ps"].to_numpy(dtype=np.float64),
                       lambda d: d.chip.ici_bytes_per_s if d.chip is not None else None))
    names = ops["name"].astype(str).to_numpy()
    times = ops["total_time_ps"].to_numpy(dtype=np.int64)
    out = []
    for quantity, amount_column, rate_column, time_ps, peak_of in checks:
        amount = ops[amount_column].to_numpy(dtype=np.float64)
        nulled = np.isnan(ops[rate_column].to_numpy(dtype=np.float64)) & (amount > 0) & (time_ps > 0)
        found: dict[str, tuple[float, int, str]] = {}  # op -> fastest rate, total time, its host
        for i in np.flatnonzero(nulled):
            rate = float(amount[i] / (time_ps[i] / 1e12))
            fastest, total_ps, host = found.get(names[i], (-1.0, 0, ""))
            if rate > fastest:
                fastest, host = rate, hosts[i]
            found[names[i]] = (fastest, total_ps + int(times[i]), host)
        for name in sorted(found):
            rate, total_ps, host = found[name]
            device = devices[host]
            out.append(OverPeak(name, quantity, rate, float(peak_of(device)), _cause(name, quantity, device, modelled),
                                total_ps))
    return tuple(out)
