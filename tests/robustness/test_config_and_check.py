"""Tracebacks promised away and `check` warnings (issue 13): broken configs, NaN/inf/negative
thresholds, infinite peaks in markdown figures, CPU-only captures and different chips in `check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, small_design
from tpudiag.cli.app import main
from tpudiag.writers.tpu_design import write_capture

CPU_EXAMPLE = REPO / "examples" / "captures" / "cpu_jax_profiler"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def assert_usage_error(code: int, err: str, *needles: str) -> None:
    assert code == 2 and "Traceback" not in err, err
    first = err.strip().splitlines()[0]
    assert first.startswith("error: "), err
    for n in needles:
        assert n in first, (n, first)


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("name, content, needle", [
    ("bad.toml", b"select = ['\xff\xfe']\n", "not UTF-8"),
    ("deep.toml", b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "invalid TOML"),
    ("inf.toml", b"[rules.padding-waste]\nmin_padding_fraction = inf\n", "finite"),
    ("nan.toml", b"[rules.padding-waste]\nmin_padding_fraction = nan\n", "finite"),
    ("neg.toml", b"[rules.spill]\nmax_findings = -3\n", ">= 0"),
    ("pyproject.toml", b"tool = 5\n", "`tool` is not a table"),
    ("pyproject.toml", b"[tool]\ntpudiag = 5\n", "not a table"),
])
def test_an_explicit_config_error_is_exit_2_naming_the_file(capsys, small_capture, tmp_path, name, content,
                                                             needle):
    cfg = tmp_path / "cfg" / name
    cfg.parent.mkdir()
    cfg.write_bytes(content)
    code, _, err = run_cli(capsys, "report", small_capture, "--config", cfg)
    assert_usage_error(code, err, str(cfg), needle)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("kind, needle", [("fifo", "FIFO"), ("zero", "character device"), ("dir", "directory")])
def test_a_config_that_is_not_a_regular_file_is_exit_2_not_a_hang(small_capture, tmp_path, kind, needle):
    # Was: `--config` on a FIFO blocked forever and on a /dev/zero link read until memory ran out.
    cfg = tmp_path / f"{kind}.toml"
    if kind == "fifo":
        os.mkfifo(cfg)
    elif kind == "zero":
        cfg.symlink_to("/dev/zero")
    else:
        cfg.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "report", str(small_capture), "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert_usage_error(proc.returncode, proc.stderr, str(cfg), "cannot read config", needle)


@pytest.mark.parametrize("content", [b"tool = 5\n", b"[tool\n", b"\xff\xfe = 1\n", b"x = " + b"[" * 5000 + b"\n"])
def test_a_broken_pyproject_found_in_a_parent_is_skipped_with_a_warning(capsys, tmp_path, monkeypatch, content):
    project = tmp_path / "project"
    (project / "work" / "deeper").mkdir(parents=True)
    (project / "pyproject.toml").write_bytes(content)
    write_capture(small_design(), project / "work" / "logdir" / "plugins" / "profile" / "run")
    monkeypatch.chdir(project / "work" / "deeper")
    code, out, err = run_cli(capsys, "report", project / "work" / "logdir", "-f", "json")
    assert code == 0, err
    # The skip is one of the run's warnings (diagnose() returns it), not a line load_config printed.
    assert "Traceback" not in err and "warning" not in err, err
    skipped = [w for w in json.loads(out)["warnings"] if w.startswith("config: skipped `")]
    assert len(skipped) == 1 and str(project / "pyproject.toml") in skipped[0], skipped
    code, out, err = run_cli(capsys, "report", project / "work" / "logdir")  # the terminal shows it too
    assert code == 0 and "config: skipped" in out and str(project / "pyproject.toml") in out, (out, err)


def test_a_skipped_pyproject_reaches_the_python_api_and_check(tmp_path, monkeypatch, capsys):
    from tpudiag.pipeline import diagnose

    project = tmp_path / "project"
    (project / "work").mkdir(parents=True)
    (project / "pyproject.toml").write_bytes(b"tool = 5\n")
    run = project / "work" / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(), run)
    monkeypatch.chdir(project / "work")
    d = diagnose(project / "work" / "logdir")
    assert any(w.startswith("config: skipped `") for w in d.warnings) and d.warnings == d.report.warnings
    assert capsys.readouterr().err == ""  # load_config printed nothing
    code, out, err = run_cli(capsys, "check", project / "work" / "logdir", "-f", "json")
    assert any(w.startswith("config: skipped `") for w in json.loads(out)["warnings"])
    assert "warning: config: skipped `" in err


def test_a_broken_tpudiag_toml_found_on_its_own_is_an_error(capsys, small_capture):
    (small_capture / "tpudiag.toml").write_bytes(b"select = [\n")
    code, _, err = run_cli(capsys, "report", small_capture)
    assert_usage_error(code, err, "tpudiag.toml", "invalid TOML")


def test_a_pyproject_whose_tpudiag_table_is_wrong_is_an_error_not_skipped(capsys, small_capture):
    # It parses and addresses tpudiag: the user meant it, so it fails like `--config` would.
    (small_capture / "pyproject.toml").write_bytes(b"[tool]\ntpudiag = 5\n")
    code, _, err = run_cli(capsys, "report", small_capture)
    assert_usage_error(code, err, "pyproject.toml", "not a table")


# --- command-line thresholds -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_check_max_regression_must_be_finite_and_non_negative(capsys, small_capture, value):
    code, _, err = run_cli(capsys, "check", small_capture, "--baseline", small_capture,
                           f"--max-regression={value}")
    assert_usage_error(code, err, "--max-regression")


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_diff_min_change_must_be_finite_and_non_negative(capsys, small_capture, value):
    code, _, err = run_cli(capsys, "diff", small_capture, small_capture, f"--min-change={value}")
    assert_usage_error(code, err, "--min-change")


@pytest.mark.parametrize("option, value", [("--clock-ghz", "nan"), ("--clock-ghz", "0"), ("--ici-gbps", "inf"),
                                           ("--ici-latency-us", "-1")])
def test_simulate_numbers_are_checked(capsys, tmp_path, option, value):
    dumps = REPO / "examples" / "models" / "dumps" / "transformer_train_v5e"
    code, _, err = run_cli(capsys, "simulate", dumps, "-o", tmp_path / "lg", f"{option}={value}")
    assert_usage_error(code, err, option)
    assert not (tmp_path / "lg").exists()


@pytest.mark.parametrize("command", ["report", "diff"])
@pytest.mark.parametrize("value", ["nan", "0", "-2", "inf"])
def test_clock_ghz_must_be_finite_and_positive(capsys, small_capture, command, value):
    inputs = [small_capture] * (2 if command == "diff" else 1)
    code, _, err = run_cli(capsys, command, *inputs, f"--clock-ghz={value}")
    assert_usage_error(code, err, "--clock-ghz")


def test_a_near_miss_threshold_is_accepted(capsys, small_capture):
    code, _, err = run_cli(capsys, "check", small_capture, "--baseline", small_capture, "--max-regression=0")
    assert code in (0, 1) and "error" not in err


# --- infinite peaks in figures -----------------------------------------------------------------


@pytest.mark.parametrize("peak", [float("inf"), float("nan"), 1e308])
def test_markdown_with_absurd_peaks_has_no_traceback(capsys, tmp_path, peak):
    pytest.importorskip("matplotlib")
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(peak_tflops=peak, peak_hbm_gbs=peak), run)
    out = tmp_path / "out" / "r.md"
    code, _, err = run_cli(capsys, "report", tmp_path / "logdir", "-f", "md", "-o", out)
    assert code == 0 and "Traceback" not in err, err
    assert out.read_text().startswith("# Performance report")


def test_figures_skip_non_finite_values_and_keep_the_rest(tmp_path):
    pytest.importorskip("matplotlib")
    import dataclasses

    from tpudiag.analysis.profile_analysis import analyze
    from tpudiag.report_builder import build_report
    from tpudiag.parsers.capture import load_capture
    from tpudiag.render.figures import write_figures

    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(), run)
    report = build_report(analyze(load_capture(tmp_path / "logdir")))
    summary = dataclasses.replace(report.summary, peak_flops_per_s=float("inf"))
    figures = write_figures(dataclasses.replace(report, summary=summary), tmp_path / "f", "r")
    assert "roofline" not in figures and "step-breakdown" in figures  # the near miss is still drawn


# --- check warnings ----------------------------------------------------------------------------


def test_check_of_a_cpu_only_capture_warns_that_there_is_nothing_to_gate_on(capsys, tmp_path):
    from tests.conftest import host_only_capture

    code, out, err = run_cli(capsys, "check", host_only_capture(tmp_path), "-f", "json")
    assert code == 0
    doc = json.loads(out)
    assert any("host-only capture" in w for w in doc["warnings"])
    assert "warning: host-only capture" in err


def test_check_of_a_cpu_run_gates_on_its_xla_cpu_ops_and_names_the_rules(capsys):
    # The CPU example's `ynn_fusion` runs on XLA's CPU threads: a device to gate on, not host-only
    code, out, err = run_cli(capsys, "check", CPU_EXAMPLE, "--fail-on", "high")
    assert code == 0 and "host-only" not in err
    assert "rules run: " in out and "device-idle" in out.split("not run:")[0]
    assert "padding-waste, spill, vmem-pressure (about TPU hardware" in out.replace("\n", " ")


def test_check_of_v6e_against_a_v5e_baseline_says_the_chips_differ(capsys, tmp_path):
    base = tmp_path / "base" / "plugins" / "profile" / "run"
    new = tmp_path / "new" / "plugins" / "profile" / "run"
    write_capture(small_design(device_type="TPU v5 lite", peak_tflops=197.0, peak_hbm_gbs=819.0), base)
    write_capture(small_design(), new)
    code, out, err = run_cli(capsys, "check", tmp_path / "new", "--baseline", tmp_path / "base")
    assert code in (0, 1)
    assert "warning: the chips differ: base TPU v5 lite; new TPU v6 Lite" in err


def test_check_of_the_same_chip_has_no_chip_warning(capsys, small_capture):
    code, out, err = run_cli(capsys, "check", small_capture, "--baseline", small_capture)
    assert "chips differ" not in err and "host-only" not in err


def test_check_carries_the_reports_warnings(capsys, tmp_path):
    # A capture without a Steps line: report warns that each module execution counts as a step.
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(steps_line=False), run)
    code, out, err = run_cli(capsys, "report", tmp_path / "logdir", "-f", "json")
    report_warnings = json.loads(out)["warnings"]
    assert report_warnings
    code, out, err = run_cli(capsys, "check", tmp_path / "logdir", "-f", "json")
    assert set(report_warnings) <= set(json.loads(out)["warnings"])
