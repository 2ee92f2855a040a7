"""`per_step_worst_core_by` (one numpy pass for every group) equals a pandas groupby per group."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples
from tpudiag.rules.base import StepBasis, per_step_worst_core, per_step_worst_core_by


def _reference(frame: pd.DataFrame, value: str, basis: StepBasis) -> float:
    """The per-group pandas computation the rules used before."""
    if frame.empty:
        return 0.0
    if basis.whole_capture:
        return float(frame.groupby(["host", "core"], observed=True)[value].sum().max())
    inside = frame[frame["step"] >= 0]
    if inside.empty:
        return 0.0
    per = inside.groupby(["step", "host", "core"], observed=True)[value].sum()
    return float(per.groupby(level="step").max().sum()) / basis.n_steps


rows = st.lists(st.tuples(st.sampled_from(["all-gather-start.1", "all-reduce.2", "fusion.3"]),
                          st.sampled_from(["host0", "host1", "host2"]), st.integers(0, 3), st.integers(-1, 5),
                          st.integers(0, 10**12)), min_size=0, max_size=120)


@settings(max_examples=bounded_examples(200, 60), deadline=None)
@given(rows, st.booleans())
def test_grouped_pass_equals_a_groupby_per_group(data, whole_capture):
    # Windows of three ops on three hosts x four cores; step -1 is outside every step.
    frame = pd.DataFrame(data, columns=["name", "host", "core", "step", "exposed_ps"]).astype(
        {"core": np.int32, "step": np.int64, "exposed_ps": np.int64})
    basis = StepBasis(n_steps=6, step_ps=1e9, whole_capture=whole_capture)
    labels, values = per_step_worst_core_by(frame, "exposed_ps", basis, "name")
    got = dict(zip(labels.tolist(), values.tolist()))
    want = {name: _reference(g, "exposed_ps", basis) for name, g in frame.groupby("name")}
    assert got == want
    assert per_step_worst_core(frame, "exposed_ps", basis) == _reference(frame, "exposed_ps", basis)
