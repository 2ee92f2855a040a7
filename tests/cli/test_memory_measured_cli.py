"""`tpudiag memory` on what was measured: a capture whose allocator was traced, and `--pprof FILE`.

Bad input is one line on stderr naming the file, exit 2; the compiled view's JSON keys stay.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_util import run_tpudiag
from tests.memory_captures import played_capture, pprof_bytes
from tpudiag.analysis.memory_timeline import capture_memory_timelines


def run(*args: str) -> subprocess.CompletedProcess:
    return run_tpudiag("memory", *args, env={"NO_COLOR": "1", "COLUMNS": "140"})


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


def test_each_host_file_is_read_once_for_the_diagnosis_and_the_allocator_timeline(logdir, monkeypatch):
    """`tpudiag memory PATH` reads the allocator's events in the diagnosis's own pass over each host
    file (issue 32: it read every host file a second time). Every read of a file goes through
    `os.open` (`parsers.input_files.read_input_bytes`): the host file is opened once."""
    from typer.testing import CliRunner

    from tpudiag.cli.app import app

    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    result = CliRunner().invoke(app, ["memory", str(logdir), "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [host] = json.loads(result.stdout)["memory_over_time"]
    assert {a["allocator"] for a in host["allocators"]} == {"TPU_0_bfc", "TPU_1_bfc"}  # read in that one pass
    assert [p for p in opened if p.endswith(".xplane.pb")] == [host["path"]]


def test_two_hosts_parsed_in_processes_bring_their_allocator_timelines_back(tmp_path):
    """In pool processes the allocator timeline travels back with each host's digest, and is what a
    separate read of the files gives (`capture_memory_timelines`, the reader alone)."""
    import tpudiag

    run_dir = tmp_path / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    for host in ("host0", "host1"):
        played_capture(run_dir / f"{host}.xplane.pb")
    d = tpudiag.diagnose(tmp_path / "logdir", jobs=2, memory_timeline=True)
    together, failures = d.memory_timelines()
    alone, _ = capture_memory_timelines(tmp_path / "logdir", jobs=1)
    assert failures == [] and len(together) == 2
    assert sorted((t.path, a.allocator, a.peak_bytes) for t in together for a in t.allocators) == \
        sorted((t.path, a.allocator, a.peak_bytes) for t in alone for a in t.allocators)


def test_a_host_file_that_cannot_be_read_is_a_measured_failure_and_the_others_go_on(tmp_path):
    """A corrupt host file beside a good one: the good one's timeline, the bad one named in
    `measured_failures` and on stderr, as a separate read of the files says (it was missing from both)."""
    run_dir = tmp_path / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    played_capture(run_dir / "host0.xplane.pb")
    (run_dir / "host1.xplane.pb").write_bytes(b"\xff" * 64)
    out = run(str(tmp_path / "logdir"), "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    bad = str(run_dir / "host1.xplane.pb")
    assert [f["path"] for f in doc["measured_failures"]] == [bad]
    assert [h["path"] for h in doc["memory_over_time"]] == [str(run_dir / "host0.xplane.pb")]
    assert f"warning: `{bad}`" in out.stderr
    _, alone = capture_memory_timelines(tmp_path / "logdir", jobs=1)
    assert [f.path for f in alone] == [bad]
