"""A single host file parsed ahead in a thread (`parsers.read_ahead`) is the host a plain parse
gives, taken once; a file changed since, or one nothing was started for, is parsed where asked.
The host file of a run directory or logdir of one host is found as `load_capture` finds it, and
the thread reads and decodes without pandas (imported only to build the tables)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO, small_design
from tpudiag.model.profile import HostFailure, HostTrace
from tpudiag.parsers import capture, capture_files, read_ahead
from tpudiag.writers.tpu_design import write_capture


@pytest.fixture
def host_file(tmp_path):
    return write_capture(small_design(n_chips=2), tmp_path / "run")


def test_the_host_parsed_ahead_equals_a_plain_parse_and_is_taken_once(host_file):
    assert read_ahead.start(host_file, 2)
    ahead = read_ahead.take(host_file)
    plain = capture.parse_file_or_failure(host_file)
    assert isinstance(ahead, HostTrace)
    pd.testing.assert_frame_equal(ahead.events, plain.events)
    pd.testing.assert_frame_equal(ahead.op_metadata, plain.op_metadata)
    assert ahead.warnings == plain.warnings and ahead.host == plain.host
    assert read_ahead.take(host_file) is None  # taken once


def test_a_damaged_file_ahead_is_the_hosts_failure_as_in_a_plain_parse(host_file):
    host_file.write_bytes(host_file.read_bytes()[:-9])
    assert read_ahead.start(str(host_file), 2)
    ahead = read_ahead.take(str(host_file))
    plain = capture.parse_file_or_failure(host_file)
    assert isinstance(ahead, HostFailure) and isinstance(plain, HostFailure)
    assert ahead.message == plain.message


def test_a_file_changed_after_the_start_is_not_taken(host_file):
    assert read_ahead.start(host_file, 2)
    stat = host_file.stat()
    os.utime(host_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert read_ahead.take(host_file) is None


def test_a_run_directory_or_logdir_of_one_host_reads_its_file_ahead(host_file, tmp_path):
    logdir = tmp_path / "logdir"
    run = logdir / "plugins" / "profile" / "2026_12_02"
    run.mkdir(parents=True)
    shutil.copy(host_file, run / host_file.name)
    for path in (host_file.parent, logdir):
        file = capture_files.find_capture(path).files[0]
        assert read_ahead.single_host_file(path) == file
        assert read_ahead.start(path, 2)
        ahead = read_ahead.take(file)
        assert isinstance(ahead, HostTrace)
        pd.testing.assert_frame_equal(ahead.events, capture.parse_file_or_failure(file).events)


def test_several_hosts_are_not_read_ahead(host_file):
    shutil.copy(host_file, host_file.parent / "other.xplane.pb")
    assert read_ahead.single_host_file(host_file.parent) is None
    assert not read_ahead.start(host_file.parent, 2)


def test_the_read_ahead_imports_no_numpy_and_the_parse_no_pandas():
    probe = ("import json, sys\n"
             "import tpudiag.parsers.read_ahead\n"
             "first = sorted(m for m in ('numpy', 'pandas') if m in sys.modules)\n"
             "import tpudiag.parsers.capture\n"
             "print(json.dumps([first, 'pandas' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], False], out.stderr[-2000:]


def test_nothing_is_started_for_one_job_a_missing_path_or_another_file(host_file, tmp_path):
    assert not read_ahead.start(host_file, 1)
    assert not read_ahead.start(host_file.parent, 1)
    other = tmp_path / "module.hlo.txt"
    other.write_text("HloModule m\n")
    assert not read_ahead.start(other, 2)
    assert not read_ahead.start(tmp_path / "missing.xplane.pb", 2)
    assert read_ahead.take(host_file) is None and read_ahead.take("gs://bucket/h.xplane.pb") is None
