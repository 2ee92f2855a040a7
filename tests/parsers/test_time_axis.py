"""Every plane's lines on one time axis, whatever clock the producer wrote them on (issue 19).

A v6e capture with relative device lines and `/host:CPU` lines on an epoch clock (~1.76e18 ns) was
refused with "implausible event times" because the host lines were put on the device origin
and `1.76e18 x 1000` ps overflows int64. The rules are in docs/time-axis.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, bounded_examples
from tests.rules import scenarios as sc
from tests.robustness.test_multi_host import run_cli
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.parsers.capture import load_capture
from tpudiag.pipeline import diagnose
from tpudiag.parsers.time_axis import EPOCH_MIN_NS, MAX_BASE_PS, time_axis
from tpudiag.proto import XSpace
from tpudiag.writers.tpu_design import build_capture

EPOCH_NS = 1_764_000_000_000_000_000  # late 2025, as a v6e host clock reads
EXAMPLE = next((REPO / "examples" / "captures" / "train_v6e_4chip").glob("plugins/profile/*/*.xplane.pb"))
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def on_epoch_clock(space: XSpace, planes: set[str], epoch_ns: int, anchor: bool) -> XSpace:
    """The capture with the named planes' lines re-expressed on an epoch clock, offsets unchanged;
    `anchor` adds the `Task Environment` plane with `profile_start_time` as TSL writes it."""
    for plane in space.planes:
        if plane.name in planes:
            for line in plane.lines:
                line.timestamp_ns += epoch_ns
    if anchor:
        env = space.planes.add(id=len(space.planes) + 100, name="Task Environment")
        env.stat_metadata[1].id = 1
        env.stat_metadata[1].name = "profile_start_time"
        env.stats.add(metadata_id=1, uint64_value=epoch_ns)
    return space


def write(space: XSpace, run: Path, name: str = "host0") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / f"{name}.xplane.pb").write_bytes(space.SerializeToString())
    return run


def example_space() -> XSpace:
    space = XSpace()
    space.ParseFromString(EXAMPLE.read_bytes())
    return space


def ops_and_steps(run: Path):
    profile = load_capture(run, jobs=1)
    a = analyze(profile)
    ops = a.ops[["name", "occurrences", "total_time_ps", "self_time_ps"]].sort_values("name").reset_index(drop=True)
    return profile, ops, a.steps[["host", "core", "step", "dur_ps"]].reset_index(drop=True)


@pytest.fixture(scope="module")
def normalised(tmp_path_factory):
    return ops_and_steps(write(example_space(), tmp_path_factory.mktemp("normal")))


@pytest.mark.parametrize("anchor", [True, False], ids=["with profile_start_time", "without"])
def test_regression_host_lines_on_an_epoch_clock_beside_relative_device_lines(tmp_path, normalised, anchor):
    profile, ops, steps = ops_and_steps(write(on_epoch_clock(example_space(), {"/host:CPU"}, EPOCH_NS, anchor),
                                              tmp_path))
    _, want_ops, want_steps = normalised
    pd.testing.assert_frame_equal(ops, want_ops)
    pd.testing.assert_frame_equal(steps, want_steps)
    host = profile.hosts[0]
    aligned = [w for w in host.warnings if "another clock" in w]
    assert bool(aligned) is not anchor  # only an unanchored host clock is set aside, and said so
    assert (host.host_events is not None) is anchor


def test_regression_four_hosts_with_epoch_host_lines_report_all_four(tmp_path):
    run = tmp_path / "run"
    for h in range(4):
        space = example_space()
        space.hostnames[:] = [f"host{h}"]
        write(on_epoch_clock(space, {"/host:CPU"}, EPOCH_NS + h * 1_000_003, anchor=False), run, f"host{h}")
    proc = run_cli("report", str(run), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["hosts"] == [f"host{h}" for h in range(4)]


def test_regression_one_device_plane_on_an_epoch_clock(tmp_path, normalised):
    """Without an anchor each clock keeps its own origin, with a warning; per-core numbers are unchanged."""
    profile, ops, steps = ops_and_steps(write(on_epoch_clock(example_space(), {"/device:TPU:2"}, EPOCH_NS, False),
                                              tmp_path))
    _, want_ops, want_steps = normalised
    pd.testing.assert_frame_equal(ops, want_ops)
    pd.testing.assert_frame_equal(steps, want_steps)
    assert any("two clocks" in w for w in profile.hosts[0].warnings)


def test_anchored_host_spans_land_where_the_relative_ones_did(tmp_path):
    """With `profile_start_time`, an epoch host line lands exactly where its relative twin did, so
    host spans still explain device idle time."""
    d = sc.decode_v6e()
    plain = load_capture(write(build_capture(d).proto, tmp_path / "a"), jobs=1).hosts[0]
    epoch = load_capture(write(on_epoch_clock(build_capture(d).proto, {"/host:CPU"}, EPOCH_NS, True), tmp_path / "b"),
                         jobs=1).hosts[0]
    pd.testing.assert_frame_equal(plain.host_events, epoch.host_events)


def test_regression_a_host_line_that_began_before_the_profile_start(tmp_path):
    """TSL rebases only lines at or after `profile_start_time`, so a host line that began 1 ms before
    it stays on the epoch clock in the file: it is rebased all the same, to a negative start."""
    d = sc.decode_v6e()
    plain = load_capture(write(build_capture(d).proto, tmp_path / "a"), jobs=1).hosts[0]
    space = on_epoch_clock(build_capture(d).proto, set(), EPOCH_NS, True)
    cpu = next(p for p in space.planes if p.name == "/host:CPU")
    for line in cpu.lines:
        line.timestamp_ns += EPOCH_NS - 1_000_000  # its events' offsets grow by the same 1 ms
        for ev in line.events:
            ev.offset_ps += 1_000_000_000
    early = load_capture(write(space, tmp_path / "b"), jobs=1).hosts[0]
    pd.testing.assert_frame_equal(plain.host_events, early.host_events)
    assert not any("clock" in w for w in early.warnings)


def test_a_host_line_far_before_the_profile_start_is_dropped_with_a_warning(tmp_path):
    space = on_epoch_clock(build_capture(sc.decode_v6e()).proto, {"/host:CPU"}, EPOCH_NS, True)
    cpu = next(p for p in space.planes if p.name == "/host:CPU")
    cpu.lines[0].timestamp_ns = EPOCH_MIN_NS  # decades before the anchor: no int64 ps time
    host = load_capture(write(space, tmp_path), jobs=1).hosts[0]
    assert host.host_events.empty
    assert any("`main/1` line of `/host:CPU` dropped" in w for w in host.warnings)


@settings(max_examples=200, deadline=None)
@given(st.lists(INT64, max_size=4), st.lists(INT64, max_size=4),
       st.one_of(st.none(), st.integers(EPOCH_MIN_NS, (1 << 63) - 1)), INT64)
def test_any_int64_timestamp_is_placed_exactly_or_not_at_all(device, host, anchor, t):
    base = time_axis(device, host, anchor).base_ps(t)
    assert base is None or (-MAX_BASE_PS <= base <= MAX_BASE_PS and base % 1000 == 0)


RELATIVE_NS = st.integers(-10**15, 10**15)


@settings(max_examples=200, deadline=None)
@given(st.lists(RELATIVE_NS, min_size=1, max_size=4), st.lists(RELATIVE_NS, max_size=4), RELATIVE_NS)
def test_an_epoch_clock_with_its_anchor_reads_as_the_relative_one(device, host, t):
    plain = time_axis(device, host, None)
    epoch = time_axis([d + EPOCH_NS for d in device], [h + EPOCH_NS for h in host], EPOCH_NS)
    assert epoch.base_ps(t + EPOCH_NS) == plain.base_ps(t)
    assert plain.base_ps(min(device)) == 0  # the earliest device line is the origin
    assert epoch.host_aligned and plain.host_aligned


def test_without_an_anchor_each_clock_keeps_its_own_origin():
    axis = time_axis([0, 0, EPOCH_NS + 5], [EPOCH_NS + 7], None)
    assert axis.base_ps(0) == 0 and axis.base_ps(EPOCH_NS + 5) == 0 and axis.base_ps(EPOCH_NS + 7) == 2000
    assert not axis.devices_aligned and not axis.host_aligned
    assert time_axis([EPOCH_NS], [EPOCH_NS - 10], None).host_aligned  # one clock for all: aligned


@pytest.mark.parametrize("line_ns, offset_ps", [(4 * 10**15, (1 << 63) - 1), (-4 * 10**15, -(1 << 63))])
@pytest.mark.parametrize("wire", ["compiled", "protobuf"])
def test_an_event_past_int64_on_a_far_line_is_dropped_alone(tmp_path, monkeypatch, line_ns, offset_ps, wire):
    """A line placed ±4e18 ps from the origin plus an extreme int64 offset overflows int64: that event
    is dropped with a warning, by the compiled reader and by protobuf alike, and never raises."""
    monkeypatch.setenv("TPUDIAG_NO_WIRE", "1" if wire == "protobuf" else "0")
    space = build_capture(sc.healthy(n_chips=1, n_steps=1)).proto
    plane = next(p for p in space.planes if p.name == "/device:TPU:0")
    ops = next(ln for ln in plane.lines if ln.name == "XLA Ops")
    ops.timestamp_ns = line_ns
    n = len(ops.events)
    ops.events[0].offset_ps = offset_ps
    ops.events[0].ClearField("stats")
    host = load_capture(write(space, tmp_path), jobs=1).hosts[0]
    assert len(host.events) == n - 1
    assert any("1 events on a `XLA Ops` line dropped" in w for w in host.warnings)


STAT_VALUES = st.one_of(st.tuples(st.just("uint64_value"), st.sampled_from([EPOCH_NS, EPOCH_NS - 10**6, 0])),
                        st.tuples(st.just("int64_value"), INT64),
                        st.tuples(st.just("uint64_value"), st.integers(0, (1 << 64) - 1)),
                        st.tuples(st.just("double_value"), st.floats(allow_nan=True)),
                        st.tuples(st.just("str_value"), st.text(max_size=20)))


STAMPS = st.one_of(INT64, st.sampled_from([0, 1, EPOCH_NS, EPOCH_NS - 10**6, EPOCH_NS + 10**15, EPOCH_MIN_NS,
                                           -(1 << 63), (1 << 63) - 1]))


@settings(max_examples=bounded_examples(25, 10), deadline=None)
@given(STAT_VALUES, st.lists(STAMPS, min_size=1, max_size=8), st.lists(STAMPS, min_size=1, max_size=8))
def test_no_anchor_or_line_timestamp_fails_the_host(tmp_path_factory, anchor, device_ns, host_ns):
    """Whatever `profile_start_time` and line timestamps say, the host is read: what cannot be
    placed is dropped with a warning, what is kept is plausible and analyses."""
    space = build_capture(sc.decode_v6e(n_chips=1, n_steps=2)).proto
    env = space.planes.add(id=99, name="Task Environment")
    env.stat_metadata[1].id = 1
    env.stat_metadata[1].name = "profile_start_time"
    setattr(env.stats.add(metadata_id=1), *anchor)
    lines = [(p.name, ln) for p in space.planes for ln in p.lines]
    for i, (name, line) in enumerate(lines):
        stamps = host_ns if name == "/host:CPU" else device_ns
        line.timestamp_ns = stamps[i % len(stamps)]
    profile = load_capture(write(space, tmp_path_factory.mktemp("run")), jobs=1)
    for host in profile.hosts:
        assert host.events["dur_ps"].between(0, 86_400 * 10**12).all()
        analyze(profile)


def test_regression_idle_on_a_host_clock_apart_says_why_its_cause_is_unknown(tmp_path):
    """The device-idle finding must not ask for a host plane the capture has: its host plane is on
    another clock with no anchor, and the finding says that instead."""
    space = build_capture(sc.idle_training(1500 * sc.US, "TransferFromDevice")).proto
    run = write(on_epoch_clock(space, {"/host:CPU"}, EPOCH_NS, anchor=False), tmp_path)
    d = diagnose(run, jobs=1)
    idle = next(f for f in d.findings if f.rule == "device-idle")
    assert "the host plane is on another clock" in idle.message
    assert "profile_start_time" in idle.fix
    anchored = diagnose(write(on_epoch_clock(build_capture(sc.idle_training(1500 * sc.US, "TransferFromDevice")).proto,
                                             {"/host:CPU"}, EPOCH_NS, anchor=True), tmp_path / "b"), jobs=1)
    assert "synchronisation" in next(f for f in anchored.findings if f.rule == "device-idle").message
