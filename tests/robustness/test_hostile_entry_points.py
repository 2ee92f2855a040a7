"""The public entry points refuse what they cannot use with one `UsageError` naming it (issue 33):
`whatif`'s timeout, and every argument of `diagnose`, `compare`, `profile` and `gate`."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tpudiag.compiler.driver import MAX_WAIT_S, wait_limit_s


def test_a_timeout_past_the_platforms_timers_waits_without_limit(tmp_path):
    # Regression (issue 33): `whatif --timeout-s 1e308` was an OverflowError in subprocess's wait.
    assert wait_limit_s(1e308) == MAX_WAIT_S and wait_limit_s(float("inf")) == MAX_WAIT_S and wait_limit_s(5) == 5
    subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=wait_limit_s(1e308),
                   check=True)
    # A target without `example_args` fails inside the compile worker, after its wait has started.
    (tmp_path / "m.py").write_text("def f():\n    return 1\n")
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "whatif", "m:f", "--topology", "v5e:1x1",
                           "--timeout-s", "1e308", "--xla-flag", "xla_tpu_enable_latency_hiding_scheduler=false", "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "example_args" in proc.stderr


# --- the Python API: each wrong argument is a UsageError naming it, raised at the call ---

import pytest  # noqa: E402

import tpudiag  # noqa: E402
from tpudiag.errors import InputError, UsageError  # noqa: E402
from tpudiag.gate import gate  # noqa: E402


def _never(*_args, **_kwargs):
    raise AssertionError("an input was read before the arguments were checked")


@pytest.fixture
def no_reading(monkeypatch):
    monkeypatch.setattr("tpudiag.pipeline.read_inputs", _never)


@pytest.mark.parametrize("kwargs, name", [
    (dict(select=5), "select"), (dict(select=["a", 5]), "select"), (dict(ignore=b"x"), "ignore"),
    (dict(error=5), "error"), (dict(error=b"RESOURCE_EXHAUSTED"), "error"),
    (dict(config={"rules": 1}), "config"), (dict(scheduler=5), "scheduler"), (dict(jobs="2"), "jobs"),
    (dict(progress=3), "progress"), (dict(clock_ghz=float("nan")), "clock_ghz"), (dict(chip=7), "chip"),
    (dict(dumps=5), "dumps"),
])
def test_diagnose_names_the_wrong_argument(no_reading, kwargs, name):
    with pytest.raises(UsageError, match=rf"^{name} must be"):
        tpudiag.diagnose("somewhere", **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(config=3.5), "config"), (dict(noise="wide"), "noise"), (dict(scheduler=[1]), "scheduler"),
    (dict(jobs=0), "jobs"),
])
def test_compare_names_the_wrong_argument(no_reading, kwargs, name):
    with pytest.raises(UsageError, match=rf"^{name} must be"):
        tpudiag.compare("a", "b", **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(fail_on=3.5), "fail_on"), (dict(fail_on="severe"), "fail_on"), (dict(baseline=5), "baseline"),
    (dict(baseline="b", max_regression_pct="5"), "max_regression_pct"),
    (dict(baseline="b", max_regression_pct=-1), "max_regression_pct"), (dict(max_regression_pct=5), "max_regression_pct"),
    (dict(config=[]), "config"), (dict(jobs=1.5), "jobs"), (dict(chip="v99"), "chip"),
])
def test_gate_names_the_wrong_argument(no_reading, kwargs, name):
    with pytest.raises(UsageError, match=name):
        gate("somewhere", **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(step_var=5, steps=1), "step_var"), (dict(python_tracer="yes"), "python_tracer"),
    (dict(logdir=5), "logdir"), (dict(bogus_kw=1), "bogus_kw"), (dict(select=5), "select"),
    (dict(path="x"), "path"),
])
def test_profile_refuses_a_wrong_argument_at_the_call(kwargs, name):
    # Regression (issue 33): `step_var=5` was an AttributeError; `bogus_kw=1` was accepted and
    # failed only at `.diagnosis`, after the block had run.
    with pytest.raises(UsageError, match=name):
        tpudiag.profile(**kwargs)


def test_profile_refuses_a_logdir_under_a_file_at_the_call(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(InputError, match="cannot be made a logdir") as err:
        tpudiag.profile(logdir=tmp_path / "a_file" / "logs")
    assert err.value.path == str(tmp_path / "a_file" / "logs")
