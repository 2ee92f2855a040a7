"""Hostile files among the inputs: FIFOs, device links, oversized files, decompression bombs.

Each case once hung `report` forever or ran out of memory (issue 13). Every test that could hang
on a regression runs the code in a subprocess with a timeout, so a regression fails instead.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED, small_design
from tpudiag.errors import InputError
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.input_files import ReadLimits, inflate_bounded, read_input_bytes
from tpudiag.writers.tpu_design import write_capture

LLO_FIXTURE = REPO / "tests" / "fixtures" / "llo" / "v5e_mlp"
HLO_FIXTURE = REPO / "tests" / "fixtures" / "dumps" / "v5e_mlp_train"
MANGLED = SHARED / "data" / "bad-inputs" / "tpu-v6e-inference-mangled.xplane.pb"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")


def run_python(code: str, timeout_s: float = 60, mem_bytes: int | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter; a hang fails the test through the timeout.

    The memory cap is set by the child itself: a `preexec_fn` would make subprocess fork this
    (multithreaded, JAX-importing) test process.
    """
    code = textwrap.dedent(code)
    if mem_bytes is not None:
        code = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({mem_bytes}, {mem_bytes}))\n" + code
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def good_run(tmp_path: Path) -> Path:
    """A run directory with one good host, `host0`."""
    run = tmp_path / "run"
    write_capture(small_design(n_steps=2), run)
    return run


# -- a FIFO or a device named like a trace, inside a run directory ---------------------------------

@needs_fifo
def test_fifo_host_file_is_a_per_host_failure_not_a_hang(tmp_path):
    run = good_run(tmp_path)
    os.mkfifo(run / "host1.xplane.pb")  # nobody ever writes to it: an open() for reading blocks
    proc = run_cli("report", str(run), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert '"hosts": [\n      "host0"\n    ]' in proc.stdout or '"host0"' in proc.stdout
    assert "host1.xplane.pb" in proc.stdout and "FIFO" in proc.stdout


def test_dev_zero_link_host_file_is_a_per_host_failure(tmp_path):
    run = good_run(tmp_path)
    (run / "host1.xplane.pb").symlink_to("/dev/zero")  # endless zeros: read() would never stop
    profile = load_capture(run, jobs=1)
    assert [h.host for h in profile.hosts] == ["host0"]
    [failure] = profile.failures
    assert "host1.xplane.pb" in failure.message and "character device, not a regular file" in failure.message


@needs_fifo
@pytest.mark.parametrize("command", [["report", "--format", "json"], ["check", "--format", "json"]])
def test_fifo_and_dev_zero_in_a_run_dir_through_the_cli_in_bounded_time_and_memory(tmp_path, command):
    """Both hostile files at once, through `report` and `check` end to end: within 60 s and a 2 GiB
    address-space cap (each once hung forever or reached MemoryError at 3.9 GB)."""
    run = good_run(tmp_path)
    os.mkfifo(run / "host1.xplane.pb")
    (run / "host2.xplane.pb").symlink_to("/dev/zero")
    proc = run_python(f"""
        import sys
        from tpudiag.cli.app import main
        main({[*command[:1], str(run), *command[1:]]!r})
    """, timeout_s=60, mem_bytes=2 << 30)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    if command[0] == "report":
        assert doc["summary"]["hosts"] == ["host0"]  # the good host is still analysed
        failures = " ".join(doc["failed_hosts"])
    else:
        failures = " ".join(doc["warnings"])  # check carries report's unread host files as warnings
    assert "host1.xplane.pb" in failures and "FIFO" in failures
    assert "host2.xplane.pb" in failures and "character device" in failures


def test_only_hostile_files_is_one_clean_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "host0.xplane.pb").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="not a regular file"):
        load_capture(run, jobs=1)


@needs_fifo
def test_fifo_in_llo_dump_is_a_warning_not_a_hang(tmp_path):
    dump = tmp_path / "llo"
    shutil.copytree(LLO_FIXTURE, dump)
    victim = sorted(dump.glob("*-final_bundles.txt"))[0]
    victim.unlink()
    os.mkfifo(victim)
    proc = run_python(f"""
        from tpudiag.parsers.llo.load import load_llo_dump
        d = load_llo_dump({str(dump)!r})
        print("\\n".join(d.warnings))
    """)
    assert proc.returncode == 0, proc.stderr
    assert f"`{victim.name}`: a FIFO (named pipe), not a regular file" in proc.stdout


@needs_fifo
def test_fifo_and_device_in_hlo_dump_are_skipped_with_warnings(tmp_path):
    dump = tmp_path / "xla"
    shutil.copytree(HLO_FIXTURE, dump)
    hlo = next(dump.glob("*after_optimizations.txt"))
    # A second "module" that is a FIFO, and a side file that is a device: neither may block.
    os.mkfifo(dump / "module_0001.jit_evil.cl_1.after_optimizations.txt")
    side = Path(str(hlo).removesuffix(".txt") + "-memory-usage-report.txt")
    side.unlink()
    side.symlink_to("/dev/zero")
    proc = run_python(f"""
        from tpudiag.parsers.hlo_text import load_hlo_dump
        d = load_hlo_dump({str(dump)!r})
        print(len(d.programs))
        print("\\n".join(d.warnings + [w for p in d.programs for w in p.warnings]))
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "1"
    assert any("jit_evil" in w and "FIFO" in w for w in lines[1:]), lines
    assert any("memory-usage report" in w and "character device" in w for w in lines[1:]), lines


# -- bounded reads --------------------------------------------------------------------------------

def test_file_over_the_size_cap_names_file_and_cap(tmp_path):
    f = tmp_path / "big.xplane.pb"
    f.write_bytes(b"\x0a" * 4096)
    with pytest.raises(InputError) as info:
        read_input_bytes(f, ReadLimits(max_file_bytes=1024))
    line = info.value.one_line()
    assert str(f) in line and "4,096 bytes" in line and "1,024 bytes input size cap" in line
    assert "TPUDIAG_MAX_INPUT_MB" in info.value.hint


def test_size_cap_from_the_environment(tmp_path, monkeypatch):
    run = good_run(tmp_path)
    monkeypatch.setenv("TPUDIAG_MAX_INPUT_MB", "0")
    with pytest.raises(InputError, match="not a positive whole number"):
        load_capture(run, jobs=1)
    monkeypatch.setenv("TPUDIAG_MAX_INPUT_MB", "1")
    big = run / "host0.xplane.pb"
    big.write_bytes(big.read_bytes() + b"\x12\x00" * (1 << 20))  # pad past 1 MiB with empty hostnames
    with pytest.raises(InputError, match="over the 1 MiB input size cap"):
        load_capture(run, jobs=1)


def test_limited_read_of_a_device_is_refused():
    with pytest.raises(InputError, match="character device"):
        read_input_bytes("/dev/zero", limit=10)


def test_inflate_bounded_near_miss_and_damage():
    payload = b"x" * 1000
    assert inflate_bounded(gzip.compress(payload), max_bytes=1000) == payload  # exactly at the cap
    with pytest.raises(InputError, match="inflates beyond the 999 bytes cap"):
        inflate_bounded(gzip.compress(payload), max_bytes=999)
    assert inflate_bounded(gzip.compress(payload)[:-12], max_bytes=10_000) is None  # truncated
    assert inflate_bounded(b"not gzip at all", max_bytes=10_000) is None


def test_decompression_bomb_stat_is_refused_fast_in_small_memory(tmp_path):
    """A ~1 MB capture whose op carries a gzip stat value of 1 GiB of zeros (was: 3 min, 7.4 GB)."""
    bomb_dir = tmp_path / "run"
    proc = run_python(f"""
        import zlib
        from pathlib import Path
        from tests.conftest import small_design
        from tpudiag.writers.tpu_design import build_capture
        space = build_capture(small_design(n_steps=1, hostname="bomb"))
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = bytes(1 << 24)
        bomb = b"".join(c.compress(chunk) for _ in range(64)) + c.flush()  # 1 GiB inflated
        plane = space.proto.planes[0]
        sid = max(plane.stat_metadata) + 1
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = "tf_op"
        md = next(iter(plane.event_metadata.values()))
        md.stats.add(metadata_id=sid).compressed_str_value = bomb
        out = Path({str(bomb_dir)!r}); out.mkdir()
        (out / "bomb.xplane.pb").write_bytes(space.proto.SerializeToString())
        print(len(bomb))
    """, timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 2_000_000
    write_capture(small_design(n_steps=2), bomb_dir)  # a good host beside it
    proc = run_python(f"""
        from pathlib import Path
        from tpudiag.parsers.capture import load_capture
        p = load_capture(Path({str(bomb_dir)!r}), jobs=1)
        print(sorted(h.host for h in p.hosts)); print(next(w for h in p.hosts for w in h.warnings if "TPU:0" in w))
    """, timeout_s=60, mem_bytes=2 << 30)
    assert proc.returncode == 0, proc.stderr
    hosts, message = proc.stdout.splitlines()
    # The bomb's plane is skipped with a warning naming it; the bomb host's other core is still read.
    assert hosts == "['bomb', 'host0']"
    assert "`/device:TPU:0`" in message and "inflates beyond the 64 MiB cap" in message


@needs_fifo
def test_fifos_in_dumps_given_with_a_capture_are_report_warnings(tmp_path):
    """`report RUN --dumps XLA --dumps LLO` with a FIFO in each dump: no hang, and what was skipped is
    in the report's warnings (reading the dumps set it aside; the report used to drop it silently)."""
    run = good_run(tmp_path)
    xla, llo = tmp_path / "xla", tmp_path / "llo"
    shutil.copytree(HLO_FIXTURE, xla)
    shutil.copytree(LLO_FIXTURE, llo)
    os.mkfifo(xla / "module_0001.jit_evil.cl_1.after_optimizations.txt")
    victim = sorted(llo.glob("*-final_bundles.txt"))[0]
    victim.unlink()
    os.mkfifo(victim)
    proc = run_cli("report", str(run), "--dumps", str(xla), "--dumps", str(llo), "--format", "json", timeout_s=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    assert any("jit_evil" in w and "FIFO" in w for w in warnings), warnings
    assert any(victim.name in w and "FIFO" in w for w in warnings), warnings


# -- the shared mangled capture -----------------------------------------------------------------

@pytest.mark.skipif(not MANGLED.is_file(), reason="../shared/data/bad-inputs is absent (a clone without shared/)")
def test_shared_mangled_capture_is_a_clean_error():
    proc = run_cli("report", str(MANGLED))
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: `") and str(MANGLED) in line and "Traceback" not in proc.stderr
