"""`tpudiag memory` on what was measured: a capture whose allocator was traced, and `--pprof FILE`.

Bad input is one line on stderr naming the file, exit 2; the compiled view's JSON keys stay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.memory_captures import played_capture, pprof_bytes
from tpudiag.analysis.memory_timeline import capture_memory_timelines


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpudiag", "memory", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "140"})


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("measured") / "logdir"
    played_capture(root / "plugins" / "profile" / "2026_01_01_00_00_00" / "host0.xplane.pb")
    return root


def test_a_capture_shows_each_memory_space_and_the_live_set_at_the_peak(logdir):
    out = run(str(logdir), "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "Memory over time" in out.stdout and "TPU_0_bfc" in out.stdout and "TPU_1_bfc" in out.stdout
    assert "Live at the peak of TPU_0_bfc" in out.stdout


def test_json_has_the_measured_keys_beside_the_compiled_ones(logdir):
    out = run(str(logdir), "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {"input", "programs", "errors", "warnings", "memory_over_time", "live_buffers"} <= set(doc)
    [host] = doc["memory_over_time"]
    ours = {a.allocator: a for a in capture_memory_timelines(logdir)[0][0].allocators}
    assert {a["allocator"]: a["peak_bytes"] for a in host["allocators"]} == {k: v.peak_bytes for k, v in ours.items()}
    assert doc["live_buffers"] is None


def test_pprof_alone_shows_live_bytes_by_line_and_nothing_compiled(tmp_path):
    prof = tmp_path / "memory.prof"
    prof.write_bytes(pprof_bytes(values=(3, 3 << 20)))
    out = run("--pprof", str(prof))
    assert out.returncode == 0, out.stderr
    assert "model.py:7" in out.stdout and "3 MiB" in out.stdout
    assert "tpudiag memory" not in out.stdout  # the bundled example's compiled view is not shown
    doc = json.loads(run("--pprof", str(prof), "--format", "json").stdout)
    assert doc["programs"] == [] and doc["memory_over_time"] == []
    assert doc["live_buffers"]["by_line"][0] == {"file": "model.py", "line": 7, "function": "f", "buffers": 3,
                                                 "bytes": 3 << 20, "devices": 1, "internal": False}


@pytest.mark.parametrize("content, cause", [(b"", "empty file"), (b"\x1f\x8b\x08junk", "damaged gzip"),
                                            (None, "no such file")])
def test_a_bad_pprof_is_one_line_naming_it(tmp_path, content, cause):
    prof = tmp_path / "bad.prof"
    if content is not None:
        prof.write_bytes(content)
    out = run("--pprof", str(prof))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) <= 2 and str(prof) in lines[0] and cause in lines[0]  # a `hint:` line may follow
    assert "Traceback" not in out.stderr


def test_output_inside_the_capture_is_refused(logdir):
    out = run(str(logdir), "-o", str(logdir / "memory.txt"))
    assert out.returncode == 2 and not (logdir / "memory.txt").exists()
