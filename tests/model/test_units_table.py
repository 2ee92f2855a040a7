"""Every unit formatter against a literal table: the expected strings are written out by hand, not
built with the formatters they test (a GB/s divided by 2^30, or a µs by 1e9, fails here)."""

from __future__ import annotations

import pytest

from tpudiag.model.units import (MAX_PLAUSIBLE_BYTES, MAX_PLAUSIBLE_TEXT, fmt_bandwidth, fmt_bytes, fmt_flops, fmt_pct,
                                 fmt_time, number_problem)


@pytest.mark.parametrize(("ps", "text"), [
    (None, "n/a"),
    (0, "0 ps"),
    (999, "999 ps"),
    (1_000, "1.0 ns"),
    (1_500, "1.5 ns"),
    (1_000_000, "1.0 µs"),
    (277_700_000, "277.7 µs"),
    (1_000_000_000, "1.00 ms"),
    (863_760_000_000, "863.76 ms"),
    (1_000_000_000_000, "1 s"),
    (77_800_000_000_000, "77.8 s"),
    (-1_500, "-1.5 ns"),
])
def test_fmt_time(ps, text):
    assert fmt_time(ps) == text


@pytest.mark.parametrize(("x", "text"), [
    (None, "n/a"), (0.0, "0.0%"), (0.5, "50.0%"), (1.0, "100.0%"), (0.0123, "1.2%"), (2.92, "292.0%"),
])
def test_fmt_pct(x, text):
    assert fmt_pct(x) == text


def test_fmt_pct_digits():
    assert fmt_pct(0.12345, digits=2) == "12.35%"


@pytest.mark.parametrize(("x", "text"), [
    (None, "n/a"),
    (197e12, "197 TFLOP/s"),
    (918e12, "918 TFLOP/s"),
    (1.5e15, "1.5 PFLOP/s"),
    (2.5e9, "2.5 GFLOP/s"),
    (3e6, "3 MFLOP/s"),
    (4e3, "4 kFLOP/s"),
    (12.0, "12 FLOP/s"),
])
def test_fmt_flops(x, text):
    assert fmt_flops(x) == text


@pytest.mark.parametrize(("x", "text"), [
    (None, "n/a"),
    (819e9, "819 GB/s"),          # v5e HBM: decimal gigabytes, not GiB
    (1.64e12, "1.64 TB/s"),       # v6e HBM
    (27.6e9, "27.6 GB/s"),
    (5e6, "5 MB/s"),
    (100.0, "100 B/s"),
])
def test_fmt_bandwidth(x, text):
    assert fmt_bandwidth(x) == text


@pytest.mark.parametrize(("x", "text"), [
    (None, "n/a"),
    (0, "0 B"),
    (1023, "1023 B"),
    (1024, "1 KiB"),
    (6144, "6 KiB"),
    (1 << 20, "1 MiB"),
    (5 * (1 << 20), "5 MiB"),
    (1 << 30, "1 GiB"),
    (5 * (1 << 30), "5 GiB"),     # binary units: 5 GiB is 5,368,709,120 bytes
    (16 * 10**9, "14.9 GiB"),
])
def test_fmt_bytes(x, text):
    assert fmt_bytes(x) == text


@pytest.mark.parametrize(("value", "positive", "problem"), [
    (0.2, False, None),
    (0.0, False, None),
    (0.0, True, "must be > 0, got 0"),
    (-1.0, False, "must be >= 0, got -1"),
    (float("nan"), False, "must be a finite number, got nan"),
    (float("inf"), True, "must be a finite number, got inf"),
])
def test_number_problem(value, positive, problem):
    assert number_problem(value, positive) == problem


def test_the_plausible_byte_limit_is_one_pebibyte_and_says_so():
    # A byte count past 2^50 (1,125,899,906,842,624 B) is damage; messages name the limit in words.
    assert MAX_PLAUSIBLE_BYTES == 1_125_899_906_842_624
    assert MAX_PLAUSIBLE_TEXT == "1 PiB"


@pytest.mark.parametrize(("ps", "text"), [
    # Values on a decimal tie that is exact in binary (1.75 = 7/4, 1.375 = 11/8): Python's format
    # rounds the exact value half to even, so each rounds up. A divisor off by one (1e9 + 1, as
    # mutmut tried) moves the value below the tie and prints the lower digit.
    (1_750, "1.8 ns"),
    (1_750_000, "1.8 µs"),
    (1_375_000_000, "1.38 ms"),
    (1_375_000_000_000, "1.38 s"),
])
def test_fmt_time_divides_by_the_exact_power_of_ten(ps, text):
    assert fmt_time(ps) == text


@pytest.mark.parametrize(("x", "text"), [
    # Exactly one of each unit takes that unit (>= not >, the scale exactly 10^3k).
    (1e15, "1 PFLOP/s"), (1e12, "1 TFLOP/s"), (1e9, "1 GFLOP/s"), (1e6, "1 MFLOP/s"), (1e3, "1 kFLOP/s"),
])
def test_fmt_flops_at_each_unit_boundary(x, text):
    assert fmt_flops(x) == text


@pytest.mark.parametrize(("x", "text"), [(1e12, "1 TB/s"), (1e9, "1 GB/s"), (1e6, "1 MB/s")])
def test_fmt_bandwidth_at_each_unit_boundary(x, text):
    assert fmt_bandwidth(x) == text


def test_number_problem_accepts_zero_unless_asked_for_a_positive_number():
    # The default is the permissive reading: a share threshold of 0 is valid.
    assert number_problem(0.0) is None


def test_every_jnp_dtype_names_a_jax_type_of_the_hlo_types_size():
    """The lab writes these names into code: each must be a jax.numpy type whose item size is the
    HLO type's (jax's own dtype, not this table, is the expectation)."""
    import jax.numpy as jnp

    from tpudiag.model.units import JNP_DTYPES, element_bytes, jnp_dtypes

    for hlo, name in JNP_DTYPES.items():
        assert jnp.dtype(getattr(jnp, name)).itemsize == element_bytes(hlo), (hlo, name)
    assert jnp_dtypes("f32", "bf16") == {"f32": "float32", "bf16": "bfloat16"}
