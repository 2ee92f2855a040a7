"""Per-core work and the slowest core: the core with the most work, not the first of equal steps."""

from __future__ import annotations

import numpy as np
import pytest

from tpudiag.analysis.core_balance import core_work, slow_cores, slowest_core
from tpudiag.model import schemas


def _steps(work_by_core: dict[int, list[int]], collective_ps: int = 1000, dur_ps: int = 10_000) -> "pd.DataFrame":
    rows = [(core, step, w) for core, works in work_by_core.items() for step, w in enumerate(works)]
    busy = np.array([w + collective_ps for _, _, w in rows], dtype=np.int64)
    return schemas.STEPS.frame({
        "host": ["host0"] * len(rows), "device": [f"/device:TPU:{c}" for c, _, _ in rows],
        "core": np.array([c for c, _, _ in rows], dtype=np.int32), "step": np.array([s for _, s, _ in rows]),
        "start_ps": np.zeros(len(rows), dtype=np.int64), "dur_ps": np.full(len(rows), dur_ps, dtype=np.int64),
        "busy_ps": busy, "compute_ps": busy - collective_ps, "collective_ps": np.full(len(rows), collective_ps),
        "io_ps": np.zeros(len(rows), dtype=np.int64), "host_transfer_ps": np.zeros(len(rows), dtype=np.int64),
        "idle_ps": dur_ps - busy})


def test_the_slowest_core_has_the_most_work_when_steps_are_equal():
    # Equal step lengths on every core (markers), unequal work: the slowest is TPU:2, neither the
    # first core nor the least busy one.
    cores = core_work(_steps({0: [5000, 5000], 1: [4000, 4000], 2: [6000, 6200], 3: [5000, 5000]}))
    assert slowest_core(cores).device == "/device:TPU:2"
    assert [c.work_ps for c in cores] == [5000, 4000, 6100, 5000]
    assert slowest_core([]) is None


def test_a_slow_core_beyond_the_band_and_not_inside_it():
    cores = core_work(_steps({0: [5000] * 3, 1: [5000] * 3, 2: [5000] * 3, 3: [5400] * 3}))
    (slow,) = slow_cores(cores, 0.03, 3.0)
    assert slow.core.device == "/device:TPU:3" and slow.lag_ps == 400 and slow.reference_ps == 5000
    assert slow_cores(cores, 0.10, 3.0) == []  # 8 % inside a 10 % band


def _op_cores(rows):
    # (host, core, program, name, self_ps, in_steps_ps)
    return schemas.OP_CORES.frame({
        "host": [r[0] for r in rows], "device": [f"/device:TPU:{r[1]}" for r in rows],
        "core": np.array([r[1] for r in rows], dtype=np.int32), "program_id": np.array([r[2] for r in rows], dtype=np.uint64),
        "name": [r[3] for r in rows], "n": np.ones(len(rows), dtype=np.int64),
        "self_ps": np.array([r[4] for r in rows], dtype=np.int64),
        "in_steps_ps": np.array([r[5] for r in rows], dtype=np.int64)})


OP_CORE_ROWS = [("b", 1, 1, "fusion.1", 700, 500), ("b", 1, 1, "all-reduce.1", 500, 500),
                ("a", 0, 1, "fusion.1", 300, 200), ("a", 0, 1, "fusion.2", 100, 100),
                ("a", 0, 1, "all-gather.3", 900, 900), ("a", 0, 2, "fusion.1", 50, 50),
                ("a", 1, 1, "fusion.1", 400, 300)]


def test_without_steps_a_cores_work_is_its_non_collective_self_time_over_the_capture():
    from tpudiag.analysis.core_balance import CoreWork, capture_core_work
    # a/0: 300 + 100 + 50 (two programs), its all-gather left out; b/1: 700, its all-reduce left out.
    # Ordered by host then core, whatever the rows' order.
    assert capture_core_work(_op_cores(OP_CORE_ROWS), 5000.0) == [
        CoreWork("a", "/device:TPU:0", 0, 1, 450.0, 0.0, 5000.0),
        CoreWork("a", "/device:TPU:1", 1, 1, 400.0, 0.0, 5000.0),
        CoreWork("b", "/device:TPU:1", 1, 1, 700.0, 0.0, 5000.0)]


def test_the_slow_cores_extra_ops_over_the_median_of_the_others():
    from tpudiag.analysis.core_balance import OpExtra, capture_core_work, op_extras
    op_cores = _op_cores(OP_CORE_ROWS)
    cores = capture_core_work(op_cores, 5000.0)
    slow = cores[2]  # b/1
    cats = {"fusion.1": "convolution fusion", "all-reduce.1": "all-reduce"}
    # Inside steps (the default): fusion.1 is 250 on a/0 (two programs), 300 on a/1: median 275, b/1
    # runs it 500 (+225); all-reduce.1 runs only on b/1 (median 0: +500). Ops b/1 does not run
    # (fusion.2, all-gather.3) take no extra.
    assert op_extras(op_cores, cores, slow, cats) == [
        OpExtra("all-reduce.1", "all-reduce", 500.0, 0.0, 500.0),
        OpExtra("fusion.1", "convolution fusion", 500.0, 275.0, 225.0)]
    # Over the whole capture: self times, 350 and 400 -> median 375, b/1 700 (+325).
    assert op_extras(op_cores, cores, slow, cats, whole_capture=True) == [
        OpExtra("all-reduce.1", "all-reduce", 500.0, 0.0, 500.0),
        OpExtra("fusion.1", "convolution fusion", 700.0, 375.0, 325.0)]


def test_an_op_without_a_category_and_a_core_without_steps():
    from tpudiag.analysis.core_balance import OpExtra, capture_core_work, op_extras
    op_cores = _op_cores(OP_CORE_ROWS + [("b", 1, 1, "copy.1", 30, 30)])
    a0, _a1, b1 = capture_core_work(op_cores, 5000.0)
    # a/1's steps are not known (not among the cores): its rows are left out, so the peers' median is
    # a/0 alone (fusion.1 250); copy.1 has no category given: ''.
    assert op_extras(op_cores, [a0, b1], b1, {"fusion.1": "convolution fusion"}) == [
        OpExtra("all-reduce.1", "", 500.0, 0.0, 500.0),
        OpExtra("fusion.1", "convolution fusion", 500.0, 250.0, 250.0),
        OpExtra("copy.1", "", 30.0, 0.0, 30.0)]


def test_an_op_level_with_the_median_is_no_extra_and_one_picosecond_over_is():
    from tpudiag.analysis.core_balance import OpExtra, capture_core_work, op_extras
    rows = [(h, c, 1, name, ps, ps) for h, c, slow in (("a", 0, False), ("a", 1, False), ("b", 1, True))
            for name, ps in (("level.1", 100), ("over.1", 101 if slow else 100))]
    op_cores = _op_cores(rows)
    cores = capture_core_work(op_cores, 5000.0)
    assert op_extras(op_cores, cores, cores[2]) == [OpExtra("over.1", "", 101.0, 100.0, 1.0)]


# ---- the noise band and the slow cores, by hand ------------------------------------------------

def _core(host: str, core: int, work_ps: float, std_ps: float = 0.0):
    from tpudiag.analysis.core_balance import CoreWork

    return CoreWork(host, f"/device:TPU:{core}", core, 5, work_ps, std_ps, 10_000.0)


def test_the_noise_band_is_the_larger_of_the_lag_fraction_and_the_median_deviation():
    from tpudiag.analysis.core_balance import noise_band

    cores = [_core("a", 0, 5000, 10.0), _core("a", 1, 5000, 40.0), _core("a", 2, 5000, 100.0)]
    # 3 % of 5000 = 150; 3 sigmas of the median deviation (40) = 120: the fraction wins
    assert noise_band(5000.0, cores, 0.03, 3.0) == 150.0
    # 5 sigmas: 200, over the fraction's 150
    assert noise_band(5000.0, cores, 0.03, 5.0) == 200.0
    # no cores: no deviation, only the fraction (5 sigmas of nothing is 0)
    assert noise_band(5000.0, [], 0.03, 5.0) == 150.0


def test_a_core_must_lag_both_every_other_core_and_its_own_hosts_beyond_the_band():
    from tpudiag.analysis.core_balance import slow_cores

    # Host a: 4 cores at 5000 and a/4 at 5400; host b: 2 cores at 5500 (every core of b is slow
    # against the pod: that is a host's lag, not a core's). Median of every other core for a/4:
    # (5000 x 4, 5500 x 2) -> 5000; of its host mates: 5000. Lag 400, over a 3 % band (150).
    cores = [_core("a", c, 5000) for c in range(4)] + [_core("a", 4, 5400), _core("b", 0, 5500), _core("b", 1, 5500)]
    (slow,) = slow_cores(cores, 0.03, 3.0)
    assert (slow.core.host, slow.core.core) == ("a", 4)
    assert (slow.reference_ps, slow.host_reference_ps, slow.band_ps, slow.lag_ps) == (5000.0, 5000.0, 150.0, 400.0)


def test_a_core_alone_on_its_host_is_no_slow_core_and_does_not_stop_the_search():
    from tpudiag.analysis.core_balance import slow_cores

    # z/0 is first and alone on its host (straggler-host's case); a/2 after it is a slow core.
    cores = [_core("z", 0, 9000), _core("a", 0, 5000), _core("a", 1, 5000), _core("a", 2, 6000)]
    assert [(s.core.host, s.core.core) for s in slow_cores(cores, 0.03, 3.0)] == [("a", 2)]


def test_a_lag_exactly_at_the_band_is_not_slow():
    from tpudiag.analysis.core_balance import slow_cores

    # a/2 lags both references (5000) by exactly the 10 % band, 500: not beyond it
    cores = [_core("a", 0, 5000), _core("a", 1, 5000), _core("a", 2, 5500), _core("b", 0, 5000)]
    assert slow_cores(cores, 0.10, 3.0) == []
    # one picosecond more is
    cores[2] = _core("a", 2, 5501)
    assert [s.lag_ps for s in slow_cores(cores, 0.10, 3.0)] == [501.0]


def test_the_host_band_is_measured_on_the_hosts_own_reference():
    from tpudiag.analysis.core_balance import slow_cores

    # a/2 at 6000 lags the pod's median (b's 5000s dominate: 5000) by 1000, beyond 10 % (500), but its
    # host mates run 5600: 400 behind, inside the host band (10 % of 5600 = 560). Not a slow core.
    cores = [_core("a", 0, 5600), _core("a", 1, 5600), _core("a", 2, 6000)] + [_core("b", c, 5000) for c in range(4)]
    assert slow_cores(cores, 0.10, 3.0) == []
    # With noise (every core's work deviates by 200 from step to step, 3 sigmas: 600), both bands
    # are at least 600. a/2 at 6000 lags the pod's median (5000) by 1000, beyond; its mates' (5500)
    # by 500, inside: not slow. With its mates at 5000 it lags both by 1000, beyond 600: slow.
    noisy = [_core("a", 0, 5500, 200.0), _core("a", 1, 5500, 200.0), _core("a", 2, 6000, 200.0)] + [
        _core("b", c, 5000, 200.0) for c in range(3)]
    assert slow_cores(noisy, 0.03, 3.0) == []
    noisy[:2] = [_core("a", 0, 5000, 200.0), _core("a", 1, 5000, 200.0)]
    (slow,) = slow_cores(noisy, 0.03, 3.0)
    assert slow.band_ps == 600.0 and slow.lag_ps == 1000.0
    assert slow_cores(noisy, 0.03, 5.1) == []  # 5.1 sigmas: a band of 1020, over the lag


def test_slow_cores_come_slowest_first():
    from tpudiag.analysis.core_balance import slow_cores

    cores = [_core("a", c, 5000) for c in range(6)] + [_core("a", 6, 5600), _core("a", 7, 5900)]
    assert [(s.core.core, s.lag_ps) for s in slow_cores(cores, 0.03, 3.0)] == [(7, 900.0), (6, 600.0)]


def test_core_work_per_core_in_host_then_core_order_with_its_deviation():
    from tpudiag.analysis.core_balance import CoreWork

    steps = _steps({1: [6000, 6200], 0: [5000]})  # core 1's rows come first
    # core 1: work 6000 and 6200 (mean 6100, deviation 100); core 0: one step, no deviation
    assert core_work(steps) == [CoreWork("host0", "/device:TPU:0", 0, 1, 5000.0, 0.0, 10_000.0),
                                CoreWork("host0", "/device:TPU:1", 1, 2, 6100.0, 100.0, 10_000.0)]
    assert core_work(_steps({})) == []


def test_the_first_of_equally_slow_cores_is_the_slowest():
    cores = core_work(_steps({0: [5000], 1: [5000]}))
    assert slowest_core(cores).core == 0


def test_a_band_of_nothing_without_cores_or_reference():
    from tpudiag.analysis.core_balance import noise_band

    assert noise_band(0.0, [], 0.03, 5.0) == 0.0


@pytest.mark.parametrize("case", ["pod edge", "host edge", "host only"])
def test_each_reference_is_judged_on_its_own(case):
    from tpudiag.analysis.core_balance import slow_cores

    if case == "pod edge":  # a/2 lags its mates (4900) by 600 > 490, the pod's median (5000) by exactly 500
        others = [_core("a", 0, 4900), _core("a", 1, 4900), _core("b", 0, 5000), _core("b", 1, 5000),
                  _core("b", 2, 5100)]
    elif case == "host edge":  # the pod's median (4000): 1500 behind; its mates (5000): exactly 500
        others = [_core("a", 0, 5000), _core("a", 1, 5000)] + [_core("b", c, 4000) for c in range(3)]
    else:  # its mates (4900): 600 behind, beyond 490; the pod's median (5500) not at all
        others = [_core("a", 0, 4900), _core("a", 1, 4900)] + [_core("b", c, 5500) for c in range(4)]
    a2 = _core("a", 2, 5500)
    assert [s.core for s in slow_cores(others + [a2], 0.10, 3.0)] == []
