"""`analysis.limits.over_peak` and its warnings on a hand-built ops table: which rows are named, with
which rate (the amount over the time, worked by hand) against which host's peak, and the warnings'
whole text (one per quantity and cause, longest-running ops first, three named, the rest counted)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.limits import ASYNC_CAUSE, MODEL_CAUSE, OverPeak, over_peak, over_peak_warnings
from tpudiag.model.hardware import chip_for
from tpudiag.model.profile import DeviceInfo, PeaksSource, Platform

NAN = float("nan")
# host a: 100 TFLOP/s, 1 TB/s, no chip (no ICI peak); host b: 200 TFLOP/s, 2 TB/s, a v5e chip
A = DeviceInfo(Platform.TPU, "TPU v5 lite", None, 1e14, 1e12, PeaksSource.TRACE, 1, 1)
B = DeviceInfo(Platform.TPU, "", chip_for("v5e"), 2e14, 2e12, PeaksSource.HARDWARE_TABLE, 1, 1)


def _ops(rows: list[tuple]) -> pd.DataFrame:
    """(host, name, total_time_ps, flops, flop_rate, hbm_bytes, hbm_bw, ici_bytes, ici_time_ps, ici_bw)."""
    return pd.DataFrame(rows, columns=["host", "name", "total_time_ps", "flops", "flop_rate", "hbm_bytes", "hbm_bw",
                                       "ici_bytes", "ici_time_ps", "ici_bw"])


def test_only_nulled_rates_with_an_amount_and_a_time_are_named():
    ops = _ops([
        # 2e9 FLOP in 10 µs: 2e14 FLOP/s, nulled: named; its HBM rate stands
        ("a", "fusion.1", 10_000_000, 2e9, NAN, 1e6, 1e11, 0.0, 0, NAN),
        # nulled on host b too, 3e9 in 10 µs: 3e14, the faster row, on b; times add to 20 µs
        ("b", "fusion.1", 10_000_000, 3e9, NAN, 0.0, 0.0, 0.0, 0, NAN),
        # NaN rate but no FLOPs (no rate at all), or no time: not above any peak
        ("a", "fusion.2", 10_000_000, 0.0, NAN, 0.0, 0.0, 0.0, 0, NAN),
        ("a", "fusion.3", 0, 5e9, NAN, 0.0, 0.0, 0.0, 0, NAN),
        # a rate that stands: nothing to say
        ("a", "fusion.4", 10_000_000, 1e8, 1e13, 0.0, 0.0, 0.0, 0, NAN),
        # HBM: 3e7 B in 10 µs = 3 TB/s on a copy-done: async
        ("a", "copy-done.1", 10_000_000, 0.0, 0.0, 3e7, NAN, 0.0, 0, NAN),
        # ICI on b: 1e6 B over its 1 µs window: 1 TB/s; over 10 µs of total time it would be 100 GB/s
        ("b", "all-gather-done.1", 10_000_000, 0.0, 0.0, 0.0, 0.0, 1e6, 1_000_000, NAN),
    ])
    found = over_peak(ops, {"a": A, "b": B})
    assert [(o.op, o.quantity, o.rate, o.peak, o.time_ps) for o in found] == [
        ("fusion.1", "FLOP/s", pytest.approx(3e14), 2e14, 20_000_000),
        ("copy-done.1", "HBM bandwidth", pytest.approx(3e12), 1e12, 10_000_000),
        ("all-gather-done.1", "ICI bandwidth", pytest.approx(1e12), chip_for("v5e").ici_bytes_per_s, 10_000_000)]
    assert found[1].cause == ASYNC_CAUSE and found[1].is_async and not found[0].is_async
    assert found[0].cause.startswith("likely it runs in int8 or fp8") and "hardware table's peak is not" in found[0].cause
    assert found[2].cause.startswith("likely the payload or replica group modelled")
    assert over_peak(ops, {"a": A, "b": B}, modelled=True)[0].cause == MODEL_CAUSE
    assert found[0].fraction == pytest.approx(1.5)


def test_the_faster_row_names_its_host_whichever_comes_first():
    ops = _ops([("b", "fusion.1", 10_000_000, 3e9, NAN, 0.0, 0.0, 0.0, 0, NAN),
                ("a", "fusion.1", 10_000_000, 2e9, NAN, 0.0, 0.0, 0.0, 0, NAN)])
    (o,) = over_peak(ops, {"a": A, "b": B})
    assert (o.rate, o.peak, o.time_ps) == (pytest.approx(3e14), 2e14, 20_000_000)


def test_without_ici_columns_or_rows_there_is_nothing_to_check():
    ops = _ops([("a", "all-gather-done.1", 10, 0.0, 0.0, 0.0, 0.0, 1e6, 1, NAN)])
    assert over_peak(ops.drop(columns=["ici_bytes", "ici_time_ps", "ici_bw"]), {"a": A}) == ()
    assert over_peak(ops.iloc[:0], {"a": A}) == ()


def test_ops_are_named_in_name_order_per_quantity():
    ops = _ops([("a", n, 1_000_000, 1e9, NAN, 0.0, 0.0, 0.0, 0, NAN) for n in ("b.2", "a.1", "c.3")])
    assert [o.op for o in over_peak(ops, {"a": A})] == ["a.1", "b.2", "c.3"]


def test_warnings_name_the_three_longest_and_count_the_rest():
    found = [OverPeak(f"fusion.{i}", "FLOP/s", 1.5e14, 1e14, "cause x", t)
             for i, t in ((1, 10), (2, 40), (3, 20), (4, 40), (5, 5))]
    (warning,) = over_peak_warnings(found)
    assert warning == ("FLOP/s above the core's peak of 100 TFLOP/s, which none reaches: "
                       "`fusion.2` 150.0 TFLOP/s (150.0%), `fusion.4` 150.0 TFLOP/s (150.0%), "
                       "`fusion.3` 150.0 TFLOP/s (150.0%) and 2 more; cause x; "
                       "shown as n/a, and rules state no rate or saving for these ops")


def test_one_warning_per_quantity_and_cause_async_ops_by_name_only():
    found = [OverPeak("copy-done.1", "HBM bandwidth", 3e12, 1e12, ASYNC_CAUSE, 1),
             OverPeak("fusion.9", "HBM bandwidth", 1.5e12, 1e12, "cause y", 1),
             OverPeak("all-gather.1", "ICI bandwidth", 2e11, 1e11, "cause z", 1)]
    assert over_peak_warnings(found) == [
        f"HBM bandwidth above the core's peak of 1 TB/s, which none reaches: `copy-done.1`; {ASYNC_CAUSE}; "
        "shown as n/a, and rules state no rate or saving for these ops",
        "HBM bandwidth above the core's peak of 1 TB/s, which none reaches: `fusion.9` 1.5 TB/s (150.0%); cause y; "
        "shown as n/a, and rules state no rate or saving for these ops",
        "ICI bandwidth above the chip's ICI peak of 100 GB/s, which none reaches: `all-gather.1` 200 GB/s (200.0%); "
        "cause z; shown as n/a, and rules state no rate or saving for these ops"]
    assert over_peak_warnings([]) == []


def test_exactly_three_ops_are_named_without_more():
    found = [OverPeak(f"f.{i}", "FLOP/s", 2e14, 1e14, "c", 1) for i in range(3)]
    (warning,) = over_peak_warnings(found)
    assert "more" not in warning and warning.count("TFLOP/s (") == 3
    assert np.isclose(found[0].fraction, 2.0)


def test_one_op_over_the_flop_peak_and_a_name_without_a_suffix():
    (warning,) = over_peak_warnings([OverPeak("convolution", "FLOP/s", 2e14, 1e14, "c", 1)])
    assert warning.startswith("FLOP/s above the core's peak of 100 TFLOP/s, which none reaches: "
                              "`convolution` 200.0 TFLOP/s (200.0%); c;")
    ops = _ops([("a", "convolution", 1_000_000, 1e9, NAN, 0.0, 0.0, 0.0, 0, NAN)])
    (o,) = over_peak(ops, {"a": A})
    assert o.cause.startswith("likely it runs in int8 or fp8") and not o.is_async
