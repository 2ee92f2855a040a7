"""Hosts digested where they are parsed: the driver keeps digests, and nothing downstream misses the events.

A 3-host capture of a scanned layer loop (a `while` running four layers, each with an async
all-gather hidden behind its matmul and one left adjacent, then a synchronous all-reduce; host1
has one slow step) is diagnosed as a user runs it, where every host's events are dropped after
its digest, and compared with the same capture whose hosts keep their events.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.rules import scenarios as sc
from tests.rules.scenarios import run_rules
from tpudiag.analysis.collective_windows import collective_windows
from tpudiag.analysis.host_digest import StepFold, digest_host, drop_events, fold_step_tables, parse_and_digest
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.analysis.timeline import step_timeline
from tpudiag.model.profile import HostFailure, StepTables, WindowThresholds
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.hlo_proto import capture_hlo_inputs
from tpudiag.pipeline import diagnose
from tpudiag.render.json_format import render_json
from tpudiag.rules.config import RulesConfig
from tpudiag.writers.tpu_design import write_capture

RUN = "plugins/profile/2026_01_01_00_00_00"
US = sc.US
LAYERS = 4
LAYER_PS = 1_000 * US


def _layer_loop(slow_step: int | None):
    def schedule(chip: int, step: int) -> list[sc.Placed]:
        extra = 800 * US if step == slow_step else 0
        out = [sc.Placed(sc.LOOP_OP.name, 0, LAYERS * LAYER_PS + extra)]
        for layer in range(LAYERS):
            t = layer * LAYER_PS
            out += [sc.Placed("all-gather-start.2", t, 10 * US), sc.Placed("fusion.2", t + 10 * US, 500 * US),
                    sc.Placed("all-gather-done.2", t + 510 * US, 10 * US),
                    sc.Placed("all-gather-start.1", t + 520 * US, 10 * US),
                    sc.Placed("all-gather-done.1", t + 530 * US, 200 * US),
                    sc.Placed("fusion.1", t + 730 * US, 250 * US + (extra if layer == LAYERS - 1 else 0))]
        out.append(sc.Placed("all-reduce.4", LAYERS * LAYER_PS + extra + 100 * US, 600 * US))
        return out
    return schedule


@pytest.fixture(scope="module")
def pod(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pod") / "logdir"
    for h in range(3):
        design = sc.design(sc.COLLECTIVE_OPS + (sc.LOOP_OP,), _layer_loop(2 if h == 1 else None),
                           hostname=f"host{h}", first_chip=2 * h, n_steps=5, step_ps=6_000 * US)
        write_capture(design, root / RUN)
    return root


def _kept(pod: Path):
    """The capture analysed with every host's events still on the driver."""
    return analyze(load_capture(pod, jobs=1))


def test_a_multi_host_diagnosis_keeps_digests_not_events(pod: Path):
    diagnosis = diagnose(pod, jobs=2)
    hosts = diagnosis.analysis.profile.hosts
    assert len(hosts) == 3
    assert all(h.events is None and h.host_events is None and h.async_windows.empty for h in hosts)
    assert all(h.digest is not None and h.digest.n_events > 0 for h in hosts)
    assert all(h.digest.per_step is None for h in hosts)  # folded as each host arrived
    assert not diagnosis.analysis.per_step.op_step_worst.empty


def test_dropping_the_events_changes_no_report(pod: Path):
    def report(analysis) -> dict:
        findings, skipped = run_rules(analysis, RulesConfig())
        data = json.loads(render_json(build_report(analysis, tuple(findings),
                                                   rules_skipped=tuple(skipped))))
        data["hosts"] = [{k: v for k, v in h.items() if k != "path"} for h in data["hosts"]]
        return data

    kept = report(_kept(pod))
    dropped = _kept(pod)
    for host in dropped.profile.hosts:
        drop_events(host)
    assert {f["rule"] for f in kept["findings"]} >= {"exposed-collective"}
    assert report(dropped) == kept
    assert json.loads(render_json(diagnose(pod, jobs=2).report))["findings"] == kept["findings"]


def _as_dict(series) -> dict:
    """A grouped series as {key as strings: int}, whatever the key columns' dtypes."""
    return {tuple(str(k) for k in key): int(v) for key, v in series.items()}


def test_op_tables_agree_with_the_events(pod: Path):
    profile = load_capture(pod, jobs=1)
    for host in profile.hosts:
        digest = digest_host(host)
        ev, per_step = host.events, digest.per_step
        per_core = ev.groupby(["step", "name", "core"], observed=True)["self_ps"].sum()
        worst = per_core.groupby(level=["step", "name"], observed=True).max()
        assert _as_dict(worst) == _as_dict(per_step.op_step_worst.set_index(["step", "name"])["self_ps"])
        sums = ev.groupby(["step", "program_id", "name"], observed=True)["self_ps"].sum()
        assert _as_dict(sums) == _as_dict(per_step.op_step_sums.set_index(["step", "program_id", "name"])["self_ps"])
        counts = ev.groupby(["device", "name"], observed=True)["self_ps"].size()
        assert _as_dict(counts) == _as_dict(digest.op_cores.groupby(["device", "name"], observed=True)["n"].sum())
        # Reduced over the cores, the per-step table is a fraction of the events.
        assert len(per_step.op_step_worst) * 2 <= len(ev)
    # Folded over the hosts: the worst core of any host, per step and op.
    analysis = analyze(profile)
    ev = pd.concat([h.events.assign(host=h.host) for h in profile.hosts])
    per_core = ev.groupby(["step", "name", "host", "core"], observed=True)["self_ps"].sum()
    worst = per_core.groupby(level=["step", "name"], observed=True).max()
    assert _as_dict(worst) == _as_dict(analysis.per_step.op_step_worst.set_index(["step", "name"])["self_ps"])
    assert all(d.per_step is None for d in analysis.digests.values())  # held once, in the fold


def test_a_digest_in_two_threads_equals_one_in_one(pod: Path, monkeypatch):
    import threading

    import tpudiag.analysis.host_digest as host_digest

    monkeypatch.setattr(host_digest, "THREADED_DIGEST_MIN_EVENTS", 0)
    threads = set()
    windows = host_digest.host_windows

    def recording(*args):
        threads.add(threading.get_ident())
        return windows(*args)

    monkeypatch.setattr(host_digest, "host_windows", recording)
    for one, two in zip(load_capture(pod, jobs=1).hosts, load_capture(pod, jobs=1).hosts):
        alone, together = digest_host(one), digest_host(two, threads=2)
        for field in ("steps", "ops", "op_cores", "op_means", "idle_gaps", "idle_steps", "host_transfers"):
            pd.testing.assert_frame_equal(getattr(together, field), getattr(alone, field))
        for field in ("op_step_worst", "op_step_sums", "collective_op_steps"):
            pd.testing.assert_frame_equal(getattr(together.per_step, field), getattr(alone.per_step, field))
        for field in ("steps", "ops", "coverage"):
            pd.testing.assert_frame_equal(getattr(together.collectives, field), getattr(alone.collectives, field))
        assert together.core_span_ps == alone.core_span_ps
    assert len(threads) == 2  # the windows were digested in this thread alone, then in another


def test_a_profile_can_be_analysed_twice(pod: Path):
    # Regression: the first `analyze` freed the hosts' per-step tables into its fold, and a second
    # one raised for want of them. It now reads the fold the first kept on the profile.
    profile = load_capture(pod, jobs=1)
    first, second = analyze(profile), analyze(profile)
    assert all(h.digest.per_step is None for h in profile.hosts)  # still held once, in the fold
    pd.testing.assert_frame_equal(first.per_step.op_step_worst, second.per_step.op_step_worst)
    pd.testing.assert_frame_equal(first.per_step.op_step_sums, second.per_step.op_step_sums)
    pd.testing.assert_frame_equal(first.ops, second.ops)
    pd.testing.assert_frame_equal(first.steps, second.steps)


def test_the_fold_does_not_depend_on_arrival_order(pod: Path):
    hosts = load_capture(pod, jobs=1).hosts
    for h in hosts:
        h.digest = digest_host(h)
    tables = [h.digest.per_step for h in hosts]

    def folded(order) -> StepTables:
        fold = StepFold()
        fold.BATCH = 2  # fold in batches, as a long pod does
        for i in order:
            hosts[i].digest.per_step = tables[i]
            fold.add(hosts[i])
        return fold.result()

    a, b = folded([0, 1, 2]), folded([2, 0, 1])
    for field in ("op_step_worst", "op_step_sums", "collective_op_steps"):
        x, y = getattr(a, field), getattr(b, field)
        assert not x.empty
        pd.testing.assert_frame_equal(x, y)
        pd.testing.assert_frame_equal(x, getattr(fold_step_tables(tables), field))


def test_hosts_with_the_same_keys_fold_row_by_row(pod: Path, monkeypatch):
    # A pod's hosts mostly hold the same (step, op) keys row for row: their values are folded in
    # place of regrouping every host (0.25 s per 2 M-event host on the driver). A host with other
    # keys (here one row short) starts a fold of its own, and the two folds are regrouped at the
    # end, whichever came first. The result is the same either way.
    from tpudiag.analysis import host_digest

    hosts = load_capture(pod, jobs=1).hosts
    tables = [digest_host(h).per_step for h in hosts]
    fields = ("op_step_worst", "op_step_sums", "collective_op_steps")
    odd = StepTables(*(getattr(tables[0], f).iloc[1:].reset_index(drop=True) for f in fields))
    real = host_digest.fold_step_tables
    regrouped: list[int] = []
    monkeypatch.setattr(host_digest, "fold_step_tables", lambda parts: regrouped.append(len(parts)) or real(parts))

    def folded(parts: list[StepTables]) -> StepTables:
        fold = StepFold()
        for part in parts:
            hosts[0].digest = digest_host(hosts[0]) if hosts[0].digest is None else hosts[0].digest
            hosts[0].digest.per_step = part
            fold.add(hosts[0])
        return fold.result()

    for parts, regroupings in ((tables, []), ([*tables, odd], [2]), ([odd, *tables], [2])):
        regrouped.clear()
        result = folded(parts)
        assert regrouped == regroupings
        for field in fields:
            pd.testing.assert_frame_equal(getattr(result, field), getattr(real(parts), field))


def test_the_collective_digest_folds_the_windows(pod: Path):
    analysis = _kept(pod)
    windows = collective_windows(analysis)
    coll = analysis.collectives(WindowThresholds())
    op_steps = analysis.per_step.collective_op_steps
    assert int(coll.ops["n"].sum()) == len(windows)
    assert len(coll.ops) + len(op_steps) + len(coll.steps) < len(windows)
    for col in ("span_ps", "covered_ps", "exposed_ps"):
        assert int(coll.ops[col].sum()) == int(windows[col].sum())
    for klass in ("hidden", "partial", "exposed"):
        assert int(coll.ops[f"n_{klass}"].sum()) == int((windows["klass"] == klass).sum())
    by_core = windows.groupby(["host", "core", "step", "family"])["exposed_ps"].sum()
    assert _as_dict(by_core) == _as_dict(coll.steps.groupby(["host", "core", "step", "family"],
                                                            observed=True)["exposed_ps"].sum())
    worst = windows.groupby(["step", "kind", "name", "host", "core"])["exposed_ps"].sum().groupby(
        level=["step", "kind", "name"]).max()
    assert _as_dict(worst) == _as_dict(op_steps.set_index(["step", "kind", "name"])["exposed_ps"])


def _classes_of(windows: pd.DataFrame) -> dict:
    """Windows per (host, op) and class, as the per-window rows class them."""
    return _as_dict(windows.groupby(["host", "name", "klass"]).size())


def _digest_classes(ops: pd.DataFrame) -> dict:
    """The same from `Analysis.collectives(...).ops` (COLLECTIVE_CLASSES)."""
    out = {}
    for r in ops.itertuples(index=False):
        for klass in ("hidden", "partial", "exposed"):
            n = getattr(r, f"n_{klass}")
            if n:
                out[(r.host, r.name, klass)] = n
    return out


@pytest.mark.parametrize("thresholds", [WindowThresholds(), WindowThresholds(hidden=0.999, exposed=0.9),
                                        WindowThresholds(hidden=0.5, exposed=0.2)], ids=str)
def test_any_thresholds_class_the_digests_as_the_windows(pod: Path, thresholds: WindowThresholds):
    """The digest keeps covered fractions, not classes: any thresholds class them on the driver,
    with the events gone, exactly as the per-window rows are classed."""
    kept = _kept(pod)
    windows = collective_windows(kept, thresholds)
    expected = _classes_of(windows)
    assert _digest_classes(kept.collectives(thresholds).ops) == expected
    dropped = diagnose(pod, jobs=2).analysis
    assert all(h.events is None for h in dropped.profile.hosts)
    classes = dropped.collectives(thresholds)
    assert classes.thresholds == thresholds
    assert _digest_classes(classes.ops) == expected
    adjacent = windows[~windows["compute_inside"] & (windows["klass"] != "hidden")]
    assert int(classes.ops["n_adjacent"].sum()) == len(adjacent)


def test_config_thresholds_class_on_the_driver(pod: Path, tmp_path: Path):
    """all-gather-start.2 is 96 % covered: hidden by default, partial when hidden needs 99.9 %; the
    digests made in the workers are the same either way."""
    config = tmp_path / "tpudiag.toml"
    config.write_text("[rules.exposed-collective]\nhidden_threshold = 0.999\nexposed_threshold = 0.9\n")

    def async_message(**kwargs) -> str:
        diagnosis = diagnose(pod, jobs=2, select="exposed-collective", **kwargs)
        (message,) = [f.message for f in diagnosis.findings if "async collective windows" in f.message]
        return message

    assert ", 0 hidden" not in async_message()
    assert ", 0 hidden" in async_message(config=config)


def test_the_timeline_rereads_a_dropped_host(pod: Path):
    kept = step_timeline(_kept(pod), 2)
    dropped = step_timeline(diagnose(pod, jobs=2).analysis, 2)
    assert len(dropped.lanes) == 6
    assert dropped == kept


def test_a_digest_needs_events(pod: Path):
    host = load_capture(pod, jobs=1).hosts[0]
    drop_events(host)
    with pytest.raises(ValueError, match="no events"):
        digest_host(host)


def test_a_damaged_host_is_a_failure_in_the_task(tmp_path: Path, pod: Path):
    bad = tmp_path / "host9.xplane.pb"
    good = next((pod / RUN).glob("*.xplane.pb")).read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    result = parse_and_digest(bad, keep_events=False)
    assert isinstance(result, HostFailure) and "host9.xplane.pb" in result.message


def test_hosts_share_one_copy_of_each_embedded_program(tmp_path: Path):
    """Every host of an SPMD run embeds the same HLO proto: one copy is kept, parsed once; a damaged
    copy on one host is a warning there, and another host's copy serves."""
    proto = (Path(__file__).resolve().parents[1] / "fixtures" / "dumps" / "v6e_mlp_train" / "module.pb").read_bytes()
    run = tmp_path / "logdir" / RUN
    for h, blob in enumerate((proto[:100], proto, proto)):  # host0's copy is cut short
        write_capture(sc.exposed_collectives(hostname=f"host{h}", first_chip=2 * h, hlo_proto=blob), run)
    profile = load_capture(tmp_path / "logdir", jobs=2)
    blobs = [h.hlo_protos for h in profile.hosts]
    (pid,) = blobs[1]
    assert blobs[1][pid] is blobs[2][pid] and blobs[0][pid] is not blobs[1][pid]
    inputs = capture_hlo_inputs(profile)
    assert len(inputs) == 1 and inputs[0].program.instructions
    assert any("embedded HLO not used" in w for w in profile.hosts[0].warnings)
    assert not any("embedded HLO" in w for h in profile.hosts[1:] for w in h.warnings)


def test_a_pods_hosts_hold_one_copy_of_their_names_and_strings(pod: Path):
    # The driver of a pod held every op name, category list and shape string once per host (0.4 MB
    # per host of a 522-op program): they now point at the first host's, with the same values.
    hosts = diagnose(pod, jobs=2).analysis.profile.hosts
    alone = [parse_and_digest(Path(h.source), keep_events=False) for h in hosts]
    first = hosts[0].digest.ops
    for host, own in zip(hosts, alone):
        ops = host.digest.ops
        pd.testing.assert_frame_equal(ops.drop(columns="host"), own.digest.ops.drop(columns="host"))
        pd.testing.assert_frame_equal(host.op_metadata.drop(columns="host"), own.op_metadata.drop(columns="host"))
        assert ops["name"].cat.categories is first["name"].cat.categories
        assert host.digest.op_cores["name"].cat.categories is hosts[0].digest.op_cores["name"].cat.categories
        assert all(a is b for a, b in zip(ops["shape_with_layout"], first["shape_with_layout"]))
    # Measured values stay each host's own: host1 has a slow step.
    assert not hosts[1].digest.ops["self_time_ps"].equals(hosts[0].digest.ops["self_time_ps"])
