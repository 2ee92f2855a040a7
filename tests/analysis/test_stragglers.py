"""The per-host step matrix and its stragglers, with a near miss under the threshold."""

from __future__ import annotations

import pytest

from tpudiag.analysis.stragglers import StragglerOptions, host_step_matrix
from tpudiag.model.report import Distribution, HostSummary


def host(name: str, steps: dict[int, int]) -> HostSummary:
    times = list(steps.values())
    dist = Distribution(len(times), sum(times) / len(times), 0.0, 0.0, min(times), max(times))
    return HostSummary(name, f"{name}.xplane.pb", "TPU v6 Lite", 4, 4, 100, dist, None, "/device:TPU:0",
                       step_numbers=tuple(steps), step_times_ps=tuple(times))


def test_slowest_host_over_the_threshold_is_the_straggler():
    hosts = (host("a", {1: 1000, 2: 1000, 3: 1000}), host("b", {1: 1000, 2: 1100, 3: 1004}),
             host("c", {1: 1000, 2: 1000, 3: 1000}))
    m = host_step_matrix(hosts)
    assert m.steps == (1, 2, 3)
    # step 2: b is 10 % behind the median; step 3: b is 0.4 % behind (near miss under 1 %); step 1: a tie.
    assert [(s.step, s.host, s.lag_ps) for s in m.stragglers] == [(2, "b", 100)]
    assert m.rows[1].straggler_steps == (2,) and m.rows[0].straggler_steps == ()
    assert m.rows[1].behind_fastest_ps == pytest.approx(104 / 3)
    assert m.straggler_on(2) == "b" and m.straggler_on(3) == ""
    assert [r.slowest_step for r in m.rows] == [1, 2, 1]  # ties: the first step


def test_threshold_is_an_option():
    hosts = (host("a", {1: 1000}), host("b", {1: 1004}))
    assert host_step_matrix(hosts, StragglerOptions(min_lag_fraction=0.001)).straggler_on(1) == "b"
    with pytest.raises(ValueError, match="min_lag_fraction"):
        StragglerOptions(min_lag_fraction=-1)


def test_steps_missing_on_a_host_show_as_none_and_one_host_has_no_stragglers():
    m = host_step_matrix((host("a", {1: 10, 2: 10}), host("b", {2: 30})))
    assert m.rows[1].times_ps == (None, 30)
    assert [s.step for s in m.stragglers] == [2]
    assert host_step_matrix((host("a", {1: 10, 2: 50}),)).stragglers == ()


def test_the_threshold_is_inclusive_and_a_tie_is_never_a_straggler():
    # b is exactly 10 % (100 ps) behind the median of 1,000 on step 1: at the threshold, so a straggler.
    hosts = (host("a", {1: 1000}), host("b", {1: 1100}), host("c", {1: 1000}))
    m = host_step_matrix(hosts, StragglerOptions(min_lag_fraction=0.1))
    assert [(s.step, s.host, s.lag_ps) for s in m.stragglers] == [(1, "b", 100)]
    assert [r.host for r in m.rows] == ["a", "b", "c"]
    # With no threshold at all, hosts level with the median still hold nothing back.
    level = host_step_matrix((host("a", {1: 1000}), host("b", {1: 1000})), StragglerOptions(min_lag_fraction=0))
    assert level.stragglers == ()


@pytest.mark.parametrize(("fraction", "ok"), [(0, True), (9.99, True), (10, False), (-0.01, False)])
def test_straggler_threshold_bounds(fraction, ok):
    if ok:
        StragglerOptions(min_lag_fraction=fraction)
    else:
        with pytest.raises(ValueError, match=r"\[0, 10\)"):
            StragglerOptions(min_lag_fraction=fraction)


def test_no_hosts_no_rows():
    m = host_step_matrix(())
    assert (m.steps, m.rows, m.stragglers) == ((), (), ())


def test_a_host_without_steps_has_a_row_and_no_figures():
    from tpudiag.model.report import HostSummary
    bare = HostSummary("d", "d.xplane.pb", "TPU v6 Lite", 4, 4, 100, None, None, "/device:TPU:0")
    m = host_step_matrix((host("a", {1: 1000, 2: 1200}), bare))
    a, d = m.rows
    assert (a.host, a.mean_ps, a.behind_fastest_ps, a.times_ps) == ("a", 1100, 0, (1000, 1200))
    assert (d.host, d.mean_ps, d.behind_fastest_ps, d.times_ps, d.slowest_step) == ("d", None, None, (None, None), None)
    assert m.stragglers == ()  # one host per step
