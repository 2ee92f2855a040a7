"""`analysis.host_compare` on hand-made step tables: each host's step time, spread, idle, I/O and
collective time per step, op time per step, and the straggler against the other hosts' median.

Every expected value is worked by hand from the module's definitions: a host's step is its slowest
core's; idle is the least idle core's, I/O and collectives the core with the most; the straggler
lags the median of the *other* hosts by more than max(fraction x that median, sigmas x the hosts'
median deviation).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from tpudiag.analysis.host_compare import HostStats, Straggler, find_straggler, host_stats, op_time_per_step
from tpudiag.model import schemas


def _steps(rows: list[tuple[str, int, int, int, int, int, int]]) -> pd.DataFrame:
    """(host, core, step, dur_ps, idle_ps, io_ps, collective_ps) rows as a `steps` table."""
    cols = list(zip(*rows))
    n = len(rows)
    return schemas.STEPS.frame({
        "host": list(cols[0]), "device": [f"/device:TPU:{c}" for c in cols[1]], "core": list(cols[1]),
        "step": list(cols[2]), "start_ps": [0] * n, "dur_ps": list(cols[3]), "busy_ps": [0] * n,
        "compute_ps": [0] * n, "collective_ps": list(cols[6]), "io_ps": list(cols[5]), "host_transfer_ps": [0] * n,
        "idle_ps": list(cols[4])})


def _analysis(steps: pd.DataFrame, hosts: list[str]) -> SimpleNamespace:
    return SimpleNamespace(steps=steps, profile=SimpleNamespace(hosts=[SimpleNamespace(host=h) for h in hosts]))


def test_host_stats_take_the_slowest_core_per_step_and_the_least_idle():
    steps = _steps([
        # host, core, step, dur, idle, io, collective
        ("h0", 0, 1, 100, 30, 5, 10), ("h0", 1, 1, 90, 20, 7, 12),
        ("h0", 0, 2, 110, 40, 6, 20), ("h0", 1, 2, 120, 50, 1, 14),
        ("h0", 0, 3, 105, 10, 2, 30), ("h0", 1, 3, 110, 60, 3, 18),
        ("h1", 0, 1, 200, 0, 0, 0),
    ])
    [h0, h1] = host_stats(_analysis(steps, ["h0", "h1"]))
    # step times per step: max(100, 90), max(110, 120), max(105, 110) = 100, 120, 110: mean 110
    assert h0.host == "h0" and h0.n_steps == 3 and h0.step_ps == 110.0
    assert h0.std_ps == pytest.approx(math.sqrt((10 ** 2 + 10 ** 2 + 0) / 3))  # population deviation
    assert h0.idle_ps == pytest.approx((20 + 40 + 10) / 3)  # least idle core per step
    assert h0.io_ps == pytest.approx((7 + 6 + 3) / 3)  # most I/O core per step
    assert h0.collective_ps == pytest.approx((12 + 20 + 30) / 3)  # most collective core per step
    assert h1 == HostStats("h1", 1, 200.0, 0.0, 0.0, 0.0, 0.0)  # one step: no deviation
    assert all(isinstance(v, float) for v in (h0.step_ps, h0.std_ps, h0.idle_ps, h1.std_ps))


def test_two_steps_have_a_deviation_and_a_host_without_steps_is_left_out():
    steps = _steps([("h1", 0, 1, 100, 0, 0, 0), ("h1", 0, 2, 140, 0, 0, 0)])
    [h1] = host_stats(_analysis(steps, ["h0", "h1"]))  # h0 is in the profile but has no steps
    assert (h1.host, h1.n_steps, h1.step_ps, h1.std_ps) == ("h1", 2, 120.0, 20.0)


def test_hosts_come_in_the_profiles_order():
    steps = _steps([("a", 0, 1, 100, 0, 0, 0), ("b", 0, 1, 100, 0, 0, 0)])
    assert [s.host for s in host_stats(_analysis(steps, ["b", "a"]))] == ["b", "a"]


# ---------------------------------------------------------------------------------------------
# Op time per step


def _ops(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame({"host": pd.Categorical([r[0] for r in rows]), "name": pd.Categorical([r[1] for r in rows]),
                         "category": pd.Categorical([r[2] for r in rows])})


def _means(host: str, rows: list[tuple[str, float]]) -> pd.DataFrame:
    return schemas.OP_MEANS.frame({"host": [host] * len(rows), "name": [r[0] for r in rows],
                                   "self_ps": [r[1] for r in rows]})


def test_op_time_per_step_per_host_with_each_ops_category():
    digests = {"h0": SimpleNamespace(op_means=_means("h0", [("fusion.1", 1500.0), ("copy.2", 20.5)])),
               "h1": SimpleNamespace(op_means=_means("h1", [("fusion.1", 1700.0), ("gone.3", 4.0)]))}
    ops = _ops([("h0", "fusion.1", "convolution fusion"), ("h0", "copy.2", "copy"),
                ("h1", "fusion.1", "convolution fusion"), ("h0", "fusion.1", "other program's category")])
    t = op_time_per_step(SimpleNamespace(digests=digests, ops=ops))
    assert list(t.columns) == ["host", "name", "category", "self_ps"]
    rows = list(t.itertuples(index=False, name=None))
    # an op's first row gives its category; an op missing from the ops table has none
    assert rows == [("h0", "fusion.1", "convolution fusion", 1500.0), ("h0", "copy.2", "copy", 20.5),
                    ("h1", "fusion.1", "convolution fusion", 1700.0), ("h1", "gone.3", "", 4.0)]
    assert t["self_ps"].dtype == "float64"


def test_op_time_per_step_without_means_is_an_empty_table():
    t = op_time_per_step(SimpleNamespace(digests={"h0": SimpleNamespace(op_means=_means("h0", []))},
                                         ops=_ops([("h0", "fusion.1", "loop fusion")])))
    assert t.empty and list(t.columns) == ["host", "name", "category", "self_ps"]


# ---------------------------------------------------------------------------------------------
# The straggler


def _host(name: str, step_ps: float, std_ps: float = 0.0, collective_ps: float = 0.0) -> HostStats:
    return HostStats(name, 10, step_ps, std_ps, 0.0, 0.0, collective_ps)


def test_a_host_lagging_the_others_median_beyond_the_band_is_the_straggler():
    # h2 at 130 against the others' median 100: a lag of 30 over a band of max(0.03 x 100, 3 x 2) = 6.
    # The others wait in collectives: their median 50 (40, 60) less the straggler's 10 = 40.
    stats = [_host("h0", 100.0, 2.0, 40.0), _host("h1", 100.0, 2.0, 60.0), _host("h2", 130.0, 2.0, 10.0)]
    assert find_straggler(stats, 0.03, 3.0) == Straggler("h2", 30.0, 100.0, 6.0, 40.0)


def test_the_band_is_the_larger_of_the_fraction_and_the_noise():
    # the fraction decides: 0.25 x 100 = 25; a lag of exactly 25 is inside, 26 beyond
    quiet = [_host("h0", 100.0), _host("h1", 100.0), _host("h2", 125.0)]
    assert find_straggler(quiet, 0.25, 3.0) is None
    s = find_straggler([_host("h0", 100.0), _host("h1", 100.0), _host("h2", 126.0)], 0.25, 3.0)
    assert (s.host, s.lag_ps, s.band_ps) == ("h2", 26.0, 25.0)
    # the noise decides: the median deviation (4, of 1, 4, 9) x 3 = 12 against 0.01 x 100 = 1
    noisy = [_host("h0", 100.0, 1.0), _host("h1", 100.0, 4.0), _host("h2", 112.0, 9.0)]
    assert find_straggler(noisy, 0.01, 3.0) is None
    s = find_straggler([*noisy[:2], _host("h2", 113.0, 9.0)], 0.01, 3.0)
    assert (s.host, s.band_ps, s.reference_ps) == ("h2", 12.0, 100.0)


def test_against_one_other_host_that_host_is_the_reference():
    s = find_straggler([_host("a", 100.0), _host("b", 150.0)], 0.03, 3.0)
    assert (s.host, s.lag_ps, s.reference_ps, s.band_ps) == ("b", 50.0, 100.0, 3.0)


def test_the_reference_is_the_median_of_the_other_hosts_not_the_smallest():
    # others of h3: 100, 120, 140 -> median 120 (the smallest would be 100)
    s = find_straggler([_host("h0", 100.0), _host("h1", 120.0), _host("h2", 140.0), _host("h3", 200.0)], 0.03, 3.0)
    assert (s.host, s.reference_ps, s.lag_ps) == ("h3", 120.0, 80.0)


def test_against_two_other_hosts_the_reference_is_their_mean():
    # the median of two values is their mean: others of h2 are 100 and 120, reference 110 (not 100)
    s = find_straggler([_host("h0", 100.0), _host("h1", 120.0), _host("h2", 200.0)], 0.03, 3.0)
    assert (s.host, s.reference_ps, s.lag_ps) == ("h2", 110.0, 90.0)


def test_of_several_stragglers_the_largest_lag_is_named():
    stats = [_host("h0", 100.0), _host("h1", 100.0), _host("h2", 100.0), _host("h3", 150.0), _host("h4", 180.0)]
    s = find_straggler(stats, 0.03, 3.0)
    assert (s.host, s.lag_ps) == ("h4", 80.0)  # others' median 100 (100, 100, 100, 150)


def test_no_straggler_with_fewer_than_two_hosts_or_all_alike():
    assert find_straggler([], 0.03, 3.0) is None
    assert find_straggler([_host("h0", 500.0)], 0.03, 3.0) is None
    assert find_straggler([_host("h0", 100.0), _host("h1", 100.0)], 0.0, 0.0) is None


def test_a_straggler_that_waits_more_than_the_others_makes_them_wait_zero():
    s = find_straggler([_host("h0", 100.0, 0.0, 10.0), _host("h1", 100.0, 0.0, 10.0), _host("h2", 150.0, 0.0, 30.0)],
                       0.03, 3.0)
    assert s.others_wait_ps == 0.0
