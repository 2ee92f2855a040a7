"""A big host file parses its planes in worker processes (or, with 2 jobs, in 2 threads); the
result must equal one process's."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import small_design
from tpudiag.errors import InputError
from tpudiag.parsers import capture
from tpudiag.writers.tpu_design import write_capture


@pytest.fixture
def always_parallel(monkeypatch):
    monkeypatch.setattr(capture, "PARALLEL_PLANES_MIN_BYTES", 0)


@pytest.mark.parametrize("jobs", [capture.PARALLEL_PLANES_MIN_JOBS, 2], ids=["processes", "threads"])
def test_parallel_planes_equal_sequential(tmp_path, always_parallel, jobs):
    f = write_capture(small_design(n_chips=3), tmp_path / "run")
    together = capture._parse_file(f, plane_jobs=jobs)
    alone = capture._parse_file(f, plane_jobs=1)
    pd.testing.assert_frame_equal(together.events, alone.events)
    pd.testing.assert_frame_equal(together.op_metadata, alone.op_metadata)
    pd.testing.assert_frame_equal(together.step_markers, alone.step_markers)
    pd.testing.assert_frame_equal(together.async_windows, alone.async_windows)
    assert together.device == alone.device
    assert together.host == alone.host == "host0"
    assert together.warnings == alone.warnings


def _cut_planes(f, indices) -> None:
    from tpudiag.proto import XSpaceRawPlanes

    raw = XSpaceRawPlanes()
    raw.ParseFromString(f.read_bytes())
    for i in indices:
        raw.planes[i] = raw.planes[i][:-7]  # a plane cut short inside its last event
    f.write_bytes(raw.SerializeToString())


@pytest.mark.parametrize("jobs", [capture.PARALLEL_PLANES_MIN_JOBS, 2], ids=["processes", "threads"])
def test_a_corrupt_plane_in_a_worker_is_dropped_with_a_warning_naming_it(tmp_path, always_parallel, jobs):
    f = write_capture(small_design(n_chips=2), tmp_path / "run")
    _cut_planes(f, [1])
    host = capture._parse_file(f, plane_jobs=jobs)
    assert set(host.events["device"].astype(str)) == {"/device:TPU:0"}
    assert any("`/device:TPU:1` could not be read" in w for w in host.warnings)


def test_a_host_whose_device_planes_are_all_corrupt_is_a_clean_error(tmp_path, always_parallel):
    f = write_capture(small_design(n_chips=2), tmp_path / "run")
    _cut_planes(f, [0, 1])
    with pytest.raises(InputError) as info:
        capture._parse_file(f, plane_jobs=capture.PARALLEL_PLANES_MIN_JOBS)
    assert info.value.path == str(f)


def test_two_cores_parse_in_one_process(tmp_path, monkeypatch, always_parallel):
    class PoolUsed(Exception):
        pass

    def no_pool(*args):
        raise PoolUsed

    monkeypatch.setattr(capture, "_pool", no_pool)
    f = write_capture(small_design(), tmp_path / "run")
    capture._parse_file(f, plane_jobs=2)  # no pool: threads

    with pytest.raises(PoolUsed):  # so the line above could have failed
        capture._parse_file(f, plane_jobs=capture.PARALLEL_PLANES_MIN_JOBS)


def test_two_jobs_parse_the_planes_in_two_threads(tmp_path, monkeypatch, always_parallel):
    import threading

    seen = set()
    job = capture._plane_job

    def recording(args):
        seen.add(threading.get_ident())
        return job(args)

    monkeypatch.setattr(capture, "_plane_job", recording)
    f = write_capture(small_design(n_chips=4), tmp_path / "run")
    host = capture._parse_file(f, plane_jobs=2)
    assert threading.get_ident() not in seen and 1 <= len(seen) <= capture.PLANE_THREADS
    assert host.events["device"].nunique() == 4
    seen.clear()
    capture._parse_file(f, plane_jobs=1)
    assert seen == {threading.get_ident()}  # one job: this thread, plane by plane
