"""The measured-memory views: the allocator timeline and live bytes by source line, in the terminal and JSON."""

from __future__ import annotations

import io
import json

import pytest

from tests.memory_captures import played_capture
from tpudiag.analysis.live_buffers import attribute
from tpudiag.analysis.memory_timeline import XPROF_MAX_SNAPSHOTS, capture_memory_timelines
from tpudiag.model.live_buffers import BufferSample, DeviceMemoryProfile, SourceFrame, StackLocation
from tpudiag.render.console import SafeConsole
from tpudiag.render.memory_runtime import (live_bytes_to_dict, render_live_bytes_terminal, render_timelines_terminal,
                                           sparkline, timelines_to_dict)
from tpudiag.writers.allocator_trace import TracedAllocator, write_allocator_line
from tpudiag.writers.xspace_builder import XSpaceBuilder


def _text(render, *args, **kw) -> str:
    buf = io.StringIO()
    render(*args, SafeConsole(file=buf, width=200, no_color=True), **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def played_hosts(tmp_path_factory):
    path = played_capture(tmp_path_factory.mktemp("played") / "host0.xplane.pb")
    hosts, failures = capture_memory_timelines(path)
    assert failures == []
    return hosts


def test_terminal_names_each_memory_space_its_peak_and_what_is_live_there(played_hosts):
    out = _text(render_timelines_terminal, played_hosts, top=3)
    assert "TPU_0_bfc" in out and "TPU_1_bfc" in out
    assert "Live at the peak of TPU_0_bfc" in out
    assert "more (`--top`" in out  # 3 rows of many, and it says how to see the rest
    assert "allocated before the capture" in _text(render_timelines_terminal, played_hosts, top=100)


def test_json_keeps_every_allocator_with_a_sampled_timeline_that_holds_the_peak(played_hosts):
    doc = json.loads(json.dumps(timelines_to_dict(played_hosts, XPROF_MAX_SNAPSHOTS)))
    (host,) = doc
    hbm = next(a for a in host["allocators"] if a["allocator"] == "TPU_0_bfc")
    assert hbm["events"] == 1500 and len(hbm["timeline"]) == XPROF_MAX_SNAPSHOTS
    assert max(b for _, b in hbm["timeline"]) == hbm["peak_bytes"]
    assert sum(r["total_bytes"] for r in hbm["at_peak"]) == hbm["peak_bytes"]
    assert set(hbm) >= {"peak_time_ps", "capacity_bytes", "lifetime_peak_bytes", "peak_step", "fragmentation_at_peak"}


def test_sparkline_peaks_where_the_timeline_does(played_hosts):
    hbm = played_hosts[0].allocators[0]
    line = sparkline(hbm.timeline, 16)
    assert len(line) == 16 and "█" in line


def test_names_from_a_trace_print_escaped(tmp_path):
    alloc = TracedAllocator("HBM\x1b[31m", 1 << 30)
    alloc.allocate(1000, 4096, op="evil\x1b]8;;x\x07op")
    space = XSpaceBuilder("h")
    write_allocator_line(space.plane("/host:CPU", 1), "t", 1, 0, alloc.records)
    hosts, _ = capture_memory_timelines(space.write(tmp_path / "h.xplane.pb"))
    out = _text(render_timelines_terminal, hosts)
    assert "\x1b" not in out and "\\x1b" in out


def test_live_bytes_terminal_and_json():
    stack = (StackLocation((SourceFrame("_pjit", "/venv/lib/python3.11/site-packages/jax/_src/pjit.py", 10),)),
             StackLocation((SourceFrame("step", "train.py", 42),)))
    prof = DeviceMemoryProfile("m.prof", (
        BufferSample("buffer", "tpu:0", 2, 3 << 20, stack),
        BufferSample("buffer", "tpu:1", 2, 3 << 20, stack),
        BufferSample("buffer", "tpu:1", 1, 1 << 10, stack[:1]),  # made inside JAX alone
        BufferSample("executable", "", 1, 0, stack),
    ))
    live = attribute(prof)
    out = _text(render_live_bytes_terminal, live)
    assert "train.py:42" in out and "(inside JAX)" in out and "6 MiB" in out
    doc = live_bytes_to_dict(live)
    assert doc["by_line"][0] == {"file": "train.py", "line": 42, "function": "step", "buffers": 4,
                                 "bytes": 6 << 20, "devices": 2, "internal": False}
    assert doc["by_line"][1]["internal"] is True
    assert doc["executables"] == 1 and doc["total_bytes"] == (6 << 20) + 1024
    assert [d["device"] for d in doc["devices"]] == ["tpu:0", "tpu:1"]
