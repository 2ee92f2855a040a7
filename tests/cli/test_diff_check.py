"""`tpudiag diff` and `tpudiag check` as a user runs them: outputs, snapshots and exit codes 0/1/2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.analysis.diff_designs import design, write
from tests.cli_util import run_tpudiag
from tests.conftest import REPO
from tests.snapshot_util import assert_snapshot, normalise

EXAMPLE = REPO / "examples" / "captures" / "train_v6e_4chip"


def run(*args: str) -> subprocess.CompletedProcess:
    return run_tpudiag(*args, env={"NO_COLOR": "1"})


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("captures")
    return {
        "root": root,
        "base": write(root, "base", design(seed=1)),
        "noise": write(root, "noise", design(seed=2)),  # ±1 % jitter only
        "slow": write(root, "slow", design(seed=3, scale={"fusion.1": 1.2})),  # matmul 20 % slower
    }


# ---------------------------------------------------------------------------------------------
# diff


def test_diff_of_the_example_with_itself_matches_its_snapshot():
    proc = run("diff", str(EXAMPLE), str(EXAMPLE), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert "None of the 19 ops found in both runs changed beyond noise." in proc.stdout
    assert_snapshot(normalise(proc.stdout, {str(EXAMPLE): "<example>"}), "diff_example_self.md")


def test_diff_of_a_planted_slowdown_matches_its_snapshot(captures):
    proc = run("diff", str(captures["base"]), str(captures["slow"]), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert_snapshot(normalise(proc.stdout, {str(captures["root"]): "<tmp>"}), "diff_planted_slowdown.md")


def test_diff_json_against_itself_has_no_changes():
    proc = run("diff", str(EXAMPLE), str(EXAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["has_changes"] is False
    assert doc["step_time"]["verdict"] == "within noise" and doc["step_time"]["delta_ps"] == 0
    assert doc["findings_compared"] is True and doc["findings_appeared"] == []
    assert "noise band" in doc["noise"]["rule"]


def test_diff_json_reports_the_planted_op_with_sign_and_size(captures):
    proc = run("diff", str(captures["base"]), str(captures["slow"]), "--format", "json")
    doc = json.loads(proc.stdout)
    changed = [o for o in doc["ops"] if o["significant"]]
    assert [o["name"] for o in changed] == ["fusion.1"]
    assert changed[0]["verdict"] == "slower" and changed[0]["relative"] == pytest.approx(0.2, abs=0.01)
    assert doc["step_time"]["verdict"] == "slower"


def test_diff_terminal_says_within_noise_for_jitter(captures):
    proc = run("diff", str(captures["base"]), str(captures["noise"]))
    assert proc.returncode == 0, proc.stderr
    assert "within noise" in proc.stdout and "No op changed beyond noise (3 matched)" in proc.stdout
    assert "noise band" in proc.stdout


def test_diff_with_a_missing_capture_is_an_input_error(tmp_path):
    proc = run("diff", str(EXAMPLE), str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ")


# ---------------------------------------------------------------------------------------------
# check: exit codes


def test_check_passes_by_default_when_no_finding_is_high():
    proc = run("check", str(EXAMPLE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check passed" in proc.stdout


def test_check_fails_on_findings_at_or_above_fail_on():
    proc = run("check", str(EXAMPLE), "--fail-on", "low", "--format", "json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["result"] == "fail" and doc["exit_code"] == 1
    assert doc["checks"][0]["name"] == "findings" and not doc["checks"][0]["passed"]


def test_check_fails_on_a_planted_regression_beyond_max_regression(captures):
    proc = run("check", str(captures["slow"]), "--baseline", str(captures["base"]), "--max-regression", "5",
               "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    [step] = doc["checks"]
    assert step["name"] == "step-time-regression" and not step["passed"]
    assert doc["step_time"]["relative"] == pytest.approx(0.128, abs=0.015)


def test_check_passes_a_regression_under_the_allowed_percentage(captures):
    proc = run("check", str(captures["slow"]), "--baseline", str(captures["base"]), "--max-regression", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_passes_noise_even_with_a_zero_budget(captures):
    # 0 % allowed, but a ±1 % jitter stays inside the noise band: not a regression.
    proc = run("check", str(captures["noise"]), "--baseline", str(captures["base"]), "--max-regression", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass  step-time-regression" in proc.stdout


def test_check_a_faster_run_passes(captures):
    proc = run("check", str(captures["base"]), "--baseline", str(captures["slow"]), "--max-regression", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--max-regression", "5"], "--max-regression needs --baseline"),
    (["--fail-on", "catastrophic"], "unknown severity"),
])
def test_check_usage_errors_exit_2(args, message):
    proc = run("check", str(EXAMPLE), *args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_check_on_a_missing_capture_exits_2(tmp_path):
    proc = run("check", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ")


def test_diff_of_a_compile_output_with_itself_simulates_it_and_says_it_is_modelled():
    compiled = REPO / "tests" / "compiler" / "fixtures" / "v5e_mlp_compile"
    proc = run("diff", str(compiled), str(compiled), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["has_changes"] is False and doc["ops"]
    assert doc["base"]["input"] == str(compiled)
    assert "base run is modelled (`tpudiag simulate`), not measured" in doc["warnings"]


def test_diff_of_a_compile_output_joins_its_padding_and_spills():
    compiled = REPO / "tests" / "compiler" / "fixtures" / "v5e_mlp_compile"
    doc = json.loads(run("diff", str(compiled), str(compiled), "--format", "json").stdout)
    facts = [o["new_compiled"] for o in doc["ops"] if o["new_compiled"]]
    assert facts and any(f["spills"] is not None for f in facts) and any(f["padded_bytes"] for f in facts)
    assert not any(o["compiled_changed"] for o in doc["ops"])


def test_check_json_reports_an_input_error_on_stdout_too(tmp_path):
    proc = run("check", str(tmp_path / "nope"), "--format", "json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["result"] == "error" and doc["exit_code"] == 2 and "no such file" in doc["error"]
    assert proc.stderr.startswith("error: ")


def test_check_json_error_goes_to_the_output_file(tmp_path):
    # The JSON the user asked for goes where they asked for it: with `-o`, the error object too.
    (tmp_path / "in").mkdir()
    out = tmp_path / "verdict.json"
    proc = run("check", str(tmp_path / "in" / "nope"), "--format", "json", "-o", str(out))
    assert proc.returncode == 2 and proc.stdout == ""
    doc = json.loads(out.read_text())
    assert doc["result"] == "error" and doc["exit_code"] == 2 and "no such file" in doc["error"]
    assert proc.stderr.startswith("error: ")


def test_check_json_error_about_the_output_itself_goes_to_stdout(tmp_path):
    # Near miss: an `-o` inside the capture is refused, so nothing is written there and stdout answers.
    capture = tmp_path / "capture"
    capture.mkdir()
    proc = run("check", str(capture), "--format", "json", "-o", str(capture / "verdict.json"))
    assert proc.returncode == 2 and not (capture / "verdict.json").exists()
    assert json.loads(proc.stdout)["result"] == "error"


def test_diff_of_two_captures_without_steps_shows_op_totals_per_core():
    """Two real GPU captures without steps (`../shared`): op times are totals per core over each
    capture, never `0 ps per step`. From the conv3d capture's events: `cudnn-conv.1` runs 79 times
    on its 8 GPUs, 12,531,616,000 ps in all (no nested events), 1.57 ms per core."""
    from tests.conftest import SHARED

    base = SHARED / "data" / "real-captures" / "jax-gpu-conv3d-8gpu"
    new = SHARED / "data" / "real-captures" / "jax-gpu-te-fused-attn"
    if not (base.exists() and new.exists()):
        pytest.skip(f"the real GPU captures are in ../shared, absent here ({base.parent})")
    proc = run("diff", str(base), str(new))
    assert proc.returncode == 0, proc.stderr
    assert "per step and core" not in proc.stdout.replace("\n", " ").split("A change is reported")[0]
    assert " 0 ps per" not in proc.stdout
    [conv_line] = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("cudnn-conv.1 (")]
    assert conv_line.endswith(") 1.57 ms per core over the capture")
    doc = json.loads(run("diff", str(base), str(base), "--format", "json").stdout)
    assert doc["op_basis"] == "per core over the capture" and doc["step_time"] is None
    conv = {o["name"]: o for o in doc["ops"]}["cudnn-conv.1"]
    assert conv["base"]["centre_ps"] == pytest.approx(1.566452e9) and conv["delta_ps"] == 0
