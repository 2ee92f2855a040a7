"""A single host file parsed ahead in a thread (`parsers.read_ahead`) is the host a plain parse
gives, taken once; a file changed since, or one nothing was started for, is parsed where asked."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from tests.conftest import small_design
from tpudiag.model.profile import HostFailure, HostTrace
from tpudiag.parsers import capture, read_ahead
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


def test_nothing_is_started_for_one_job_a_directory_or_another_file(host_file, tmp_path):
    assert not read_ahead.start(host_file, 1)
    assert not read_ahead.start(host_file.parent, 2)
    other = tmp_path / "module.hlo.txt"
    other.write_text("HloModule m\n")
    assert not read_ahead.start(other, 2)
    assert not read_ahead.start(tmp_path / "missing.xplane.pb", 2)
    assert read_ahead.take(host_file) is None and read_ahead.take("gs://bucket/h.xplane.pb") is None
