"""Collective windows on hand-built events: every row's coverage worked out by hand from the timeline
drawn in each test, and the digest's folds summed by hand from the rows.

The module's docstring is the definition: compute is a leaf op that is neither a collective nor an
async op nor nested in a collective; a window's covered time is its overlap with the union of compute
on its core; `compute_inside` says a compute op starts strictly inside it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import tpudiag.analysis.collective_windows as windows_module
from tpudiag.analysis.collective_windows import (_assign_steps, _coded, class_counts, classify, collective_windows,
                                                 host_windows, nesting_facts, summarize_windows)
from tpudiag.model import schemas
from tpudiag.model.profile import Platform, WindowThresholds

TPU0, TPU1 = "/device:TPU:0", "/device:TPU:1"


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENTS from (device, core, name, category, start_ps, dur_ps, depth) rows."""
    dev, core, name, cat, start, dur, depth = zip(*rows)
    n = len(rows)
    return schemas.EVENTS.frame({
        "host": ["h"] * n, "device": list(dev), "core": list(core), "chip": list(core), "program_id": [1] * n,
        "module": ["m"] * n, "name": list(name), "category": list(cat), "start_ps": list(start),
        "dur_ps": list(dur), "self_ps": list(dur), "depth": list(depth), "step": [0] * n})


def _windows(rows: list[tuple]) -> pd.DataFrame:
    """ASYNC_WINDOWS from (device, core, name, family, start_ps, end_ps, source) rows."""
    if not rows:
        return schemas.ASYNC_WINDOWS.empty()
    dev, core, name, fam, start, end, src = zip(*rows)
    return schemas.ASYNC_WINDOWS.frame({
        "host": ["h"] * len(rows), "device": list(dev), "core": list(core), "name": list(name),
        "family": list(fam), "start_ps": list(start), "end_ps": list(end), "source": list(src)})


def _steps(rows: list[tuple]) -> pd.DataFrame:
    """Steps from (core, step, start_ps, dur_ps) rows on host `h`."""
    core, step, start, dur = zip(*rows)
    return pd.DataFrame({"host": "h", "core": list(core), "step": list(step), "start_ps": list(start),
                         "dur_ps": list(dur)})


def _host(events: pd.DataFrame, windows: pd.DataFrame, platform: Platform = Platform.TPU):
    return SimpleNamespace(host="h", events=events, async_windows=windows,
                           device=SimpleNamespace(platform=platform))


# TPU:0 (times in ps), one layer loop holding everything up to 1000:
#   while.1        [0, 1000)    a container: not compute, its body is
#   fusion.1       [0, 300)     compute
#   all-reduce.1   [300, 500)   sync window; fusion.9 [300, 400) is nested in it, so not compute
#   all-gather-start.1 / -done.1 at 500 and 800: async ops, the window [500, 810) is on the Async line
#   fusion.2       [510, 700)   compute, inside the all-gather window: 190 covered
#   send.1 [820, 830), recv.1 [835, 840): point to point: no window
#   fusion.12      [850, 950)   an `all-reduce-scatter fusion`: a reduce-scatter window by its category
#   fusion.20      [900, 950)   an `async-collective fusion` continuation: compute, covers half of it
# then at depth 0: all-to-all.3 [1000, 1100), and fusion.30 [1100, 1200) starting exactly at its end.
# TPU:1: fusion.1 [0, 100) covers the pair window [0, 100) of all-gather-start.1.0; all-reduce.2
# [100, 150) is uncovered.
TPU_EVENTS = [
    (TPU0, 0, "while.1", "while", 0, 1000, 0),
    (TPU0, 0, "fusion.1", "convolution fusion", 0, 300, 1),
    (TPU0, 0, "all-reduce.1", "all-reduce", 300, 200, 1),
    (TPU0, 0, "fusion.9", "loop fusion", 300, 100, 2),
    (TPU0, 0, "all-gather-start.1", "all-gather", 500, 10, 1),
    (TPU0, 0, "fusion.2", "loop fusion", 510, 190, 1),
    (TPU0, 0, "all-gather-done.1", "all-gather", 800, 10, 1),
    (TPU0, 0, "send.1", "send", 820, 10, 1),
    (TPU0, 0, "recv.1", "recv", 835, 5, 1),
    (TPU0, 0, "fusion.12", "all-reduce-scatter fusion", 850, 100, 1),
    (TPU0, 0, "fusion.20", "async-collective fusion", 900, 50, 1),
    (TPU0, 0, "all-to-all.3", "all-to-all", 1000, 100, 0),
    (TPU0, 0, "fusion.30", "loop fusion", 1100, 100, 0),
    (TPU1, 1, "fusion.1", "convolution fusion", 0, 100, 0),
    (TPU1, 1, "all-reduce.2", "all-reduce", 100, 50, 0),
]
TPU_WINDOWS = [
    (TPU0, 0, "all-gather-start.1", "all-gather", 500, 810, "Async XLA Ops"),
    (TPU0, 0, "copy-start.1", "copy", 100, 200, "Async XLA Ops"),  # a copy: not a collective window
    (TPU0, 0, "foo-start.1", "other", 150, 250, "Async XLA Ops"),  # nor another async op
    (TPU0, 0, "collective-permute-start.1", "collective-permute", 700, 700, "Async XLA Ops"),  # empty: dropped
    (TPU1, 1, "all-gather-start.1.0", "all-gather", 0, 100, "start/done pair"),
]
# Core 0: steps 0 [0, 600) and 1 [600, 1200); core 1: step 5 [0, 100) only.
TPU_STEPS = [(0, 0, 0, 600), (0, 1, 600, 600), (1, 5, 0, 100)]

# (device, core, step, name, family, kind, start, span, covered, compute_inside, source, double suffix)
TPU_EXPECTED = [
    (TPU0, 0, 0, "all-reduce.1", "all-reduce", "sync", 300, 200, 0, False, "XLA Ops", False),
    (TPU0, 0, 0, "all-gather-start.1", "all-gather", "async", 500, 310, 190, True, "Async XLA Ops", False),
    (TPU0, 0, 1, "fusion.12", "reduce-scatter", "sync", 850, 100, 50, True, "XLA Ops", False),
    (TPU0, 0, 1, "all-to-all.3", "all-to-all", "sync", 1000, 100, 0, False, "XLA Ops", False),
    (TPU1, 1, 5, "all-gather-start.1.0", "all-gather", "async", 0, 100, 100, False, "start/done pair", True),
    (TPU1, 1, -1, "all-reduce.2", "all-reduce", "sync", 100, 50, 0, False, "XLA Ops", False),
]


def _rows(frame: pd.DataFrame) -> list[tuple]:
    frame = frame.sort_values(["device", "start_ps"], kind="stable")
    return [(str(r.device), int(r.core), int(r.step), str(r.name), str(r.family), str(r.kind), int(r.start_ps),
             int(r.span_ps), int(r.covered_ps), bool(r.compute_inside), str(r.source), bool(r.double_suffix))
            for r in frame.itertuples()]


def test_each_window_is_covered_by_leaf_compute_on_its_own_core():
    out = host_windows(_host(_events(TPU_EVENTS), _windows(TPU_WINDOWS)), _steps(TPU_STEPS))
    assert _rows(out) == TPU_EXPECTED
    assert (out["exposed_ps"] == out["span_ps"] - out["covered_ps"]).all()
    by_name = dict(zip(out["name"], out["overlap_ratio"]))
    assert by_name == {"all-reduce.1": 0.0, "all-gather-start.1": 190 / 310, "fusion.12": 0.5, "all-to-all.3": 0.0,
                       "all-gather-start.1.0": 1.0, "all-reduce.2": 0.0}
    assert (out["end_ps"] == out["start_ps"] + out["span_ps"]).all()
    assert set(out["host"]) == {"h"}


def test_without_async_windows_only_synchronous_collectives_are_windows():
    out = host_windows(_host(_events(TPU_EVENTS), _windows([])), _steps(TPU_STEPS))
    assert [r for r in TPU_EXPECTED if r[5] == "sync"] == _rows(out)


def test_a_host_with_no_collective_has_no_windows():
    events = _events([(TPU0, 0, "fusion.1", "loop fusion", 0, 10, 0)])
    assert host_windows(_host(events, _windows([])), _steps([(0, 0, 0, 10)])) is None
    assert host_windows(_host(events.iloc[:0], _windows([])), _steps([(0, 0, 0, 10)])) is None


def test_windows_on_a_device_without_events_are_not_rows():
    events = _events([(TPU0, 0, "all-reduce.1", "all-reduce", 0, 10, 0)])
    windows = _windows([(d, c, "all-gather-start.1", "all-gather", 0, 100, "Async XLA Ops")
                        for d, c in ((TPU1, 1), ("/device:TPU:2", 2), ("/device:TPU:3", 3))])
    out = host_windows(_host(events, windows), _steps([(0, 0, 0, 10)]))
    assert out["name"].tolist() == ["all-reduce.1"]


def test_a_window_whose_name_family_or_source_is_missing_reads_nan():
    events = _events([(TPU0, 0, "fusion.1", "loop fusion", 0, 10, 0)])
    windows = _windows([(TPU0, 0, "all-gather-start.1", "all-gather", 0, 20, "Async XLA Ops")])
    windows["family"] = pd.Categorical([None], categories=["all-gather"])
    windows["source"] = pd.Categorical([None], categories=["Async XLA Ops"])
    windows["name"] = pd.Categorical([None], categories=["all-gather-start.1"])
    out = host_windows(_host(events, windows), _steps([(0, 0, 0, 20)]))
    assert out["family"].astype(str).tolist() == ["nan"] and out["source"].astype(str).tolist() == ["nan"]
    assert out["name"].astype(str).tolist() == ["nan"]
    assert out["covered_ps"].tolist() == [10]


# GPU:0, one GPU, all its streams as one core:
#   fusion.1            [0, 100)   compute
#   all-reduce-start.1  [50, 150)  NCCL's kernel of an async all-reduce: its own span is the window, 50 covered
#   ncclDevKernel_AllGather_RING_LL [200, 300): a library kernel no HLO op names: async, all-gather
#   fusion.2            [250, 300) compute, starts inside the kernel: 50 covered
#   all-reduce.3        [400, 500) a synchronous collective, its kernel's span: uncovered
GPU0 = "/device:GPU:0"
GPU_EVENTS = [
    (GPU0, 0, "fusion.1", "loop fusion", 0, 100, 0),
    (GPU0, 0, "all-reduce-start.1", "all-reduce", 50, 100, 0),
    (GPU0, 0, "ncclDevKernel_AllGather_RING_LL", "", 200, 100, 0),
    (GPU0, 0, "fusion.2", "loop fusion", 250, 50, 0),
    (GPU0, 0, "all-reduce.3", "all-reduce", 400, 100, 0),
]


def test_a_gpu_collective_is_its_kernel_and_its_window():
    out = host_windows(_host(_events(GPU_EVENTS), _windows([]), Platform.GPU), _steps([(0, 0, 0, 1000)]))
    assert _rows(out) == [
        (GPU0, 0, 0, "all-reduce-start.1", "all-reduce", "async", 50, 100, 50, False, "kernel", False),
        (GPU0, 0, 0, "ncclDevKernel_AllGather_RING_LL", "all-gather", "async", 200, 100, 50, True, "kernel", False),
        (GPU0, 0, 0, "all-reduce.3", "all-reduce", "sync", 400, 100, 0, False, "kernel", False),
    ]


def test_on_a_tpu_a_library_named_kernel_is_a_synchronous_window():
    out = host_windows(_host(_events(GPU_EVENTS), _windows([]), Platform.TPU), _steps([(0, 0, 0, 1000)]))
    assert [(str(n), str(k), str(s)) for n, k, s in zip(out["name"], out["kind"], out["source"])] == [
        ("ncclDevKernel_AllGather_RING_LL", "sync", "XLA Ops"), ("all-reduce.3", "sync", "XLA Ops")]


def test_collective_windows_classes_every_hosts_rows():
    analysis = SimpleNamespace(profile=SimpleNamespace(hosts=[_host(_events(TPU_EVENTS), _windows(TPU_WINDOWS))]),
                               steps=_steps(TPU_STEPS))
    out = collective_windows(analysis)
    assert list(out.columns) == ["host", "device", "core", "step", "name", "family", "kind", "start_ps", "span_ps",
                                 "covered_ps", "exposed_ps", "overlap_ratio", "klass", "double_suffix",
                                 "compute_inside", "source"]
    assert _rows(out) == TPU_EXPECTED
    assert out["klass"].tolist() == ["exposed", "partial", "partial", "exposed", "hidden", "exposed"]
    assert out["name"].dtype == object and out["device"].dtype == object
    strict = collective_windows(analysis, WindowThresholds(hidden=0.5, exposed=0.0))
    assert strict["klass"].tolist() == ["exposed", "hidden", "hidden", "exposed", "hidden", "exposed"]


def test_collective_windows_of_hosts_without_windows_is_an_empty_table():
    analysis = SimpleNamespace(profile=SimpleNamespace(hosts=[_host(_events(TPU_EVENTS).iloc[:0], _windows([]))]),
                               steps=_steps(TPU_STEPS))
    out = collective_windows(analysis)
    assert out.empty and "klass" in out.columns and "overlap_ratio" in out.columns


def test_collective_windows_needs_the_events():
    host = _host(None, _windows([]))
    with pytest.raises(ValueError, match=r"^host h: its events were digested away; read the folded windows \(`Analysis.collectives`\) instead$"):
        collective_windows(SimpleNamespace(profile=SimpleNamespace(hosts=[host]), steps=_steps(TPU_STEPS)))


@pytest.mark.parametrize(("ratio", "klass"), [(0.9, "hidden"), (0.8999, "partial"), (1.0, "hidden"),
                                              (0.1, "exposed"), (0.1001, "partial"), (0.0, "exposed")])
def test_classify_at_the_default_thresholds(ratio, klass):
    assert classify(ratio, WindowThresholds()).tolist() == klass
    assert classify([ratio], WindowThresholds()).tolist() == [klass]


# Nesting, by (device, start, depth) order:
#   dev 0: a [0] depth 0 > b [10] depth 1 > c [20] depth 2
#   dev 1: C [0] depth 0, a collective > d [5] depth 1 > e [6] depth 2 (both inside the collective)
#   dev 2: f [0] depth 1 with no parent on its device (the last depth-0 event before it is C, on dev 1)
NEST = {  # row: (device, start, depth, collective, has a child, inside a collective)
    "a": (0, 0, 0, False, True, False), "b": (0, 10, 1, False, True, False), "c": (0, 20, 2, False, False, False),
    "C": (1, 0, 0, True, True, False), "d": (1, 5, 1, False, True, True), "e": (1, 6, 2, False, False, True),
    "f": (2, 0, 1, False, False, False),
}


@pytest.mark.parametrize("reader", ["compiled", "numpy"])
@pytest.mark.parametrize("order", ["abcCdef", "fedCcba", "bCfaedc"])
def test_nesting_facts_in_any_row_order(order, reader, monkeypatch):
    # The compiled walk (`event_wire.nesting`) where the module is built, the level passes without it.
    monkeypatch.setenv("TPUDIAG_NO_WIRE", "1" if reader == "numpy" else "0")
    rows = [NEST[k] for k in order]
    dev, start, depth, coll, child, inside = (np.array(c) for c in zip(*rows))
    has_child, in_coll = nesting_facts(dev.astype(np.int16), start.astype(np.int64), depth.astype(np.int16),
                                       coll.astype(bool))
    assert has_child.tolist() == child.tolist()
    assert in_coll.tolist() == inside.tolist()


def test_nesting_facts_of_flat_or_no_events():
    flat = nesting_facts(np.zeros(2, np.int16), np.array([0, 5]), np.zeros(2, np.int16), np.array([True, False]))
    assert [x.tolist() for x in flat] == [[False, False], [False, False]]
    empty = nesting_facts(np.zeros(0, np.int16), np.zeros(0, np.int64), np.zeros(0, np.int16), np.zeros(0, bool))
    assert [x.tolist() for x in empty] == [[], []]


def test_a_level_with_no_event_skips_to_the_next():
    # depth 0 then depth 2 directly (a gap in depth): the depth-2 event has no depth-1 parent
    has_child, in_coll = nesting_facts(np.zeros(2, np.int16), np.array([0, 1]), np.array([0, 2], np.int16),
                                       np.array([True, False]))
    assert has_child.tolist() == [True, False] and in_coll.tolist() == [False, False]


def test_assign_steps_at_the_edges():
    steps = pd.concat([_steps([(0, 3, 100, 100), (0, 4, 200, 50), (1, 9, 0, 10)]),
                       _steps([(0, 7, 0, 1000)]).assign(host="other")])
    core = np.array([0, 0, 0, 0, 0, 0, 1, 2])
    start = np.array([99, 100, 199, 200, 249, 250, 5, 5])
    assert _assign_steps(steps, "h", core, start).tolist() == [-1, 3, 3, 4, 4, -1, 9, -1]


def test_assign_steps_past_a_core_without_windows():
    steps = _steps([(0, 1, 0, 100), (1, 2, 0, 100)])  # core 0 has steps but no window
    assert _assign_steps(steps, "h", np.array([1]), np.array([50])).tolist() == [2]


def test_coded_keeps_one_category_per_distinct_string():
    vocab = np.array(["b", "nan", "a", "b", "c"], dtype=object)
    cat = _coded(np.array([3, 2, 0, 2]), vocab)
    assert list(cat.categories) == ["a", "b"] and cat.tolist() == ["b", "a", "b", "a"]


def _window_rows() -> pd.DataFrame:
    """Rows as `host_windows` gives them: two cores, one all-reduce op in steps 0 and 1, one async op.
    Step 0: core 0 exposes 30 + 10 = 40 of all-reduce.1, core 1 exposes 25: the worst core's is 40."""
    rows = [  # device, core, step, kind, family, name, source, span, covered, compute inside, double suffix
        (TPU0, 0, 0, "sync", "all-reduce", "all-reduce.1", "XLA Ops", 30, 0, False, False),
        (TPU0, 0, 0, "sync", "all-reduce", "all-reduce.1", "XLA Ops", 20, 10, True, False),
        (TPU1, 1, 0, "sync", "all-reduce", "all-reduce.1", "XLA Ops", 25, 0, False, False),
        (TPU1, 1, 1, "sync", "all-reduce", "all-reduce.1", "XLA Ops", 30, 0, False, False),
        (TPU0, 0, 1, "async", "all-gather", "all-gather-start.1", "Async XLA Ops", 100, 95, True, False),
        (TPU0, 0, 1, "async", "all-gather", "all-gather-start.1", "Async XLA Ops", 100, 50, False, False),
    ]
    dev, core, step, kind, fam, name, src, span, cov, inside, dbl = (list(c) for c in zip(*rows))
    span, cov = np.array(span, dtype=np.int64), np.array(cov, dtype=np.int64)
    return pd.DataFrame({"name": name, "family": fam, "kind": kind, "start_ps": np.arange(len(rows)) * 100,
                         "source": src, "span_ps": span, "covered_ps": cov, "exposed_ps": span - cov,
                         "overlap_ratio": cov / span, "double_suffix": dbl, "compute_inside": inside, "host": "h",
                         "device": dev, "core": core, "step": step})


def test_summarize_windows_folds_by_family_op_and_worst_core():
    digest, op_steps = summarize_windows(_window_rows(), "h")
    steps = digest.steps
    assert [(str(d), int(c), int(s), str(k), str(f), int(e)) for d, c, s, k, f, e in
            zip(steps["device"], steps["core"], steps["step"], steps["kind"], steps["family"], steps["exposed_ps"])] \
        == [(TPU0, 0, 0, "sync", "all-reduce", 40), (TPU0, 0, 1, "async", "all-gather", 55),
            (TPU1, 1, 0, "sync", "all-reduce", 25), (TPU1, 1, 1, "sync", "all-reduce", 30)]
    assert set(steps["host"]) == {"h"}
    ops = digest.ops
    assert [(str(k), str(n), str(s), int(c), int(sp), int(cv), int(e)) for k, n, s, c, sp, cv, e in
            zip(ops["kind"], ops["name"], ops["source"], ops["n"], ops["span_ps"], ops["covered_ps"],
                ops["exposed_ps"])] \
        == [("async", "all-gather-start.1", "Async XLA Ops", 2, 200, 145, 55),
            ("sync", "all-reduce.1", "XLA Ops", 4, 105, 10, 95)]
    cov = digest.coverage
    assert [(int(o), float(f), bool(i), int(n)) for o, f, i, n in
            zip(cov["op"], cov["covered_fraction"], cov["compute_inside"], cov["n"])] \
        == [(0, 0.5, False, 1), (0, 0.95, True, 1), (1, 0.0, False, 3), (1, 0.5, True, 1)]
    assert [(int(s), str(k), str(n), int(e)) for s, k, n, e in
            zip(op_steps["step"], op_steps["kind"], op_steps["name"], op_steps["exposed_ps"])] \
        == [(1, "async", "all-gather-start.1", 55), (0, "sync", "all-reduce.1", 40), (1, "sync", "all-reduce.1", 30)]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the op index of a missing name
def test_the_worst_core_fold_with_a_missing_name_takes_pandas_path():
    rows = _window_rows()
    rows["name"] = pd.Categorical(rows["name"].where(rows["kind"] == "sync", None))
    _, op_steps = summarize_windows(rows, "h")
    assert [(int(s), str(k), str(n), int(e)) for s, k, n, e in
            zip(op_steps["step"], op_steps["kind"], op_steps["name"], op_steps["exposed_ps"])] \
        == [(0, "sync", "all-reduce.1", 40), (1, "sync", "all-reduce.1", 30)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_summarize_windows_from_codes_equals_the_groupbys(seed, monkeypatch):
    # Many random windows (devices, cores, steps from -1, kinds, families, ops, sources, double
    # suffixes, repeated fractions): the tables from integer codes are pandas' groupbys' exactly.
    rng = np.random.default_rng(seed)
    n = 3_000
    name = rng.choice(["all-gather-start.1", "all-gather-start.2", "all-reduce.1", "all-to-all.3"], n)
    span = rng.integers(1, 50, n)
    cov = np.minimum(span, rng.integers(0, 60, n))
    windows = pd.DataFrame({
        "name": pd.Categorical(name), "family": pd.Categorical(np.where(name == "all-reduce.1", "all-reduce", "all-gather")),
        "kind": pd.Categorical(rng.choice(["async", "sync"], n)), "start_ps": np.arange(n) * 100,
        "source": pd.Categorical(rng.choice(["Async XLA Ops", "XLA Ops"], n)), "span_ps": span, "covered_ps": cov,
        "exposed_ps": span - cov, "overlap_ratio": cov / span, "double_suffix": rng.random(n) < 0.2,
        "compute_inside": rng.random(n) < 0.5, "host": "h", "device": pd.Categorical(rng.choice([TPU0, TPU1], n)),
        "core": rng.integers(0, 3, n), "step": rng.integers(-1, 12, n)})
    digest, op_steps = summarize_windows(windows, "h")
    monkeypatch.setattr(windows_module, "_summary_by_codes", lambda w: None)
    want, want_op_steps = summarize_windows(windows, "h")
    for got, expected in ((digest.steps, want.steps), (digest.ops, want.ops), (digest.coverage, want.coverage),
                          (op_steps, want_op_steps)):
        pd.testing.assert_frame_equal(got, expected, check_exact=True)


def test_summarize_no_windows_is_empty_tables():
    for windows in (None, _window_rows().iloc[:0]):
        digest, op_steps = summarize_windows(windows, "h")
        assert digest.steps.empty and digest.ops.empty and digest.coverage.empty and op_steps.empty
        assert list(digest.ops.columns) == schemas.COLLECTIVE_OPS.names


def test_class_counts_class_each_window_once():
    digest, _ = summarize_windows(_window_rows(), "h")
    # all-gather-start.1: fractions 0.95 (hidden), 0.5 (partial, no compute inside: adjacent);
    # all-reduce.1: 0.0 x3 (exposed, adjacent), 0.5 with compute inside (partial).
    counts = class_counts(digest, WindowThresholds())
    assert counts[["n_hidden", "n_partial", "n_exposed", "n_adjacent"]].to_numpy().tolist() == [[1, 1, 0, 1],
                                                                                                   [0, 1, 3, 3]]
    assert counts["name"].astype(str).tolist() == ["all-gather-start.1", "all-reduce.1"]
    assert counts["n"].tolist() == [2, 4]
    loose = class_counts(digest, WindowThresholds(hidden=0.5, exposed=0.0))
    assert loose[["n_hidden", "n_partial", "n_exposed", "n_adjacent"]].to_numpy().tolist() == [[2, 0, 0, 0],
                                                                                                 [1, 0, 3, 3]]


def test_the_worst_core_fold_keeps_step_numbers_that_do_not_start_at_zero():
    # the same windows in steps 7 and 8, and one more outside every step (-1) on core 1: 5 exposed
    rows = _window_rows()
    rows["step"] = rows["step"] + 7
    extra = rows.iloc[[2]].assign(step=-1, span_ps=5, covered_ps=0, exposed_ps=5, overlap_ratio=0.0)
    _, op_steps = summarize_windows(pd.concat([rows, extra], ignore_index=True), "h")
    assert [(int(s), str(k), str(n), int(e)) for s, k, n, e in
            zip(op_steps["step"], op_steps["kind"], op_steps["name"], op_steps["exposed_ps"])] \
        == [(8, "async", "all-gather-start.1", 55), (-1, "sync", "all-reduce.1", 5), (7, "sync", "all-reduce.1", 40),
            (8, "sync", "all-reduce.1", 30)]


def _nest(rows: list[tuple]) -> tuple[list, list]:
    """nesting_facts of (device, start, depth, collective) rows."""
    dev, start, depth, coll = (np.array(c) for c in zip(*rows))
    has_child, in_coll = nesting_facts(dev.astype(np.int16), start.astype(np.int64), depth.astype(np.int16),
                                       coll.astype(bool))
    return has_child.tolist(), in_coll.tolist()


def test_one_level_of_nesting_under_a_collective_at_the_first_position():
    # a collective first of all, one op nested in it (the deepest level is 1), then a plain op
    assert _nest([(0, 0, 0, True), (0, 1, 1, False), (0, 5, 0, False)]) == ([True, False, False],
                                                                          [False, True, False])


def test_an_event_before_any_parent_level_event_has_no_parent():
    # a depth-1 event first, the collective at depth 0 after it: the collective is not its parent
    assert _nest([(0, 0, 1, False), (0, 5, 0, True)]) == ([False, False], [False, False])


def test_a_collective_after_a_missing_level_still_holds_its_children():
    # depths 0, then 2 (a collective with no depth-1 parent), then 3 inside it: the parent of a depth-3
    # event is the last depth-2 event, so it is inside a collective
    assert _nest([(0, 0, 0, False), (0, 1, 2, True), (0, 2, 3, False)]) == ([True, True, False],
                                                                          [False, False, True])


def test_an_op_without_a_category_is_compute_by_its_name():
    # fusion.1 [0, 50) has no category recorded: by its name it is no collective, so it covers half of
    # all-reduce.1 [0, 100)
    events = _events([(TPU0, 0, "all-reduce.1", "all-reduce", 0, 100, 0), (TPU0, 0, "fusion.1", None, 0, 50, 0)])
    out = host_windows(_host(events, _windows([])), _steps([(0, 0, 0, 100)]))
    assert _rows(out) == [(TPU0, 0, 0, "all-reduce.1", "all-reduce", "sync", 0, 100, 50, False, "XLA Ops", False)]


def test_a_device_without_collectives_does_not_end_the_walk():
    events = _events([(TPU0, 0, "fusion.1", "loop fusion", 0, 10, 0), (TPU1, 1, "all-reduce.1", "all-reduce", 0, 10, 0)])
    out = host_windows(_host(events, _windows([])), _steps([(1, 0, 0, 10)]))
    assert _rows(out) == [(TPU1, 1, 0, "all-reduce.1", "all-reduce", "sync", 0, 10, 0, False, "XLA Ops", False)]
