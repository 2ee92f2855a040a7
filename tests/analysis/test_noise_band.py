"""The noise band of `analysis.diff.compare`, term by term, with hand-made spreads: each of its
four terms (relative floor, base spread, new spread, absolute floor) must be able to decide alone."""

from __future__ import annotations

import pytest

from tpudiag.analysis.diff import NoiseOptions, StepStats, compare

OPTIONS = NoiseOptions(min_relative=0.02)  # 2 % of the base centre


def stats(centre_ps: float, spread_ps: float) -> StepStats:
    return StepStats(n_steps=20, centre_ps=centre_ps, p10_ps=centre_ps - spread_ps, p90_ps=centre_ps + spread_ps,
                     spread_ps=spread_ps)


def test_a_quiet_base_and_a_noisy_new_run_take_the_new_runs_spread():
    # +5 % on a 100 µs step: beyond the 2 % floor and the quiet base, but inside the new run's ±8 µs.
    change = compare(stats(100e6, 0.0), stats(105e6, 8e6), OPTIONS)
    assert change.noise_band_ps == 8e6
    assert not change.significant


def test_a_noisy_base_and_a_quiet_new_run_take_the_base_spread():
    change = compare(stats(100e6, 8e6), stats(105e6, 0.0), OPTIONS)
    assert change.noise_band_ps == 8e6
    assert not change.significant


def test_quiet_runs_fall_back_to_the_relative_floor():
    change = compare(stats(100e6, 0.0), stats(105e6, 0.0), OPTIONS)
    assert change.noise_band_ps == pytest.approx(2e6)
    assert change.significant and change.verdict == "slower"


def test_the_absolute_floor_applies_when_it_is_the_largest():
    change = compare(stats(100e6, 0.0), stats(99e6, 0.0), OPTIONS, min_abs_ps=3e6)
    assert change.noise_band_ps == 3e6
    assert not change.significant


def test_a_confidence_interval_that_holds_zero_is_not_significant():
    change = compare(stats(100e6, 0.0), stats(105e6, 0.0), OPTIONS, ci=(-1e6, 9e6))
    assert not change.significant
    change = compare(stats(100e6, 0.0), stats(95e6, 0.0), OPTIONS, ci=(-9e6, -1e6))
    assert change.significant and change.verdict == "faster"
