"""`analysis.diff.diff_analyses` on stand-in analyses holding only the tables it reads.

No capture is written: each run is one host, one core, a steps table, the ops table's key columns,
the per-step op sums and the collectives' windows, all typed in the test, so every expected figure
is worked by hand from them (the module docstring's definitions). They cover what no designed
capture has: host transfers, an op that runs only outside every step, a step numbered 0, two
collective families and a collective that has windows in one run only."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import pandas as pd

from tpudiag.analysis.diff import NoiseOptions, _first_runs, _per_step_op_times, diff_analyses
from tpudiag.model.profile import Platform

US = 1_000_000  # ps
OPTS = NoiseOptions(resamples=0)  # no bootstrap: the verdicts rest on the band alone


def _run(steps: list[tuple[int, int, int]], ops: list[tuple[str, str]], sums: list[tuple[int, str, int]],
         windows: dict[str, int] | None = None) -> SimpleNamespace:
    """steps: (step, dur_ps, host_transfer_ps); ops: (name, category) of program 7, module jit_m;
    sums: (step, name, self_ps); windows: collective name -> span_ps (all of it exposed)."""
    steps_table = pd.DataFrame({
        "host": ["h0"] * len(steps), "core": [0] * len(steps), "step": [s for s, _, _ in steps],
        "dur_ps": [d for _, d, _ in steps], "compute_ps": [d // 2 for _, d, _ in steps],
        "collective_ps": [0] * len(steps), "io_ps": [0] * len(steps), "host_transfer_ps": [h for _, _, h in steps],
        "idle_ps": [d - d // 2 - h for _, d, h in steps]})
    ops_table = pd.DataFrame({"host": "h0", "program_id": np.array([7] * len(ops), np.uint64), "module": "jit_m",
                              "name": [n for n, _ in ops], "category": [c for _, c in ops],
                              "shape_with_layout": "f32[8]{0}", "source": "", "tf_op": ""})
    op_sums = pd.DataFrame({"step": [s for s, _, _ in sums], "program_id": np.array([7] * len(sums), np.uint64),
                            "name": pd.Categorical([n for _, n, _ in sums]), "self_ps": [t for _, _, t in sums]})
    w = windows or {}
    collectives = pd.DataFrame({"name": list(w), "span_ps": list(w.values()), "exposed_ps": list(w.values())})
    host = SimpleNamespace(host="h0", op_metadata=pd.DataFrame(), events=None,
                           device=SimpleNamespace(device_type="TPU v6 lite"))
    total = sum(d for _, d, _ in steps) or US
    return SimpleNamespace(steps=steps_table, ops=ops_table, per_step=SimpleNamespace(op_step_sums=op_sums),
                           collectives=lambda thresholds: SimpleNamespace(ops=collectives), n_cores_of_ops=1,
                           core_time_ps={"h0/0": total}, platform=Platform.TPU,
                           profile=SimpleNamespace(hosts=[host], input_path="run", run="r", modelled=False))


STEPS = [(1, 10 * US, 0), (2, 10 * US, 0), (3, 10 * US, 0)]


def test_host_transfers_get_a_breakdown_row_when_either_run_has_them():
    ops = [("fusion.1", "loop fusion")]
    sums = [(s, "fusion.1", 4 * US) for s in (1, 2, 3)]
    # new: 2 us of host transfers in each step (out of its idle time); base: none
    with_transfers = [(s, d, 2 * US) for s, d, _ in STEPS]
    for base, new, delta in ((STEPS, with_transfers, 2 * US), (with_transfers, STEPS, -2 * US)):
        d = diff_analyses(_run(base, ops, sums), _run(new, ops, sums), options=OPTS)
        rows = {c.name: c.change.delta_ps for c in d.breakdown}
        assert list(rows) == ["compute", "collectives", "infeed/outfeed", "host transfers", "idle"]
        assert rows["host transfers"] == delta and rows["idle"] == -delta
    # neither run has any: no row
    d = diff_analyses(_run(STEPS, ops, sums), _run(STEPS, ops, sums), options=OPTS)
    assert [c.name for c in d.breakdown] == ["compute", "collectives", "infeed/outfeed", "idle"]


def test_an_op_that_runs_only_outside_every_step_in_one_run_counts_zero_there():
    ops = [("fusion.1", "loop fusion"), ("copy.2", "data formatting")]
    # base: copy.2 runs only outside the steps (-1); new: 3 us in each step
    base = _run(STEPS, ops, [(s, "fusion.1", 4 * US) for s in (1, 2, 3)] + [(-1, "copy.2", 9 * US)])
    new = _run(STEPS, ops, [(s, "fusion.1", 4 * US) for s in (1, 2, 3)] + [(s, "copy.2", 3 * US) for s in (1, 2, 3)])
    d = diff_analyses(base, new, options=OPTS)
    (copy,) = [o for o in d.ops if o.name == "copy.2"]
    assert (copy.change.base.centre_ps, copy.change.new.centre_ps, copy.change.delta_ps) == (0.0, 3 * US, 3 * US)
    assert copy.change.base.n_steps == 3  # a zero for each of the base's three steps


def test_a_step_without_any_op_counts_zero_for_every_op():
    ops = [("fusion.1", "loop fusion")]
    # step 2 of the new run runs no op at all: fusion.1's mean is (6 + 0 + 6) / 3 = 4 us
    base = _run(STEPS, ops, [(s, "fusion.1", 4 * US) for s in (1, 2, 3)])
    new = _run(STEPS, ops, [(1, "fusion.1", 6 * US), (3, "fusion.1", 6 * US)])
    (op,) = diff_analyses(base, new, options=OPTS).ops
    assert op.change.new.n_steps == 3 and op.change.new.centre_ps == 4 * US and op.change.delta_ps == 0


def test_steps_numbered_from_zero_count_their_step_zero():
    a = SimpleNamespace(steps=pd.DataFrame({"step": [0, 1]}), n_cores_of_ops=1,
                        per_step=SimpleNamespace(op_step_sums=pd.DataFrame({
                            "step": [0, 1, -1], "program_id": np.array([7, 7, 7], np.uint64),
                            "name": pd.Categorical(["f.1"] * 3), "self_ps": [5, 7, 100]})))
    keys = pd.DataFrame({"program_id": np.array([7], np.uint64), "name": ["f.1"], "name_key": ["K1"]})
    t = _per_step_op_times(a, keys)
    assert list(t.columns) == [0, 1] and t.loc["K1"].tolist() == [5.0, 7.0]  # -1 (outside) left out


def test_an_op_that_never_ran_on_a_host_with_events_is_ordered_by_its_row():
    # the events' names are categorical: f.1 ran in program 7, g.2 only in program 8. Program 7's g.2
    # never ran, so its row position (1) orders it, not a start of its own
    events = pd.DataFrame({"program_id": np.array([7, 8], np.uint64), "name": pd.Categorical(["f.1", "g.2"]),
                           "start_ps": [50, 10]})
    ops = pd.DataFrame({"program_id": np.array([7, 7], np.uint64), "name": ["f.1", "g.2"], "name_key": ["K1", "K2"]})
    first = _first_runs(SimpleNamespace(profile=SimpleNamespace(hosts=[SimpleNamespace(events=events)])), ops)
    assert first == {"K1": 50.0, "K2": 1.0}


def test_collective_families_sorted_by_their_change_and_an_exposure_from_one_run():
    ops = [("fusion.1", "loop fusion"), ("all-gather.1", "all-gather"), ("all-reduce.2", "all-reduce")]
    # all-gather.1 grows by 1 us a step, all-reduce.2 by 3 us: all-reduce first, though it sorts after
    # by name. all-reduce.2 has windows in the new run only: its exposure is still shown.
    base = _run(STEPS, ops, [(s, n, t) for s in (1, 2, 3) for n, t in
                             (("fusion.1", 4 * US), ("all-gather.1", 2 * US), ("all-reduce.2", 1 * US))],
                windows={"all-gather.1": 6 * US})
    new = _run(STEPS, ops, [(s, n, t) for s in (1, 2, 3) for n, t in
                            (("fusion.1", 4 * US), ("all-gather.1", 3 * US), ("all-reduce.2", 4 * US))],
               windows={"all-gather.1": 9 * US, "all-reduce.2": 12 * US})
    d = diff_analyses(base, new, options=OPTS)
    assert [(c.name, c.change.delta_ps) for c in d.collectives] == [("all-reduce", 3 * US), ("all-gather", 1 * US)]
    exposure = {o.name: o.exposure for o in d.ops}
    assert exposure["fusion.1"] is None  # no windows in either run
    assert (exposure["all-reduce.2"].base.span_ps, exposure["all-reduce.2"].new.span_ps) == (0, 12 * US)
    assert (exposure["all-gather.1"].base.span_ps, exposure["all-gather.1"].new.span_ps) == (6 * US, 9 * US)


def test_with_two_resamples_the_interval_is_the_middle_share_of_their_gap_at_each_confidence():
    """Two resampled differences d0 <= d1: the percentile interval at confidence c runs from the
    (1 - c) / 2 to the (1 + c) / 2 point of the gap between them (numpy's linear percentiles), so its
    width is c x (d1 - d0) whatever the two are. The same seed draws the same two resamples."""
    from tpudiag.analysis.diff import bootstrap_ci

    base, new = np.zeros(1), np.arange(10, dtype=np.float64) * 1000  # base's mean is 0 in every resample

    def ends(confidence):
        return bootstrap_ci(base, new, "mean", NoiseOptions(resamples=2, confidence=confidence, seed=3))

    lo50, hi50 = ends(0.5)
    gap = 2 * (hi50 - lo50)  # d1 - d0
    d0 = lo50 - gap / 4
    assert gap > 0
    for c in (0.6, 0.9, 0.95):
        lo, hi = ends(c)
        assert lo == pytest.approx(d0 + (1 - c) / 2 * gap, rel=1e-12)
        assert hi == pytest.approx(d0 + (1 + c) / 2 * gap, rel=1e-12)
