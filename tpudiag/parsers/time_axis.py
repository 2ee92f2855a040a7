"""Where each line of a host file sits on the host's time axis, in int64 picoseconds.

A line's events are `timestamp_ns` x 1000 + `offset_ps`, but producers choose the clock of
`timestamp_ns`: TPU device lines are 0 (their events are offsets from the profile's start), while
`/host:CPU` lines may be relative to the profile's start or absolute epoch nanoseconds (~1.76e18),
and one file can mix the two. An epoch time in picoseconds does not fit in int64, so each line is
first put on its clock's origin; the rules, with XProf's reasons, are in docs/time-axis.md:

1. A line at or above `EPOCH_MIN_NS` is on an absolute (epoch) clock, else on a relative one.
2. When the `Task Environment` plane carries `profile_start_time` (an epoch time, written by the
   same TSL post-processing that made the other lines relative to it), epoch lines are rebased on
   it: one axis, whose relative lines stay as they are.
3. Without that anchor each clock is its own domain. A domain's origin is its earliest device
   line (its earliest line when it has no device line), so an all-epoch capture reads as before;
   lines further than `SPREAD_NS` from the domain's median are damage and do not set it.
4. Host events are aligned with device events only when both are on one axis; otherwise the
   host-derived analysis is skipped (`host_aligned`).

All arithmetic is on Python integers; a line whose start cannot be placed within ±`MAX_BASE_PS`
gets no base (`base_ps` returns None) and its caller drops it with a warning naming it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TASK_ENV_PLANE = "Task Environment"
PROFILE_START_STAT = "profile_start_time"
# 1e17 ns: March 1973 read as an epoch time, 3.2 years read as a time since a profile started or
# a machine booted. Real relative clocks stay far below, epoch clocks of any capture far above.
EPOCH_MIN_NS = 10**17
# A line's start on the axis stays within ±2^62 ps (53 days), so adding an int64 event offset
# either fits in int64 or is detected as an overflow, never wraps.
MAX_BASE_PS = 1 << 62
# A line this far (26 days) from the median of its clock's lines is not used as the origin, so one
# damaged timestamp cannot push every other line out of range.
SPREAD_NS = MAX_BASE_PS // 2000

RELATIVE, EPOCH = "relative", "epoch"


def clock_of(timestamp_ns: int) -> str:
    return EPOCH if timestamp_ns >= EPOCH_MIN_NS else RELATIVE


@dataclass(frozen=True)
class TimeAxis:
    """The host's time axis: which origin each line's `timestamp_ns` is measured from.

    Frozen and small, so it travels to the worker processes that parse device planes.
    """

    anchor_ns: int | None  # profile_start_time: epoch lines are rebased on it; None without one
    origins_ns: tuple[tuple[str, int], ...]  # (clock, origin) after any rebase
    host_aligned: bool  # host lines and device lines share one axis
    device_clocks: tuple[str, ...]  # the clocks device lines are on, after any rebase

    def base_ps(self, timestamp_ns: int) -> int | None:
        """The line's start in ps on this axis, or None when it cannot be placed in int64."""
        t, clock = _rebase(timestamp_ns, self.anchor_ns)
        base = (t - dict(self.origins_ns).get(clock, 0)) * 1000
        return base if -MAX_BASE_PS <= base <= MAX_BASE_PS else None

    @property
    def devices_aligned(self) -> bool:
        return len(self.device_clocks) <= 1


def _rebase(timestamp_ns: int, anchor_ns: int | None) -> tuple[int, str]:
    """(timestamp, clock) after rebasing an epoch timestamp on the anchor.

    TSL rewrites only lines at or after the profile start (`t >= start`); an epoch line that began
    before it is on the same clock, so it is rebased too, to a negative time.
    """
    clock = clock_of(timestamp_ns)
    if anchor_ns is not None and clock == EPOCH:
        return timestamp_ns - anchor_ns, RELATIVE
    return timestamp_ns, clock


def profile_anchor(value) -> int | None:
    """`profile_start_time` as an anchor: an epoch time in ns, else None (absent or not plausible)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if EPOCH_MIN_NS <= value < (1 << 63) else None


def time_axis(device_stamps: Iterable[int], host_stamps: Iterable[int], anchor_ns: int | None) -> TimeAxis:
    """The axis of a host from its device lines' and host lines' `timestamp_ns` and its anchor."""
    device = [_rebase(t, anchor_ns) for t in device_stamps]
    host = [_rebase(t, anchor_ns) for t in host_stamps]
    origins: dict[str, int] = {}
    for clock in (RELATIVE, EPOCH):
        on_device = [t for t, c in device if c == clock]
        anywhere = on_device or [t for t, c in host if c == clock]
        if anywhere:
            origins[clock] = _origin(anywhere)
    device_clocks = tuple(sorted({c for _, c in device}))
    host_clocks = {c for _, c in host}
    aligned = not device_clocks or (len(device_clocks) == 1 and host_clocks <= set(device_clocks))
    return TimeAxis(anchor_ns, tuple(sorted(origins.items())), aligned, device_clocks)


def _origin(stamps: list[int]) -> int:
    """The earliest timestamp within `SPREAD_NS` of the median: outliers are damage, not the origin."""
    ordered = sorted(stamps)
    median = ordered[len(ordered) // 2]
    return next(t for t in ordered if abs(t - median) <= SPREAD_NS)


# The warnings a host gets when its clocks cannot all be put on one axis.
DEVICE_CLOCKS_SPLIT = ("device planes are on two clocks (relative and epoch) and the capture has no "
                       "`profile_start_time` to align them: each is put on its own origin, so times across "
                       "them are not comparable")
HOST_NOT_ALIGNED = ("`/host:CPU` lines are on another clock than the device planes and the capture has no "
                    "`profile_start_time` to align them: idle time is not attributed to host activity")


def unplaceable(line: str, plane: str) -> str:
    return (f"a `{line}` line of `{plane}` dropped: its timestamp is too far from the others' to place "
            "in int64 picoseconds (a damaged timestamp)")
