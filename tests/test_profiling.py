"""`with tpudiag.profile() as p:` in-process, on the CPU: a real jax.profiler capture, then `p.diagnosis`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import tpudiag  # noqa: E402
from tests.capture_util import capture_events  # noqa: E402
from tpudiag.errors import InputError  # noqa: E402
from tpudiag.profiling import run_dirs  # noqa: E402

jax = pytest.importorskip("jax", reason="tpudiag.profile captures with jax.profiler (the tpu extra)")
jnp = jax.numpy
JAX_STEP_ANNOTATION = jax.profiler.StepTraceAnnotation


@jax.jit
def matmul(x):
    return jnp.tanh(x @ x)


def train(steps: int, annotate=None) -> None:
    """`steps` steps of the jitted matmul, each in a StepTraceAnnotation (jax's, looked up now)."""
    annotate = annotate or (lambda i: jax.profiler.StepTraceAnnotation("train", step_num=i))
    x = jnp.ones((64, 64))
    for i in range(steps):
        with annotate(i):
            x = matmul(x).block_until_ready()


def test_profile_traces_the_block_and_diagnoses_it(tmp_path):
    with tpudiag.profile(logdir=tmp_path) as p:
        train(3)
    (run,) = run_dirs(tmp_path)
    assert p.run_dir == run
    ops, steps = capture_events(run)
    assert steps == [0, 1, 2] and ops
    d = p.diagnosis
    assert isinstance(d, tpudiag.Diagnosis) and d.mode == "trace" and Path(d.input_path) == run
    assert d is p.diagnosis  # diagnosed once
    assert jax.profiler.StepTraceAnnotation is JAX_STEP_ANNOTATION  # jax's own class is back


def test_profile_steps_window_with_jax_annotations_and_p_step(tmp_path):
    with tpudiag.profile(logdir=tmp_path / "a", steps="1..2"):
        train(4)
    (run,) = run_dirs(tmp_path / "a")
    assert capture_events(run)[1] == [1, 2]
    with tpudiag.profile(logdir=tmp_path / "b", steps=range(2, 3)) as p:
        train(4, annotate=lambda i: p.step("train", step_num=i))
    assert capture_events(p.run_dir)[1] == [2]


def test_profile_steps_of_a_loop_variable(tmp_path):
    x = jnp.ones((64, 64))
    with tpudiag.profile(logdir=tmp_path, steps="1..2", step_var="i") as p:
        for i in range(4):  # no annotation: `i` says which step runs
            x = matmul(x).block_until_ready()
            time.sleep(0.3)  # long against the watcher's lag (polling, starting a trace)
    ops, steps = capture_events(p.run_dir)
    assert steps == [] and p._tracer.seen_steps == [0, 3]
    executed = {n for name, n in ops.items() if "tanh" in name and not name.startswith("end:")}
    assert executed and executed <= {1, 2, 3}  # steps 1 and 2, edges approximate (see StepVariable)


def test_profile_says_when_the_steps_never_came(tmp_path):
    with tpudiag.profile(logdir=tmp_path, steps=(7, 9)) as p:
        train(2)
    assert p.run_dir is None and run_dirs(tmp_path) == set()
    with pytest.raises(InputError, match="no capture was made: the block ran steps 0..1, none of 7..9"):
        p.diagnosis


def test_profile_in_a_notebook_cell(tmp_path, monkeypatch):
    """No reliance on __main__ or argv: a cell runs as exec'd code under ipykernel's argv."""
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "/tmp/kernel.json"])
    cell = ("import tpudiag, jax, jax.numpy as jnp\n"
            "with tpudiag.profile() as p:\n"
            "    jnp.ones((32, 32)).sum().block_until_ready()\n"
            "d = p.diagnosis\n")
    namespace: dict = {"__name__": "__main__"}
    exec(compile(cell, "<ipython-input-1>", "exec"), namespace)
    p = namespace["p"]
    assert p.fresh and p.logdir.name.startswith("tpudiag-profile-") and p.run_dir.parent.parent.parent == p.logdir
    assert namespace["d"].mode == "trace"


def test_profile_stops_the_trace_when_the_block_raises(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with tpudiag.profile(logdir=tmp_path / "a"):
            train(1)
            1 / 0
    assert len(run_dirs(tmp_path / "a")) == 1  # written, and the profiler is free again:
    with tpudiag.profile(logdir=tmp_path / "b") as p:
        train(1)
    assert p.run_dir is not None


def test_the_programs_own_trace_inside_a_profile_is_skipped(tmp_path, capsys):
    with tpudiag.profile(logdir=tmp_path / "mine"):
        jax.profiler.start_trace(str(tmp_path / "theirs"))  # would collide: one trace at a time
        train(1)
        jax.profiler.stop_trace()
    assert "start_trace" in capsys.readouterr().err and not (tmp_path / "theirs").exists()
    assert len(run_dirs(tmp_path / "mine")) == 1


def test_import_tpudiag_stays_free_of_jax():
    import subprocess

    code = "import sys, tpudiag; tpudiag.profile; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "False", out.stderr


def test_a_nested_profile_says_a_trace_is_already_running(tmp_path):
    # Regression (issue 33): a nested profile() raised jax's bare RuntimeError.
    from tpudiag.errors import UsageError

    with tpudiag.profile(logdir=tmp_path / "outer") as outer:
        with pytest.raises(UsageError, match="a trace is already running"):
            with tpudiag.profile(logdir=tmp_path / "inner"):
                pass
        train(1)
    assert outer.run_dir is not None and run_dirs(tmp_path / "inner") == set()
    assert jax.profiler.StepTraceAnnotation is JAX_STEP_ANNOTATION
    with tpudiag.profile(logdir=tmp_path / "after") as after:  # the next one starts cleanly
        train(1)
    assert after.run_dir is not None


def test_a_profile_while_jax_traces_says_a_trace_is_already_running(tmp_path):
    from tpudiag.errors import UsageError

    jax.profiler.start_trace(str(tmp_path / "theirs"))
    try:
        with pytest.raises(UsageError, match="a trace is already running"):
            with tpudiag.profile(logdir=tmp_path / "ours"):
                pass
    finally:
        jax.profiler.stop_trace()
    assert jax.profiler.start_trace is not None and jax.profiler.StepTraceAnnotation is JAX_STEP_ANNOTATION
