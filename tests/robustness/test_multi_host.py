"""Several hosts where some are broken, duplicated or host-only: the good ones are still analysed.

Through the CLI (in-process, `tests/cli_util.py`), its hosts read in worker processes as a real run
reads them (issue 13: a `²` value in one host gave an 86-line remote traceback and lost the good
host; duplicate hostnames and a CPU-only host beside TPU hosts gave "Steps: none found").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli_util import run_tpudiag
from tests.conftest import REPO, small_design
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import build_capture, write_capture

CPU_EXAMPLE = REPO / "examples" / "captures" / "cpu_jax_profiler"
SUPERSCRIPT_TWO = "\u00b2"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`tpudiag ARGS` in-process; with `--jobs 2` its hosts are still read in worker processes."""
    return run_tpudiag(*args, env={"NO_COLOR": "1"})


def write_superscript_host(run: Path, hostname: str) -> Path:
    """A host whose step names and ids are `²`-like strings and whose Steps events lack group_id."""
    space = build_capture(small_design(hostname=hostname, n_steps=3))
    for plane in space.proto.planes:
        if not plane.name.startswith("/device:TPU:"):
            continue
        ids = {md.name: k for k, md in plane.stat_metadata.items()}
        for md in plane.event_metadata.values():
            for st in md.stats:
                if st.metadata_id in (ids["program_id"], ids["symbol_id"]):
                    st.str_value = SUPERSCRIPT_TWO
        steps = next(ln for ln in plane.lines if ln.name == "Steps")
        for ev in steps.events:
            plane.event_metadata[ev.metadata_id].name = SUPERSCRIPT_TWO
            kept = [st for st in ev.stats if st.metadata_id != ids["group_id"]]
            del ev.stats[:]
            ev.stats.extend(kept)
    path = run / f"{hostname}.xplane.pb"
    run.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.proto.SerializeToString())
    return path


def test_superscript_host_beside_good_host_both_analysed_no_traceback(tmp_path):
    run = tmp_path / "run"
    write_capture(small_design(hostname="good", n_steps=3), run)
    write_superscript_host(run, "odd")
    proc = run_cli("report", str(run), "--format", "json", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["hosts"] == ["good", "odd"]
    assert doc["summary"]["step_time_ps"] > 0
    assert any(w.startswith("odd: ") and "program_id" in w for w in doc["warnings"]), doc["warnings"]


def test_hostile_host_in_a_pool_is_one_line_and_the_others_are_analysed(tmp_path):
    run = tmp_path / "run"
    write_capture(small_design(hostname="good", n_steps=3), run)
    write_superscript_host(run, "odd")
    (run / "zero.xplane.pb").symlink_to("/dev/zero")
    (run / "empty.xplane.pb").write_bytes(b"")
    proc = run_cli("report", str(run), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    section = proc.stdout.split("Host files not analysed", 1)[1].split("\n\n", 1)[0].strip()
    # One entry per failed host, naming file and cause. Output that is not a terminal is 140 columns
    # wide, so a long tmp path (pytest-xdist's popen-gwN) wraps an entry: count entries, not lines.
    entries = [e for e in " ".join(section.split()).split("`/") if e]
    assert len(entries) == 2, section
    assert any("zero.xplane.pb" in e and "character device" in e for e in entries)
    assert any("empty.xplane.pb" in e and "empty file" in e for e in entries)


def test_every_host_broken_is_exit_2_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.xplane.pb").symlink_to("/dev/zero")
    (run / "b.xplane.pb").write_bytes(b"\x0a\xff\xff")
    proc = run_cli("report", str(run), "--jobs", "2")
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "none of the 2 host files could be read" in line


def test_duplicate_hostnames_are_keyed_by_file(tmp_path):
    run = tmp_path / "run"
    write_capture(small_design(hostname="host0", n_steps=3), run)
    # The same hostname in a second file (a capture copied under another name), slower steps.
    space = build_capture(small_design(hostname="host0", n_steps=3, step_ps=12_000 * 1_000_000))
    space.write(run / "copy.xplane.pb")
    profile = load_capture(run, jobs=1)
    names = sorted(h.host for h in profile.hosts)
    assert names == ["host0 (copy)", "host0 (host0)"]
    assert all(set(h.events["host"].unique()) == {h.host} for h in profile.hosts)
    assert any("appears in 2 files" in w for w in profile.warnings)
    proc = run_cli("report", str(run), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["step_time_ps"] >= 12_000 * 1_000_000  # the slower copy's step counts


def test_distinct_hostnames_are_not_renamed(tmp_path):
    run = tmp_path / "run"
    write_capture(small_design(hostname="a", n_steps=2), run)
    write_capture(small_design(hostname="b", n_steps=2), run)
    profile = load_capture(run, jobs=1)
    assert sorted(h.host for h in profile.hosts) == ["a", "b"] and profile.warnings == []


def test_cpu_only_host_beside_tpu_host_is_set_aside(tmp_path):
    run = tmp_path / "run"
    write_capture(small_design(hostname="tpu0", n_steps=3), run)
    cpu_file = next(CPU_EXAMPLE.rglob("*.xplane.pb"))
    (run / "cpu0.xplane.pb").write_bytes(cpu_file.read_bytes())
    proc = run_cli("report", str(run), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["hosts"] == ["tpu0"]
    assert doc["summary"]["step_time_ps"] > 0
    [failed] = doc["failed_hosts"]
    assert "cpu0.xplane.pb" in failed and "no device plane" in failed


def test_cpu_only_capture_alone_is_still_analysed(tmp_path):
    profile = load_capture(CPU_EXAMPLE, jobs=1)
    assert [h.device.platform for h in profile.hosts] == ["CPU"] and profile.failures == []
