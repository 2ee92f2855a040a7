"""Per-core work and the slowest core: the core with the most work, not the first of equal steps."""

from __future__ import annotations

import numpy as np

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
