"""Bad input gives one clean InputError naming the file and the cause, never another exception."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples, small_design
import tpudiag.parsers.input_files as input_files
from tpudiag.errors import InputError
from tpudiag.parsers.capture import _parse_file, load_capture
from tpudiag.parsers.capture_files import find_capture
from tpudiag.writers.tpu_design import build_capture

GOOD = build_capture(small_design()).serialize()


def _parse_bytes(data: bytes, folder: Path, name: str):
    """The capture reader's own path for one host file: its HostTrace, or InputError."""
    f = folder / name
    f.write_bytes(data)
    return _parse_file(f)


def test_mangled_v6e_trace_is_a_clean_error(mangled_capture):
    with pytest.raises(InputError) as info:
        _parse_file(mangled_capture)
    assert info.value.path == str(mangled_capture)
    assert "corrupt" in info.value.message


def test_empty_file(tmp_path):
    f = tmp_path / "h.xplane.pb"
    f.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        _parse_file(f)


def test_text_file_is_not_a_trace(tmp_path):
    f = tmp_path / "notes.xplane.pb"
    f.write_text("hello, this is not a protobuf\n")
    with pytest.raises(InputError, match="not an XProf trace"):
        _parse_file(f)


def test_gzip_file_gets_a_hint(tmp_path):
    import gzip

    f = tmp_path / "h.xplane.pb"
    f.write_bytes(gzip.compress(GOOD))
    with pytest.raises(InputError) as info:
        _parse_file(f)
    assert info.value.hint and "gunzip" in info.value.hint


def test_unreadable_file(tmp_path, monkeypatch):
    f = tmp_path / "h.xplane.pb"
    f.write_bytes(GOOD)

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # Tests run as root in CI, where chmod 000 does not stop reads: simulate the OS refusing.
    monkeypatch.setattr(input_files.os, "open", deny)
    with pytest.raises(InputError, match="permission denied"):
        _parse_file(f)


def test_directory_without_trace(tmp_path):
    with pytest.raises(InputError, match="no `\\*.xplane.pb` trace files"):
        find_capture(tmp_path)


def test_directory_without_trace_names_a_logdir_one_level_down(tmp_path):
    # The real captures in ../shared keep their logdir in `trace/` beside a LICENSE.
    run = tmp_path / "trace" / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    (run / "h.xplane.pb").write_bytes(GOOD)
    (tmp_path / "other").mkdir()
    with pytest.raises(InputError) as err:
        find_capture(tmp_path)
    assert err.value.hint == f"a logdir is one level down: pass `{tmp_path / 'trace'}`"
    assert find_capture(tmp_path / "trace").files == (run / "h.xplane.pb",)


def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        find_capture(tmp_path / "nope")


def test_logdir_without_runs(tmp_path):
    (tmp_path / "plugins" / "profile" / "empty_run").mkdir(parents=True)
    with pytest.raises(InputError, match="no run"):
        find_capture(tmp_path)


def test_newest_run_is_used(tmp_path):
    for run in ("2026_01_01_00_00_00", "2026_02_01_00_00_00"):
        d = tmp_path / "plugins" / "profile" / run
        d.mkdir(parents=True)
        (d / "h.xplane.pb").write_bytes(GOOD)
    assert find_capture(tmp_path).run == "2026_02_01_00_00_00"


def test_one_bad_host_does_not_stop_the_others(tmp_path, mangled_capture):
    (tmp_path / "good.xplane.pb").write_bytes(GOOD)
    (tmp_path / "bad.xplane.pb").write_bytes(mangled_capture.read_bytes())
    profile = load_capture(tmp_path, jobs=2)
    assert [h.host for h in profile.hosts] == ["host0"]
    assert len(profile.failures) == 1 and "bad.xplane.pb" in profile.failures[0].message


def test_all_hosts_bad_is_an_error(tmp_path):
    (tmp_path / "a.xplane.pb").write_bytes(b"\x0a\xff\xff")
    (tmp_path / "b.xplane.pb").write_bytes(b"garbage")
    with pytest.raises(InputError, match="none of the 2 host files"):
        load_capture(tmp_path, jobs=1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=512))
def test_random_bytes_give_a_clean_error_or_a_trace(tmp_path_factory, data):
    try:
        _parse_bytes(data, tmp_path_factory.getbasetemp(), "random.xplane.pb")
    except InputError:
        pass


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(min_value=1, max_value=len(GOOD) - 1))
def test_truncated_trace_gives_a_clean_error_or_a_smaller_trace(tmp_path_factory, cut):
    # Cut on a field boundary, the rest is a valid, smaller trace; it must still parse.
    try:
        _parse_bytes(GOOD[:cut], tmp_path_factory.getbasetemp(), "cut.xplane.pb")
    except InputError:
        pass


@settings(max_examples=bounded_examples(150, 50), deadline=None)
@given(pos=st.integers(min_value=0, max_value=len(GOOD) - 1), value=st.integers(min_value=0, max_value=255))
def test_flipped_byte_gives_a_clean_error_or_a_trace(tmp_path_factory, pos, value):
    data = bytearray(GOOD)
    data[pos] = value
    try:
        _parse_bytes(bytes(data), tmp_path_factory.getbasetemp(), "flip.xplane.pb")
    except InputError:
        pass


def test_error_line_names_file_without_trailing_period():
    err = InputError("no such file.", path="/x/y.xplane.pb")
    assert err.one_line() == "`/x/y.xplane.pb`: no such file"
    assert os.linesep not in err.one_line()


def test_regression_out_of_range_device_offset_drops_the_event_with_a_warning(tmp_path):
    """A uint64 device_offset_ps above 2**63 cannot be an int64 ps time: that event is dropped with a
    warning (never an OverflowError), and the rest of the line is read."""
    from tpudiag.writers.xspace_builder import U64, XSpaceBuilder

    space = XSpaceBuilder("h")
    plane = space.plane("/device:TPU:0", 1)
    md = plane.event_metadata("%f = f32[] fusion()", "f", {"program_id": U64(1), "symbol_id": U64(1)})
    line = plane.line("XLA Ops", 3)
    line.event(md, 0, 10, {"device_offset_ps": U64(2**64 - 1), "device_duration_ps": U64(10)})
    line.event(md, 0, 10, {"device_offset_ps": U64(500), "device_duration_ps": U64(10)})
    host = load_capture(space.write(tmp_path / "h.xplane.pb")).hosts[0]
    assert host.events["start_ps"].tolist() == [500]
    assert any("1 events on a `XLA Ops` line dropped" in w and "beyond int64" in w for w in host.warnings)


def test_device_times_are_read_in_any_stat_order(tmp_path):
    """The fast path expects device offset and duration first; other orders take the general path."""
    from tpudiag.writers.xspace_builder import U64, XSpaceBuilder

    space = XSpaceBuilder("h")
    plane = space.plane("/device:TPU:0", 1)
    md = plane.event_metadata("%f = f32[] fusion()", "f", {"program_id": U64(1), "symbol_id": U64(1)})
    line = plane.line("XLA Ops", 3)
    line.event(md, 0, 10, {"device_offset_ps": U64(100), "device_duration_ps": U64(7)})
    line.event(md, 0, 10, {"group_id": 3, "device_duration_ps": U64(8), "device_offset_ps": U64(200)})
    line.event(md, 300, 9, {"device_offset_ps": U64(400)})  # duration missing: the event's own span
    host = load_capture(space.write(tmp_path / "h.xplane.pb")).hosts[0]
    ev = host.events.sort_values("start_ps")
    assert ev["start_ps"].tolist() == [100, 200, 300]
    assert ev["dur_ps"].tolist() == [7, 8, 9]
