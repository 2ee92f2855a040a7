"""Metamorphic tests: rewrites of a capture that a valid producer could make leave the ops, the
step times and the findings equal, on every capture the project has (issue 19).

The rewrites are in `tests/variants.py`: lines on an epoch clock (with the capture's anchor),
planes, lines and events reordered, metadata ids renumbered, unknown planes, lines and stats
added. Each capture is diagnosed once as it is; every capture then meets all the rewrites at
once, and Hypothesis draws other combinations on the small captures.
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples
from tests.variants import TRANSFORMS, Capture, captures, write_variant
from tpudiag.pipeline import diagnose

CAPTURES = {c.name: c for c in captures()}
SMALL = [n for n in CAPTURES if n.startswith("scenario:") or n in ("example:train_v6e_4chip", "real:cpu_jax_profiler")]
_BASELINES: dict[str, tuple] = {}


def outcome(run) -> tuple[pd.DataFrame, pd.DataFrame, tuple]:
    """(ops, step times, findings) of a run, in an order that does not depend on the file's."""
    d = diagnose(run, jobs=1)
    a = d.analysis
    ops = a.ops.copy()
    for col in ops.columns:
        if isinstance(ops[col].dtype, pd.CategoricalDtype):
            ops[col] = ops[col].astype(str)
    ops = ops.sort_values(list(ops.columns)).reset_index(drop=True)
    steps = a.steps[["host", "core", "step", "dur_ps"]].astype({"host": str})
    steps = steps.sort_values(["host", "core", "step"]).reset_index(drop=True)
    return ops, steps, tuple(d.findings)


def run_dir(capture: Capture, tmp_path_factory):
    run = capture.write(tmp_path_factory.mktemp(capture.name.replace(":", "-")))
    if not run.is_dir():
        pytest.skip(f"{capture.name}: the real capture is in ../shared, absent here ({run})")
    return run


def baseline(name: str, tmp_path_factory):
    if name not in _BASELINES:
        run = run_dir(CAPTURES[name], tmp_path_factory)
        _BASELINES[name] = (run, outcome(run))
    return _BASELINES[name]


def assert_same(got, want, what: str) -> None:
    ops, steps, findings = got
    pd.testing.assert_frame_equal(ops, want[0], obj=f"ops ({what})")
    pd.testing.assert_frame_equal(steps, want[1], obj=f"steps ({what})")
    assert findings == want[2], what


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_all_rewrites_at_once_leave_the_report_equal(name, tmp_path_factory):
    run, want = baseline(name, tmp_path_factory)
    variant = write_variant(run, tmp_path_factory.mktemp("variant"), TRANSFORMS, seed=19)
    assert_same(outcome(variant), want, f"{name} with {', '.join(TRANSFORMS)}")


@settings(max_examples=bounded_examples(12, 5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(SMALL), transforms=st.lists(st.sampled_from(sorted(TRANSFORMS)), min_size=1, max_size=5),
       seed=st.integers(0, 2**32 - 1))
def test_any_rewrites_in_any_order_leave_the_report_equal(name, transforms, seed, tmp_path_factory):
    run, want = baseline(name, tmp_path_factory)
    variant = write_variant(run, tmp_path_factory.mktemp("variant"), transforms, seed)
    assert_same(outcome(variant), want, f"{name} with {transforms}, seed {seed}")


@pytest.mark.parametrize("name", ["example:train_v6e_4chip", "scenario:decode_v6e"])
def test_rewritten_captures_read_the_same_through_protobuf(name, tmp_path_factory, monkeypatch):
    """The compiled event reader and the protobuf one agree on rewritten files too (epoch lines,
    stats out of their usual order, unknown lines)."""
    run, want = baseline(name, tmp_path_factory)
    variant = write_variant(run, tmp_path_factory.mktemp("variant"), TRANSFORMS, seed=7)
    monkeypatch.setenv("TPUDIAG_NO_WIRE", "1")
    assert_same(outcome(variant), want, f"{name} rewritten, read through protobuf")


@pytest.mark.parametrize("name", ["scenario:idle_training", "scenario:decode_v6e", "example:train_v6e_4chip"])
def test_a_capture_written_on_one_epoch_clock_without_anchor_reads_the_same(name, tmp_path_factory):
    """Host and device on one clock need no anchor: host spans still explain idle time (the idle
    scenarios' findings name their cause from the host plane)."""
    run, want = baseline(name, tmp_path_factory)
    variant = write_variant(run, tmp_path_factory.mktemp("variant"), ["one-clock"], seed=3)
    assert_same(outcome(variant), want, f"{name} on one epoch clock")
