"""A host's digest tables on hand-built events (`tpudiag.analysis.host_digest`): per-op self time per
core and per step, each op's mean on its worst core, each core's span, and the per-step tables folded
over hosts (max or sum per key), each expected value worked by hand from the rows drawn below."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.host_digest import (StepFold, core_spans, drop_events, fold_step_tables, op_means, op_tables)
from tpudiag.model import schemas
from tpudiag.model.profile import StepTables

TPU0, TPU1 = "/device:TPU:0", "/device:TPU:1"


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENTS from (device, core, program_id, name, start_ps, dur_ps, self_ps, step) rows."""
    dev, core, pid, name, start, dur, self_ps, step = zip(*rows) if rows else ((),) * 8
    n = len(rows)
    return schemas.EVENTS.frame({
        "host": ["h"] * n, "device": list(dev), "core": list(core), "chip": list(core), "program_id": list(pid),
        "module": ["m"] * n, "name": list(name), "category": ["x"] * n, "start_ps": list(start),
        "dur_ps": list(dur), "self_ps": list(self_ps), "depth": [0] * n, "step": list(step)})


# Two cores, programs 7 and 9, steps 0 and 1 and events outside every step (-1):
EVENTS = [
    (TPU1, 1, 9, "fusion.1", 40, 10, 10, 0),
    (TPU0, 0, 7, "fusion.1", 0, 10, 10, 0),
    (TPU0, 0, 7, "fusion.1", 100, 30, 30, 1),
    (TPU0, 0, 7, "fusion.2", 10, 5, 5, 0),
    (TPU1, 1, 7, "fusion.1", 0, 20, 20, 0),
    (TPU1, 1, 7, "fusion.1", 100, 25, 25, 1),
    (TPU0, 0, 7, "fusion.2", 300, 5, 4, -1),
]


def _rows(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(x.item() if isinstance(x, np.generic) else x if isinstance(x, (int, float)) else str(x) for x in r)
            for r in frame.itertuples(index=False)]


def test_op_tables_per_core_and_per_step():
    cores, sums, worst = op_tables(SimpleNamespace(host="h", events=_events(EVENTS)))
    # per (device, program, op), in order of first appearance: count, self time, self time inside steps
    assert _rows(cores) == [
        ("h", TPU1, 1, 9, "fusion.1", 1, 10, 10),
        ("h", TPU0, 0, 7, "fusion.1", 2, 40, 40),
        ("h", TPU0, 0, 7, "fusion.2", 2, 9, 5),  # 4 ps of it outside every step
        ("h", TPU1, 1, 7, "fusion.1", 2, 45, 45)]
    # per (step, program, op), summed over the cores; in key order, step -1 first
    assert sorted(_rows(sums)) == [(-1, 7, "fusion.2", 4), (0, 7, "fusion.1", 30), (0, 7, "fusion.2", 5),
                                   (0, 9, "fusion.1", 10), (1, 7, "fusion.1", 55)]
    # per (step, op), every program together, on the core where it is longest: step 0 fusion.1 is
    # 10 on core 0, 20 + 10 (two programs) on core 1
    assert sorted(_rows(worst)) == [(-1, "fusion.2", 4), (0, "fusion.1", 30), (0, "fusion.2", 5), (1, "fusion.1", 30)]


def test_op_tables_of_a_host_without_events():
    cores, sums, worst = op_tables(SimpleNamespace(host="h", events=_events([])))
    assert cores.empty and sums.empty and worst.empty
    assert list(cores.columns) == schemas.OP_CORES.names and list(worst.columns) == schemas.OP_STEP_WORST.names


def test_an_event_without_a_name_is_left_out_of_the_op_tables():
    events = _events(EVENTS[:2])
    events["name"] = events["name"].cat.add_categories(["spare"])
    events.loc[0, "name"] = None  # a missing name, as a groupby would drop
    cores, _, _ = op_tables(SimpleNamespace(host="h", events=events))
    assert _rows(cores) == [("h", TPU0, 0, 7, "fusion.1", 1, 10, 10)]


def _worst(rows: list[tuple]) -> pd.DataFrame:
    step, name, self_ps = zip(*rows) if rows else ((),) * 3
    return schemas.OP_STEP_WORST.frame({"step": list(step), "name": list(name), "self_ps": list(self_ps)})


def test_op_means_are_over_the_hosts_steps():
    # two steps (0, 2) inside; fusion.1 runs in both, fusion.2 in one: its mean counts both steps
    means = op_means(_worst([(0, "fusion.1", 10), (2, "fusion.1", 30), (2, "fusion.2", 8), (-1, "fusion.2", 100)]), "h0")
    assert _rows(means) == [("h0", "fusion.1", 20.0), ("h0", "fusion.2", 4.0)]
    # only time outside every step: no mean
    assert op_means(_worst([(-1, "fusion.1", 10)]), "h0").empty
    assert list(op_means(_worst([]), "h0").columns) == schemas.OP_MEANS.names


def test_op_means_leave_out_a_missing_name():
    table = _worst([(0, "fusion.1", 10), (0, "fusion.2", 6)])
    table.loc[1, "name"] = None
    assert _rows(op_means(table, "h0")) == [("h0", "fusion.1", 10.0)]


def test_core_spans_run_from_the_first_start_to_the_last_end_of_events_and_steps():
    events = _events([(TPU0, 0, 7, "a", 10, 20, 20, 0), (TPU0, 0, 7, "b", 50, 10, 10, 0),
                      (TPU1, 1, 7, "a", 5, 10, 10, 0)])
    # without steps: core 0 [10, 60) = 50, core 1 [5, 15) = 10
    assert core_spans(events, schemas.STEPS.empty()) == 60
    steps = schemas.STEPS.frame({
        "host": ["h", "h"], "device": [TPU0, TPU1], "core": [0, 1], "step": [0, 0], "start_ps": [0, 0],
        "dur_ps": [100, 12], "busy_ps": [0, 0], "compute_ps": [0, 0], "collective_ps": [0, 0], "io_ps": [0, 0],
        "host_transfer_ps": [0, 0], "idle_ps": [0, 0]})
    # with the step markers: core 0 [0, 100) = 100, core 1 [0, 15) = 15
    assert core_spans(events, steps) == 115
    assert core_spans(_events([]), steps) == 0
    # cores numbered from 3: the span per core all the same
    assert core_spans(events.assign(core=events["core"] + 3), schemas.STEPS.empty()) == 60


def _tables(worst: list[tuple], sums: list[tuple], coll: list[tuple]) -> StepTables:
    s, p, n, v = zip(*sums) if sums else ((),) * 4
    cs, ck, cn, cv = zip(*coll) if coll else ((),) * 4
    return StepTables(_worst(worst),
                      schemas.OP_STEP_SUMS.frame({"step": list(s), "program_id": list(p), "name": list(n),
                                                  "self_ps": list(v)}),
                      schemas.COLLECTIVE_OP_STEPS.frame({"step": list(cs), "kind": list(ck), "name": list(cn),
                                                         "exposed_ps": list(cv)}))


HOST_A = _tables([(1, "fusion.2", 5), (0, "fusion.1", 10)], [(0, 7, "fusion.1", 10)], [(0, "sync", "all-reduce.1", 3)])
HOST_B = _tables([(0, "fusion.1", 30), (0, "copy.1", 2)], [(0, 7, "fusion.1", 30), (0, 8, "fusion.1", 1)],
                 [(0, "sync", "all-reduce.1", 1)])


def test_the_fold_takes_the_worst_and_sums_the_sums_in_key_order():
    fold = fold_step_tables([HOST_A, HOST_B])
    # worst per (step, op): fusion.1 max(10, 30); rows in key order, names in name order
    assert _rows(fold.op_step_worst) == [(0, "copy.1", 2), (0, "fusion.1", 30), (1, "fusion.2", 5)]
    assert list(fold.op_step_worst["name"].cat.categories) == ["copy.1", "fusion.1", "fusion.2"]
    assert _rows(fold.op_step_sums) == [(0, 7, "fusion.1", 40), (0, 8, "fusion.1", 1)]
    assert _rows(fold.collective_op_steps) == [(0, "sync", "all-reduce.1", 3)]
    # one host: its own tables, as they are
    assert fold_step_tables([HOST_B]) is HOST_B
    # hosts without collectives: the empty table stays empty
    bare = _tables([(0, "fusion.1", 1)], [(0, 7, "fusion.1", 1)], [])
    assert fold_step_tables([bare, bare]).collective_op_steps.empty


def _host(tables: StepTables | None):
    return SimpleNamespace(digest=SimpleNamespace(per_step=tables) if tables is not None else None)


def test_a_step_fold_of_hosts_with_the_same_keys_is_the_regrouped_fold():
    twin = _tables([(1, "fusion.2", 7), (0, "fusion.1", 4)], [(0, 7, "fusion.1", 4)], [(0, "sync", "all-reduce.1", 9)])
    fold = StepFold()
    hosts = [_host(HOST_A), _host(twin), _host(None), SimpleNamespace(digest=None)]
    for h in hosts:
        fold.add(h)
    assert hosts[0].digest.per_step is None  # each host's own tables are freed
    result = fold.result()
    # row by row: fusion.2 max(5, 7), fusion.1 max(10, 4); sums 10 + 4; exposure max(3, 9); in key order
    assert _rows(result.op_step_worst) == [(0, "fusion.1", 10), (1, "fusion.2", 7)]
    assert _rows(result.op_step_sums) == [(0, 7, "fusion.1", 14)]
    assert _rows(result.collective_op_steps) == [(0, "sync", "all-reduce.1", 9)]
    for field in ("op_step_worst", "op_step_sums", "collective_op_steps"):
        pd.testing.assert_frame_equal(getattr(result, field), getattr(fold_step_tables([HOST_A, twin]), field))


def test_a_step_fold_of_one_host_is_its_own_tables_and_of_none_is_empty():
    fold = StepFold()
    fold.add(_host(HOST_B))
    assert fold.result() is HOST_B
    empty = StepFold().result()
    assert empty.op_step_worst.empty and list(empty.op_step_sums.columns) == schemas.OP_STEP_SUMS.names
    assert list(empty.collective_op_steps.columns) == schemas.COLLECTIVE_OP_STEPS.names


def test_hosts_of_other_keys_fold_apart_and_regroup_past_the_batch():
    fold = StepFold()
    fold.BATCH = 1
    fold.add(_host(HOST_A))
    fold.add(_host(HOST_B))  # other keys, a second fold: past a batch of 1, regrouped now
    assert len(fold._folds) == 1
    fold.add(_host(HOST_A))
    result = fold.result()
    # HOST_A twice and HOST_B: fusion.1's sums 10 + 30 + 10
    assert _rows(result.op_step_sums) == [(0, 7, "fusion.1", 50), (0, 8, "fusion.1", 1)]
    assert _rows(result.op_step_worst) == [(0, "copy.1", 2), (0, "fusion.1", 30), (1, "fusion.2", 5)]


@pytest.mark.parametrize("change", ["length", "categories", "codes", "dtype", "values"])
def test_tables_with_other_keys_are_not_folded_row_by_row(change):
    from tpudiag.analysis.host_digest import _same_keys

    a = HOST_A.op_step_sums
    b = a.copy()
    keys = ["step", "program_id", "name"]
    assert _same_keys(a, b, keys)
    if change == "length":
        b = pd.concat([b, b], ignore_index=True)
    elif change == "categories":
        b["name"] = b["name"].cat.add_categories(["other"])
    elif change == "codes":
        b["name"] = pd.Categorical(["fusion.9"], categories=["fusion.1", "fusion.9"])
        a = a.assign(name=pd.Categorical(["fusion.1"], categories=["fusion.1", "fusion.9"]))
    elif change == "dtype":
        b["step"] = b["step"].astype(np.int32)
    else:
        b["program_id"] = np.array([8], dtype=np.uint64)
    assert not _same_keys(a, b, keys)
    # a categorical against a plain column of the same strings
    if change == "values":
        assert not _same_keys(a, a.assign(name=a["name"].astype(str)), keys)


def test_dropping_a_hosts_events_frees_events_windows_and_host_spans():
    host = SimpleNamespace(events=_events(EVENTS), async_windows="windows", host_events="spans")
    drop_events(host)
    assert host.events is None and host.host_events is None
    assert host.async_windows.empty and list(host.async_windows.columns) == schemas.ASYNC_WINDOWS.names


# ---- the small 2-chip design of tests/conftest.py: 5 steps of 10 ms from time 0, 8 ops a step --------

def _small_file(write_design):
    from tests.conftest import small_design

    return next(write_design(small_design()).rglob("*.xplane.pb"))


def test_a_digest_of_the_small_design(write_design):
    from tests.conftest import US
    from tpudiag.analysis.host_digest import digest_host
    from tpudiag.parsers.capture import parse_file_or_failure

    host = parse_file_or_failure(_small_file(write_design))
    d = digest_host(host)
    assert d.n_events == 2 * 5 * 8 and not d.executions  # steps from the Steps line
    assert d.core_span_ps == 2 * 5 * 10_000 * US  # each chip's five steps
    assert len(d.steps) == 2 * 5 and d.per_step is not None and d.host_transfers.empty
    # fusion.1 runs 3,000 us on both chips every step: its worst core's mean
    means = dict(zip(d.op_means["name"].astype(str), d.op_means["self_ps"]))
    assert means["fusion.1"] == 3000 * US
    assert set(host.events["step"]) == {1, 2, 3, 4, 5}  # each event labelled with its step
    assert int(d.op_cores.loc[d.op_cores["name"] == "fusion.1", "n"].sum()) == 2 * 5


def test_a_big_host_digests_its_collective_windows_in_a_second_thread(write_design, monkeypatch):
    import threading

    import tpudiag.analysis.host_digest as host_digest
    from tpudiag.parsers.capture import parse_file_or_failure

    path = _small_file(write_design)
    threads = []
    windows = host_digest.host_windows

    def recording(*args):
        threads.append(threading.get_ident())
        return windows(*args)

    monkeypatch.setattr(host_digest, "host_windows", recording)
    one = host_digest.digest_host(parse_file_or_failure(path), threads=2)  # 80 events: under the minimum
    monkeypatch.setattr(host_digest, "THREADED_DIGEST_MIN_EVENTS", 80)
    two = host_digest.digest_host(parse_file_or_failure(path), threads=2)  # at the minimum: threaded
    alone = host_digest.digest_host(parse_file_or_failure(path), threads=1)
    by_default = host_digest.digest_host(parse_file_or_failure(path))  # one thread unless asked for two
    # each digest makes its windows once: in the second thread only when threaded
    assert len(threads) == 4 and threads[0] == threads[2] == threads[3] == threading.get_ident() != threads[1]
    pd.testing.assert_frame_equal(by_default.collectives.ops, alone.collectives.ops)
    for field in ("steps", "op_cores", "op_means"):
        pd.testing.assert_frame_equal(getattr(two, field), getattr(one, field))
    pd.testing.assert_frame_equal(two.collectives.ops, alone.collectives.ops)


def test_a_task_keeps_or_drops_the_events_and_digests_with_two_threads_for_plane_jobs(write_design, monkeypatch):
    import tpudiag.analysis.host_digest as host_digest

    path = _small_file(write_design)
    seen = []
    real = host_digest.digest_host
    monkeypatch.setattr(host_digest, "digest_host", lambda host, threads=1: seen.append(threads) or real(host, threads))
    kept = host_digest.parse_and_digest(path)
    assert kept.events is not None and kept.digest.n_events == 80
    dropped = host_digest.parse_and_digest(path, plane_jobs=2, keep_events=False)
    assert dropped.events is None and dropped.host_events is None and dropped.digest.n_events == 80
    assert seen == [1, 2]


def test_a_damaged_file_is_the_tasks_failure_and_a_dropped_host_has_nothing_to_digest(write_design, tmp_path):
    from tpudiag.analysis.host_digest import digest_host, parse_and_digest
    from tpudiag.model.profile import HostFailure

    good = _small_file(write_design).read_bytes()
    bad = tmp_path / "host9.xplane.pb"
    bad.write_bytes(good[: len(good) // 2])
    failure = parse_and_digest(bad, keep_events=False)
    assert isinstance(failure, HostFailure) and "host9.xplane.pb" in failure.message
    host = parse_and_digest(_small_file(write_design))
    drop_events(host)
    with pytest.raises(ValueError, match="^host host0: no events to digest$"):
        digest_host(host)


def test_an_analysis_of_the_small_design_and_a_second_one(write_design):
    from tests.conftest import US
    from tpudiag.analysis.profile_analysis import analyze
    from tpudiag.model.profile import WindowThresholds
    from tpudiag.parsers.capture import load_capture

    from tests.conftest import small_design

    profile = load_capture(write_design(small_design()), jobs=1)
    first = analyze(profile)
    assert first.core_time_ps == {"host0": 2 * 5 * 10_000 * US} and first.n_events == 80
    assert len(first.steps) == 10 and set(first.steps["host"].astype(str)) == {"host0"}
    assert all(h.digest.per_step is None for h in profile.hosts)  # held once, in the fold
    assert profile.step_fold is first.per_step
    second = analyze(profile)
    pd.testing.assert_frame_equal(second.per_step.op_step_worst, first.per_step.op_step_worst)
    pd.testing.assert_frame_equal(second.ops, first.ops)
    # the all-gather window of each step: one async op, five windows per chip
    classes = first.collectives(WindowThresholds())
    assert classes.thresholds == WindowThresholds()
    assert int(classes.ops.loc[classes.ops["kind"] == "async", "n"].sum()) == 2 * 5
    assert set(classes.steps["host"].astype(str)) == {"host0"}


def test_an_analysis_folds_the_fold_it_is_given_with_the_hosts_not_yet_folded(tmp_path):
    from tests.conftest import small_design
    from tpudiag.analysis.host_digest import digest_host
    from tpudiag.analysis.profile_analysis import analyze
    from tpudiag.parsers.capture import load_capture
    from tpudiag.writers.tpu_design import write_capture

    run = tmp_path / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    for h in range(2):
        write_capture(small_design(hostname=f"host{h}", n_steps=2 + h), run)  # host1 runs a third step
    profile = load_capture(tmp_path / "logdir", jobs=1)
    for host in profile.hosts:
        host.digest = digest_host(host)
    host0, host1 = (h.digest.per_step for h in profile.hosts)
    profile.hosts[0].digest.per_step = None  # host0 was folded as it arrived: its fold is passed
    analysis = analyze(profile, per_step=host0)
    expected = fold_step_tables([host0, host1])
    for field in ("op_step_worst", "op_step_sums", "collective_op_steps"):
        pd.testing.assert_frame_equal(getattr(analysis.per_step, field), getattr(expected, field))
    assert sorted(set(analysis.per_step.op_step_worst["step"])) == [1, 2, 3]  # step 3 from host1 alone
    # given a fold and no host left to fold: the fold as it is
    profile.hosts[1].digest.per_step = None
    assert analyze(profile, per_step=host1).per_step is host1


# The small design with a host copy in each step: copy-start.7 [8,000, 8,010) us brings 4 x 128 f32 from
# host memory (`S(5)`), copy-done.7 [9,000, 9,020) us waits for it.
HBM_ARRAY, HOST_ARRAY, CONTEXT = "f32[4,128]{1,0:T(8,128)}", "f32[4,128]{1,0:T(8,128)S(5)}", "u32[]{:S(2)}"


def _copy_design(**overrides):
    from tests.conftest import SMALL_OPS, US, small_design, small_schedule
    from tpudiag.writers.tpu_design import OpDef, Placed

    ops = (*SMALL_OPS, OpDef("copy-start.7", "copy-start", shape=f"({HBM_ARRAY}, {HOST_ARRAY}, {CONTEXT})"),
           OpDef("copy-done.7", "copy-done", shape=HBM_ARRAY))

    def schedule(chip: int, step: int):
        return [*small_schedule(chip, step), Placed("copy-start.7", 8000 * US, 10 * US),
                Placed("copy-done.7", 9000 * US, 20 * US)]

    return small_design(ops=ops, schedule=schedule, **overrides)


def _digest(write_design, design):
    from tpudiag.analysis.host_digest import digest_host
    from tpudiag.parsers.capture import parse_file_or_failure

    return digest_host(parse_file_or_failure(next(write_design(design).rglob("*.xplane.pb"))))


def test_a_digest_counts_the_host_copies_and_the_idle_time_of_each_step(write_design):
    from tests.conftest import US

    d = _digest(write_design, _copy_design())
    assert d.executions is False  # steps from the Steps line
    # the start and the done of the copy, 10 + 20 us of each step on each chip
    assert set(d.steps["host_transfer_ps"]) == {30 * US}
    # one transfer per done: 2 chips x 5 steps, on this host
    assert len(d.host_transfers) == 10 and set(d.host_transfers["host"].astype(str)) == {"host0"}
    # Idle per step, the gaps between the top-level ops (tests/conftest.py's schedule and the copy):
    # chip 0: [4,310, 4,400) 90 + [5,400, 5,500) 100 + [6,000, 7,000) 1,000 + [7,200, 8,000) 800
    #         + [8,010, 9,000) 990 + [9,020, 10,000) 980 = 3,960 us; chip 1's all-reduce runs 300 us
    #         longer: 3,660 us
    per_step = d.idle_steps.groupby("core")["idle_ps"].agg(list).to_dict()
    assert per_step == {0: [3960 * US] * 5, 1: [3660 * US] * 5}
    assert sorted(set(d.idle_steps["step"])) == [1, 2, 3, 4, 5]
    assert len(d.idle_gaps) == 2 * 5 * 6 and int(d.idle_gaps["idle_ps"].sum()) == 5 * (3960 + 3660) * US


def test_a_digest_of_executions_measures_idle_to_the_next_execution(write_design):
    # no Steps line: the steps are jit_train_step's executions, each one's period running to the next
    # one's start, so the last execution has no period
    from tpudiag.model.profile import StepKind

    d = _digest(write_design, _copy_design(steps_line=False))
    assert d.executions is True and d.step_source.kind is StepKind.XLA_MODULES
    assert len(d.steps) == 2 * 5 and len(d.idle_steps) == 2 * 4


def test_a_digest_without_steps_measures_idle_over_each_cores_span(write_design):
    from tests.conftest import US

    # neither a Steps line nor executions: one window per chip, from its first op's start (0) to its
    # last op's end (the fifth step's copy-done, 4 x 10,000 + 9,020 us), as step 0
    d = _digest(write_design, _copy_design(steps_line=False, modules_line=False))
    assert d.steps.empty and d.executions is False
    assert d.idle_steps[["core", "step", "period_ps"]].to_numpy().tolist() == [[0, 0, 49_020 * US],
                                                                               [1, 0, 49_020 * US]]
    # chip 0 idles 3,960 us in each of the first four steps and 3,960 - 980 in the fifth
    assert int(d.idle_steps.loc[d.idle_steps["core"] == 0, "idle_ps"].iloc[0]) == (5 * 3960 - 980) * US


def test_a_task_takes_the_host_parsed_ahead_and_parses_itself_when_it_reads_more(write_design, monkeypatch):
    import tpudiag.analysis.host_digest as host_digest
    from tpudiag.parsers import read_ahead

    path = _small_file(write_design)
    parsed = []
    real = host_digest.parse_file_or_failure
    monkeypatch.setattr(host_digest, "parse_file_or_failure", lambda *args: parsed.append(args) or real(*args))
    assert read_ahead.start(path, 2)
    host = host_digest.parse_and_digest(path)
    assert parsed == [] and host.digest.n_events == 80  # taken from the thread that parsed it ahead

    def also(planes, roles, where, name):  # reads more of the planes in the same pass
        return ("read with", name)

    # reading more needs a parse of its own (the file parsed ahead is left to its thread), with
    # the task's plane jobs
    assert read_ahead.start(path, 2)
    host = host_digest.parse_and_digest(path, also=also)
    assert parsed == [(path, 1, also)] and host.memory_timeline == ("read with", "host0")
    assert host.digest.n_events == 80
    read_ahead.take(path)  # the thread's own parse, not taken above


def test_folds_of_other_keys_are_held_apart_up_to_the_batch_and_regrouped_for_the_result():
    fold = StepFold()
    fold.BATCH = 2
    fold.add(_host(HOST_A))
    fold.add(_host(HOST_B))
    assert len(fold._folds) == 2  # two folds of other keys: not past a batch of 2, held apart
    result = fold.result()
    # both hosts in the result: fusion.1's sums 10 + 30 in program 7
    assert _rows(result.op_step_sums) == [(0, 7, "fusion.1", 40), (0, 8, "fusion.1", 1)]
    assert _rows(result.op_step_worst) == [(0, "copy.1", 2), (0, "fusion.1", 30), (1, "fusion.2", 5)]


def test_a_step_fold_of_hosts_without_collectives_keeps_their_empty_table():
    fold = StepFold()
    fold.add(_host(_tables([(0, "fusion.1", 1)], [(0, 7, "fusion.1", 1)], [])))
    fold.add(_host(_tables([(0, "fusion.1", 4)], [(0, 7, "fusion.1", 2)], [])))  # the same keys
    result = fold.result()
    assert _rows(result.op_step_worst) == [(0, "fusion.1", 4)] and _rows(result.op_step_sums) == [(0, 7, "fusion.1", 3)]
    assert result.collective_op_steps.empty
    assert list(result.collective_op_steps.columns) == schemas.COLLECTIVE_OP_STEPS.names
