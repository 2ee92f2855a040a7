"""`tpudiag run` on a CPU: XLA's CPU ops read as a device, steps from StepTraceAnnotation.

The issue's check, end to end: a 20-step MLP with a `StepTraceAnnotation` per step, a 20 ms
data-loader sleep and a host sync per step, run under `tpudiag run --format json` on this CPU.
The report must hold every step (against `xprof get_step_trace` on the same capture), the XLA CPU
ops with their times, and a device-idle finding that names the gap at each step's start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_run_cli import run_tpudiag

pytest.importorskip("jax", reason="tpudiag run captures with jax.profiler (the tpu extra)")

MLP = """\
import time
import jax, jax.numpy as jnp

def init(key, sizes=(256, 512, 512, 10)):
    ks = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (a, b)) * 0.02, jnp.zeros(b)) for k, a, b in zip(ks, sizes[:-1], sizes[1:])]

def loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    return jnp.mean((h @ w + b - y) ** 2)

@jax.jit
def step(params, x, y):
    l, g = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g), l

params = init(jax.random.PRNGKey(0))
x = jnp.ones((128, 256)); y = jnp.ones((128, 10))
for i in range(20):
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        time.sleep(0.02)  # the data loader
        params, l = step(params, x, y)
        l.block_until_ready()  # a host sync per step
print("done")
"""


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlp")
    logdir = tmp / "logdir"
    proc = run_tpudiag(tmp, "--format", "json", "--logdir", str(logdir), script=MLP, program_args=(),
                       platforms=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), logdir, proc  # stdout is the report alone: it parses


def test_cpu_run_has_steps_ops_and_an_idle_finding(mlp_run):
    doc, _, proc = mlp_run
    assert "done" in proc.stderr  # the program's own stdout went to stderr
    summary = doc["summary"]
    assert summary["platform"] == "CPU" and summary["step_source"] == "step annotations"
    assert 18 <= summary["step_time"]["count"] <= 20
    # The step is at least the 20 ms sleep
    assert summary["step_time"]["p50_ps"] >= 20e9
    ops = doc["ops"]
    assert ops and all(op["self_time_ps"] > 0 for op in ops[:5])
    assert any(op["name"].startswith(("dot", "ynn_fusion")) for op in ops[:10])  # XLA CPU's matmuls
    # XLA's CPU runtime records FLOPs but no peak FLOP/s or memory bandwidth: no utilization, and a
    # matmul with FLOPs is not called latency-bound for want of a roof.
    assert summary["peak_flops_per_s"] is None and summary["hbm_bytes_per_s"] is None
    matmuls = [op for op in ops if op["name"].startswith("dot") and op["flops"] > 0]
    assert matmuls and all(op["bound_by"] == "no peak known" and op["flop_utilization"] is None for op in matmuls)
    idle = [f for f in doc["findings"] if f["rule"] == "device-idle"]
    assert idle, [f["rule"] for f in doc["findings"]]
    # the sleep is before each step's first op: the finding names that gap
    assert "at the start of each step, before its first op" in idle[0]["message"]


@pytest.mark.xprof
def test_cpu_step_mean_matches_xprof_step_trace(mlp_run, tmp_path):
    doc, logdir, _ = mlp_run
    (trace,) = logdir.rglob("*.xplane.pb")
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copyfile(trace, copy / trace.name)  # xprof writes cache files next to what it reads
    exe = Path(sys.executable).with_name("xprof")
    proc = subprocess.run([str(exe), "get_step_trace", str(copy)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout)["summary"]
    ours = doc["summary"]["step_time"]
    assert ours["count"] == theirs["total_steps"]
    assert ours["mean_ps"] / 1e9 == pytest.approx(theirs["step_time_ms_average"], rel=0.10)
