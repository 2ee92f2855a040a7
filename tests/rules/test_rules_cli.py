"""`tpudiag rules`, `tpudiag rule NAME` and the report's rule options, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.cli_util import run_tpudiag
from tests.rules import scenarios as sc
from tpudiag.rules import RULES


def run(*args: str) -> subprocess.CompletedProcess:
    """`tpudiag ARGS` (in-process) from an empty directory, so no developer config is picked up."""
    with tempfile.TemporaryDirectory() as cwd:
        return run_tpudiag(*args, env={"NO_COLOR": "1", "COLUMNS": "160"}, cwd=cwd)


@pytest.fixture
def problem_run(tmp_path: Path) -> Path:
    """Exposed collectives: two medium findings (8.3 % and 8.0 % of the step), no high one."""
    return sc.write_run(sc.exposed_collectives(), tmp_path / "problem")


def test_rules_lists_every_rule():
    proc = run("rules")
    assert proc.returncode == 0 and proc.stderr == ""
    for r in RULES:
        assert r.code in proc.stdout and r.name in proc.stdout


def test_rules_json():
    proc = run("rules", "--format", "json")
    assert proc.returncode == 0
    doc = json.loads(proc.stdout)
    assert [r["code"] for r in doc] == [r.code for r in RULES]
    ec = doc[0]
    assert ec["name"] == "exposed-collective" and ec["options"]["hidden_threshold"] == 0.9
    assert ec["inputs"] == ["trace"] and "What it does" in ec["doc"]


@pytest.mark.parametrize("key", ["exposed-collective", "TPD101", "tpd101"])
def test_rule_prints_its_documentation(key):
    proc = run("rule", key)
    assert proc.returncode == 0
    assert proc.stdout.startswith("# exposed-collective (TPD101)\n")
    assert "How to fix" in proc.stdout and "--xla_tpu_overlap_compute_collective_tc=true" in proc.stdout


def test_unknown_rule_is_exit_2():
    proc = run("rule", "no-such-rule")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[0] == "error: unknown rule `no-such-rule`"


@pytest.mark.parametrize(("fail_on", "code"), [("high", 0), ("medium", 1), ("low", 1)])
def test_fail_on_exit_codes(problem_run: Path, fail_on: str, code: int):
    # The scenario's steps also idle a third of the time: device-idle is left out to test one rule's severity.
    proc = run("report", str(problem_run), "--fail-on", fail_on, "--ignore", "device-idle")
    assert proc.returncode == code, proc.stderr
    assert "exposed-collective" in proc.stdout


def test_fail_on_with_a_healthy_capture_is_0(tmp_path: Path):
    proc = run("report", str(sc.write_run(sc.healthy(), tmp_path)), "--fail-on", "low")
    assert proc.returncode == 0, proc.stderr
    assert "no findings" in proc.stdout


def test_select_ignore_and_json_findings(problem_run: Path):
    proc = run("report", str(problem_run), "--format", "json", "--select", "TPD101,spill")
    doc = json.loads(proc.stdout)
    assert {f["rule"] for f in doc["findings"]} == {"exposed-collective"}
    assert [f["saving_ps"] for f in doc["findings"]] == [830 * sc.US, 800 * sc.US]
    assert all(set(f) >= {"rule", "severity", "message", "saving_ps"} for f in doc["findings"])
    assert doc["rules_skipped"] == [{"rule": "spill", "reason": "needs LLO dumps (`--dumps DIR`)"}]
    proc = run("report", str(problem_run), "--format", "json", "--ignore", "exposed-collective")
    assert all(f["rule"] != "exposed-collective" for f in json.loads(proc.stdout)["findings"])


def test_config_file_options_change_the_findings(problem_run: Path, tmp_path: Path):
    config = tmp_path / "strict.toml"
    config.write_text('ignore = ["device-idle"]\n[rules.exposed-collective]\nmin_exposed_fraction = 0.2\n')
    proc = run("report", str(problem_run), "--config", str(config), "--fail-on", "low")
    assert proc.returncode == 0, proc.stderr  # 8 % < 20 %: nothing reported
    assert "exposed-collective" not in proc.stdout.split("Findings")[1]


def test_config_next_to_the_input_is_found(problem_run: Path):
    (problem_run / "tpudiag.toml").write_text('ignore = ["exposed-collective", "device-idle"]\n')
    proc = run("report", str(problem_run), "--fail-on", "low")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "{bad}"], "unknown key `colour`"),
    (["--select", "bogus"], "unknown rule `bogus` in --select"),
    (["--fail-on", "severe"], "--fail-on: unknown severity 'severe'"),
    (["--config", "{missing}"], "config file not found"),
])
def test_bad_rule_options_are_one_line_exit_2(problem_run: Path, tmp_path: Path, args, message):
    bad = tmp_path / "bad.toml"
    bad.write_text('colour = "red"\n')
    args = [a.format(bad=bad, missing=tmp_path / "nope.toml") for a in args]
    proc = run("report", str(problem_run), *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: ") and message in proc.stderr.splitlines()[0]
    assert "Traceback" not in proc.stderr


FIXTURES = sc.REPO / "tests" / "fixtures"


def test_dumps_feed_the_spill_and_schedule_rules(tmp_path: Path):
    # Op names from the real dumps: v5e MLP `fusion.7` spills (107 / 523 over 4,076 bundles) and
    # the v6e MLP issues `all-gather.3` synchronously.
    ops = (sc.OpDef("fusion.7", "loop fusion", bytes_accessed=1e9), sc.OpDef("all-gather.3", "all-gather"))

    def schedule(chip, step):
        return [sc.Placed("fusion.7", 0, 2000 * sc.US), sc.Placed("all-gather.3", 2000 * sc.US, 500 * sc.US)]

    run_dir = sc.write_run(sc.design(ops, schedule), tmp_path)
    proc = run("report", str(run_dir), "--format", "json", "--select", "spill,exposed-collective",
               "--dumps", str(FIXTURES / "llo" / "v5e_mlp"), "--dumps", str(FIXTURES / "dumps" / "v6e_mlp_train"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["rules_skipped"] == []
    assert len(doc["summary"]["dumps"]) == 2
    by_rule = {f["rule"]: f for f in doc["findings"]}
    assert "spills 107 vector registers and fills 523" in by_rule["spill"]["message"]
    assert by_rule["spill"]["saving_ps"] == pytest.approx(2000 * sc.US * 630 / 4076, abs=1)
    # The op comes with its place in the model, from the compiled HLO's metadata (the trace has none).
    assert ("issues `all-gather.3` (at `make_fixtures.py:112`, `jit(step)/jvp()/dot_general`) synchronously"
            in by_rule["exposed-collective"]["message"])


def test_a_directory_without_dumps_is_exit_2(problem_run: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run("report", str(problem_run), "--dumps", str(empty))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "neither an LLO dump" in proc.stderr.splitlines()[0]


def test_rules_writes_its_list_to_the_output_file(tmp_path: Path):
    # `-o FILE` as every command has it: the list in the file, stdout empty, the file named on stderr.
    out = tmp_path / "rules.json"
    proc = run("rules", "--format", "json", "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.startswith("wrote `") and str(out) in proc.stderr
    assert [r["code"] for r in json.loads(out.read_text())] == [r.code for r in RULES]
