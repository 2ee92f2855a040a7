"""The /host:CPU plane's TraceMe spans come back on the device time origin, by thread and name."""

from __future__ import annotations

from pathlib import Path

from tests.rules import scenarios as sc
from tpudiag.parsers.capture import load_capture


def test_host_spans_round_trip_with_device_times(tmp_path: Path):
    host = load_capture(sc.write_run(sc.decode_v6e(line_timestamp_ns=1_700_000_000_000_000_000), tmp_path),
                        jobs=1).hosts[0]
    hev = host.host_events
    assert set(hev["thread"].astype(str)) == {"main/1"}
    assert set(hev["name"].astype(str)) == {"$generate.py:88 sample_next", "PjitFunction(decode_step)"}
    assert len(hev) == 2 * 10
    # The first dispatch span starts where the first execution's ops end (epoch timestamps subtracted).
    first = hev[hev["name"] == "PjitFunction(decode_step)"]["start_ps"].min()
    ev = host.events
    assert first == ev["start_ps"].min() + sc.DECODE_BUSY + sc.DECODE_GAP // 2


def test_a_capture_without_host_spans_has_an_empty_table(tmp_path: Path):
    host = load_capture(sc.write_run(sc.healthy(), tmp_path), jobs=1).hosts[0]
    assert host.host_events is not None and host.host_events.empty
