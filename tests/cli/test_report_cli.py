"""The `tpudiag report` command as a user runs it: exit codes, stdout vs stderr, JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli_util import run_tpudiag
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "captures" / "train_v6e_4chip"
CPU_EXAMPLE = REPO / "examples" / "captures" / "cpu_jax_profiler"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_tpudiag(*args, env=env)


def run_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m tpudiag ARGS` in a process of its own: the entry point itself, its stderr, a real pipe."""
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True, timeout=300)


def test_report_on_the_bundled_example_by_default():
    proc = run_process("report")
    assert proc.returncode == 0, proc.stderr
    assert "Top ops by self time" in proc.stdout
    assert "Step breakdown" in proc.stdout
    assert proc.stderr == ""


def test_json_contract_keys():
    proc = run("report", str(EXAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    s = doc["summary"]
    assert s["device_type"] == "TPU v6 Lite"
    assert s["hosts"] == ["host0"]
    assert isinstance(s["step_time_ps"], float) and s["step_time_ps"] > 0
    op = doc["ops"][0]
    for key in ("host", "program", "name", "category", "occurrences", "total_time_ps", "self_time_ps", "flops",
                "bytes_accessed"):
        assert key in op, key
    assert isinstance(doc["findings"], list)
    assert isinstance(doc["warnings"], list)
    assert doc["ops"] == sorted(doc["ops"], key=lambda o: -o["self_time_ps"])


def test_bad_input_is_one_line_exit_2_no_traceback(mangled_capture):
    proc = run("report", str(mangled_capture))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: `") and str(mangled_capture) in lines[0] and "corrupt" in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_path_exit_2(tmp_path):
    proc = run("report", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr


def test_directory_without_trace_exit_2_with_hint(tmp_path):
    proc = run("report", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].startswith("error: ")
    assert proc.stderr.splitlines()[1].startswith("hint: ")


def test_usage_error_exit_2():
    proc = run("report", "--format", "yaml")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_cpu_only_capture_says_so_plainly(tmp_path):
    from tests.conftest import host_only_capture

    proc = run("report", str(host_only_capture(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "no TPU or GPU device plane" in proc.stdout


def test_a_cpu_run_reads_its_xla_cpu_ops_as_a_device():
    # The CPU example ran one jitted op (`ynn_fusion`, 3 times) on XLA's CPU threads
    proc = run("report", str(CPU_EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert "Device: CPU (XLA's CPU runtime)" in proc.stdout and "ynn_fusion" in proc.stdout
    assert "no TPU or GPU device plane" not in proc.stdout


def test_no_color_means_no_escape_codes():
    proc = run("report", str(EXAMPLE), env={"NO_COLOR": "1", "FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert proc.returncode == 0
    assert "\x1b[" not in proc.stdout


def test_piped_output_has_no_escape_codes_or_spinner():
    proc = run_process("report", str(EXAMPLE))
    assert "\x1b[" not in proc.stdout and "\x1b[" not in proc.stderr


def test_bad_host_is_reported_and_the_others_analysed(tmp_path, mangled_capture):
    good = next((EXAMPLE / "plugins" / "profile").glob("*/host0.xplane.pb"))
    (tmp_path / "host0.xplane.pb").write_bytes(good.read_bytes())
    (tmp_path / "host1.xplane.pb").write_bytes(mangled_capture.read_bytes())
    proc = run("report", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["hosts"] == ["host0"]
    assert len(doc["failed_hosts"]) == 1 and "host1.xplane.pb" in doc["failed_hosts"][0]


def test_report_never_writes_into_the_trace_directory(tmp_path):
    import shutil

    copy = tmp_path / "cap"
    shutil.copytree(EXAMPLE, copy)
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    assert run("report", str(copy)).returncode == 0
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before


@pytest.mark.parametrize("args", [("--help",), ("report", "--help")])
def test_help(args):
    proc = run(*args)
    assert proc.returncode == 0 and "Usage" in proc.stdout


def test_bundled_example_joins_its_own_dumps_so_every_rule_runs():
    proc = run("report", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["modelled"] is True
    assert len(doc["summary"]["dumps"]) == 1 and "transformer_train_v5e" in doc["summary"]["dumps"][0]
    assert doc["rules_skipped"] == []
    assert {f["rule"] for f in doc["findings"]} >= {"exposed-collective", "spill"}


def test_version_prints_the_package_version_and_exits_0():
    from tpudiag.version import __version__

    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"tpudiag {__version__}\n"
    assert proc.stderr == ""


def test_one_name_for_one_thing_across_json_frames_and_objects():
    """A finding's saving is `saving_*` in the JSON and in `findings_frame()` (as `Finding.saving`),
    op columns are the same in `ops_frame()` and the JSON; the old `savings_*` keys are aliases."""
    import tpudiag
    from tpudiag.render.json_format import report_to_dict

    d = tpudiag.diagnose(EXAMPLE)
    doc = report_to_dict(d.report)
    assert doc["findings"], "the example has findings"
    frame = d.findings_frame()
    for finding, row, json_row in zip(d.findings, frame.itertuples(index=False), doc["findings"]):
        assert row.saving_ps == json_row["saving_ps"] == json_row["savings_ps"] == finding.saving.ps
        assert row.saving_basis == json_row["saving_basis"] == json_row["savings_basis"] == finding.saving.basis
        assert json_row["saving_explanation"] == json_row["savings_explanation"] == finding.saving.explanation
    shared = set(frame.columns) - {"ops", "sites"}  # the frame joins these into strings, the JSON keeps lists
    assert shared <= set(doc["findings"][0]), shared - set(doc["findings"][0])
    assert list(d.ops_frame().columns) == list(doc["ops"][0])
    s = d.report.summary
    assert (doc["summary"]["peak_flops_per_s"], doc["summary"]["hbm_bytes_per_s"]) == \
        (s.peak_flops_per_s, s.hbm_bytes_per_s) == \
        (doc["summary"]["peak_flops_per_s_per_core"], doc["summary"]["hbm_bytes_per_s_per_core"])
