"""`tpudiag run -- python script.py`: a real jax.profiler capture of an unmodified program on the CPU.

Each test runs a small JAX script in a child process (a few seconds each): the capture must hold
the script's XLA ops and its step annotations, the report must be printed, and the program's
exit status must come back, a failing one included.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.capture_util import capture_events, hlo_instructions
from tests.conftest import REPO
from tpudiag.cli.run_cmd import child_env, gpu_host, joinable_dumps, tpu_host
from tpudiag.profiling import newest_new_run, parse_steps, run_dirs

pytest.importorskip("jax", reason="tpudiag run captures with jax.profiler (the tpu extra)")

# Four steps of one jitted matmul, annotated the way training loops are; exits with STATUS.
SCRIPT = """\
import sys
import jax, jax.numpy as jnp

@jax.jit
def matmul(x):
    return jnp.tanh(x @ x)

x = jnp.ones((64, 64))
for i in range(4):
    with jax.profiler.StepTraceAnnotation("train", step_num=i):
        x = matmul(x).block_until_ready()
print("script done")
sys.exit(int(sys.argv[1]))
"""


def run_tpudiag(tmp_path: Path, *args: str, script: str | Path = SCRIPT, program_args: tuple[str, ...] = ("0",),
                env: dict | None = None, platforms: bool = True) -> subprocess.CompletedProcess:
    """`tpudiag run ARGS -- python SCRIPT PROGRAM_ARGS` on the CPU, from `tmp_path`.

    `platforms=False` leaves `JAX_PLATFORMS` unset, as a user's shell would, for `run` to decide."""
    if isinstance(script, str):
        path = tmp_path / "train.py"
        path.write_text(script)
    else:
        path = script
    inherited = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS")}
    full_env = {**inherited, **({"JAX_PLATFORMS": "cpu"} if platforms else {}), "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tpudiag", "run", *args, "--", sys.executable, str(path),
                           *program_args], capture_output=True, text=True, env=full_env, timeout=300,
                          cwd=tmp_path)


def _named(stderr: str, what: str) -> Path:
    m = re.search(rf"{what} in `([^`]+)`", stderr)
    assert m, stderr
    return Path(m.group(1))


def jit_instructions(xla_dump: Path, function: str = "matmul") -> set[str]:
    """Instruction names only the jitted `function` has, among every module the CPU compiler dumped."""
    names: dict[str, set[str]] = {p.name: hlo_instructions(p.read_text())
                                  for p in xla_dump.glob("*.cpu_after_optimizations.txt")}
    (own,) = [k for k in names if k.endswith(f".jit_{function}.cpu_after_optimizations.txt")]
    return names.pop(own).difference(*names.values())


def test_run_captures_the_bundled_example_whole_and_prints_its_report(tmp_path):
    proc = run_tpudiag(tmp_path, script=REPO / "examples" / "train_loop.py", program_args=("--steps", "5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss after 5 steps" in proc.stdout  # the program's own output still reaches the user
    assert "tpudiag report" in proc.stdout and "Findings" in proc.stdout
    logdir, xla = _named(proc.stderr, "trace"), _named(proc.stderr, "dumps")
    assert not logdir.is_relative_to(tmp_path)  # a fresh temporary directory, never the cwd
    (run_dir,) = run_dirs(logdir)
    assert str(run_dir) in proc.stderr
    ops, steps = capture_events(run_dir)
    assert steps == [0, 1, 2, 3, 4]
    executed = {name: n for name, n in ops.items() if name in jit_instructions(xla, "train_step")}
    # the train step's fused ops ran once per step (the HLO dump names them)
    assert executed and set(executed.values()) == {5}, ops
    # the CPU compiler's dumps join the CPU ops, as a TPU's do: source lines and layouts from them
    assert f"Compiler dumps: {xla} (XLA)" in proc.stdout
    joined = re.search(r"Compiled facts joined to (\d+) of (\d+) ops \(layouts for (\d+).*?from\s+(\S+)\)", proc.stdout,
                       re.S)  # the line may wrap at 140 columns
    assert joined and int(joined[1]) > 0 and int(joined[3]) > 0 and joined[4] == str(xla), proc.stdout
    assert "train_loop.py:" in proc.stdout  # an op's source line, from the dumped HLO's metadata


def test_run_json_on_stdout_parses_and_the_child_starts_quietly(tmp_path):
    # Regression: the program's `script done` came first on stdout, so `> out.json` was not JSON;
    # and with jax[tpu] installed on a machine without a TPU, libtpu printed its start-up noise.
    proc = run_tpudiag(tmp_path, "--format", "json", platforms=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # stdout is the report alone
    assert doc["summary"]["mode"] == "trace"
    assert "script done" in proc.stderr and "program's own stdout goes to stderr" in proc.stderr
    if not tpu_host() and not gpu_host():
        assert "TPU accelerator type" not in proc.stderr and "TPU_WORKER_HOSTNAMES" not in proc.stderr
        # The rules that fire on a CPU run (idle at least: tiny ops between host syncs) speak of no TPU
        from tests.rules.test_gpu_wording import TPU_ONLY

        assert doc["findings"]
        for f in doc["findings"]:
            text = [f["message"], f["fix"], f["saving_explanation"],
                    *(f"{e['subject']} {k} {v}" for e in f["evidence"] for k, v in e["values"].items())]
            assert not TPU_ONLY.findall("\n".join(text)), (f["rule"], text)


def test_run_steps_window_and_a_failing_program(tmp_path):
    proc = run_tpudiag(tmp_path, "--steps", "1..2", "--format", "json", "-o", str(tmp_path / "report.json"),
                       program_args=("3",))
    assert proc.returncode == 3, proc.stderr[-3000:]  # the program's status, passed through
    assert "exited with status 3" in proc.stderr
    assert proc.stdout == "script done\n"  # the program's output; the report went to -o
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["summary"]["mode"] == "trace"
    (run_dir,) = run_dirs(_named(proc.stderr, "trace"))
    ops, steps = capture_events(run_dir)
    assert steps == [1, 2]  # whole steps 1 and 2, nothing of 0 or 3
    executed = {n for name, n in ops.items() if name in jit_instructions(_named(proc.stderr, "dumps"))}
    assert executed == {2}
    # JAX's device memory profile, saved as step 2 ended (the window's end), on the CPU: the one live
    # array is step 2's `x`, f32[64,64] (16 KiB), made at line 11 (`x = matmul(x)...`); step 0
    # replaced the `jnp.ones` of line 8, which is gone
    profile = _named(proc.stderr, "JAX's live device buffers as the trace ended are")
    assert f"--pprof {profile}" in proc.stderr
    from tpudiag.analysis.live_buffers import live_bytes_of

    by_line = live_bytes_of(profile).by_line
    mine = by_line[by_line["file"].astype(str).str.endswith("train.py")]
    assert mine[["line", "buffers", "bytes"]].values.tolist() == [[11, 1, 64 * 64 * 4]], by_line


# The same work with no step annotation: only the loop variable says which step runs.
NO_ANNOTATION = """\
import sys, time
import jax, jax.numpy as jnp

@jax.jit
def matmul(x):
    return jnp.tanh(x @ x)

def main():
    x = jnp.ones((64, 64))
    for step in range(6):
        x = matmul(x).block_until_ready()
        time.sleep(0.3)  # steps long against the watcher's lag (polling, starting a trace), as real steps are

main()
"""


def test_run_steps_of_a_loop_variable(tmp_path):
    proc = run_tpudiag(tmp_path, "--steps", "2..3", "--step-var", "step", script=NO_ANNOTATION)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = run_dirs(_named(proc.stderr, "trace"))
    ops, steps = capture_events(run_dir)
    assert steps == []  # no annotations: the window came from `step` alone
    executed = {n for name, n in ops.items() if name in jit_instructions(_named(proc.stderr, "dumps"))}
    # steps 2 and 3, one matmul each; the edges are approximate (the watcher lags on a busy machine),
    # so one step may be cut or one more included, never the whole run
    assert executed and executed <= {1, 2, 3}
    proc = run_tpudiag(tmp_path, "--steps", "2", "--step-var", "nothing_by_this_name", script=NO_ANNOTATION)
    assert proc.returncode == 2 and "never set `nothing_by_this_name` to a step number" in proc.stderr
    proc = run_tpudiag(tmp_path, "--step-var", "step", script=NO_ANNOTATION)
    assert proc.returncode == 2 and "give the steps too" in proc.stderr


def test_run_says_when_no_capture_was_made(tmp_path):
    proc = run_tpudiag(tmp_path, "--steps", "7..9")
    assert proc.returncode == 2  # it succeeded, but there is nothing to diagnose
    assert "no capture was made: the program ran steps 0..3, none of 7..9" in proc.stderr
    assert proc.stdout.strip() == "script done"
    proc = run_tpudiag(tmp_path, script="import sys\nsys.exit(int(sys.argv[1]))\n", program_args=("5",))
    assert proc.returncode == 5
    assert "no capture was made: the program never imported jax" in proc.stderr


def test_run_passes_a_signal_death_through_as_a_shell_does(tmp_path):
    # SIGTERM (as `tpudiag run` forwards it) first writes the trace, then ends the program as the
    # signal would: its status is 128 + 15, and the capture is reported.
    script = "import os, signal\nimport jax.numpy as jnp\njnp.ones(3).block_until_ready()\n" \
             "os.kill(os.getpid(), signal.{sig})\n"
    proc = run_tpudiag(tmp_path, script=script.format(sig="SIGTERM"))
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    assert "the program exited with status 143; report of" in proc.stderr and "tpudiag report" in proc.stdout
    # SIGKILL: no handler runs, so jax never wrote the trace
    proc = run_tpudiag(tmp_path, script=script.format(sig="SIGKILL"))
    assert proc.returncode == 128 + 9
    assert "no capture was made: the program ended without running its exit handlers" in proc.stderr


def test_run_refuses_a_report_inside_the_logdir_before_running_anything(tmp_path):
    proc = run_tpudiag(tmp_path, "--logdir", str(tmp_path / "logs"), "-o", str(tmp_path / "logs" / "r.json"))
    assert proc.returncode == 2 and "inside the input directory" in proc.stderr
    assert "script done" not in proc.stdout  # the program never ran


def test_run_passes_the_programs_status_through_a_report_that_fails(tmp_path):
    (tmp_path / "a_file").write_text("")
    proc = run_tpudiag(tmp_path, "-o", str(tmp_path / "a_file" / "report.md"), program_args=("3",))
    assert proc.returncode == 3, proc.stderr[-2000:]  # the program's, not the report's 2
    assert "tpudiag run: no report:" in proc.stderr and "Traceback" not in proc.stderr


def test_run_keeps_the_environments_own_sitecustomize(tmp_path):
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIR_SITE = 'ran'\n")
    script = "import builtins, jax.numpy as jnp\njnp.ones(3).block_until_ready()\nprint(builtins.THEIR_SITE)\n"
    proc = run_tpudiag(tmp_path, script=script, env={"PYTHONPATH": os.pathsep.join([str(REPO), str(theirs)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ran\n") and "tpudiag report" in proc.stdout  # theirs ran, and ours traced


def test_run_says_when_its_bootstrap_could_not_run(tmp_path):
    path = tmp_path / "isolated.py"
    path.write_text("import jax.numpy as jnp\njnp.ones(3).block_until_ready()\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "run", "--", sys.executable, "-I", str(path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2  # -I ignores PYTHONPATH, so no trace could be started
    assert "bootstrap never ran in the program" in proc.stderr and "-I or -S" in proc.stderr


def test_run_into_a_logdir_reports_only_the_new_run(tmp_path):
    logdir = tmp_path / "logdir"
    old = logdir / "plugins" / "profile" / "2000_01_01_00_00_00"
    old.mkdir(parents=True)
    (old / "old.xplane.pb").write_bytes(b"")  # someone's older capture: left alone, not reported
    proc = run_tpudiag(tmp_path, "--logdir", str(logdir), "--steps", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (new,) = run_dirs(logdir) - {old}
    assert f"report of `{new}`" in proc.stderr
    assert (old / "old.xplane.pb").read_bytes() == b""
    assert capture_events(new)[1] == [0]


def test_usage_errors(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "run"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 2 and "no program to run" in proc.stderr
    proc = run_tpudiag(tmp_path, "--steps", "3..1")
    assert proc.returncode == 2 and "steps 3..1" in proc.stderr and "Traceback" not in proc.stderr


def test_child_env_keeps_the_users_flags_and_dump_directory(tmp_path):
    env_before = dict(os.environ)
    try:
        os.environ["XLA_FLAGS"] = "--xla_cpu_use_thunk_runtime=true"
        os.environ["LIBTPU_INIT_ARGS"] = "--xla_tpu_enable_latency_hiding_scheduler=false"
        env, xla, llo = child_env({"logdir": "x"}, tmp_path / "boot", tmp_path / "dumps", tpu=True)
        assert env["XLA_FLAGS"] == f"--xla_cpu_use_thunk_runtime=true --xla_dump_to={tmp_path / 'dumps' / 'xla'}"
        assert env["LIBTPU_INIT_ARGS"].startswith("--xla_tpu_enable_latency_hiding_scheduler=false --xla_jf_dump_to=")
        assert llo == tmp_path / "dumps" / "llo" and env["PYTHONPATH"].startswith(str(tmp_path / "boot"))
        os.environ["XLA_FLAGS"] = "--xla_dump_to=/mine"  # the user's own dump directory wins
        env, xla, llo = child_env({}, tmp_path, tmp_path / "dumps", tpu=False)
        assert env["XLA_FLAGS"] == "--xla_dump_to=/mine" and xla == Path("/mine") and llo is None
        assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_enable_latency_hiding_scheduler=false"  # no LLO off TPU
        os.environ.pop("JAX_PLATFORMS", None)  # no accelerator: jax runs on the CPU, libtpu stays quiet
        assert child_env({}, tmp_path, tmp_path / "d", tpu=False)[0]["JAX_PLATFORMS"] == "cpu"
        assert "JAX_PLATFORMS" not in child_env({}, tmp_path, tmp_path / "d", tpu=False, gpu=True)[0]
        assert "JAX_PLATFORMS" not in child_env({}, tmp_path, tmp_path / "d", tpu=True)[0]
        os.environ["JAX_PLATFORMS"] = "cuda"  # the user's choice is kept
        assert child_env({}, tmp_path, tmp_path / "d", tpu=False)[0]["JAX_PLATFORMS"] == "cuda"
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def test_run_says_which_variable_each_of_its_flags_went_to(tmp_path, monkeypatch):
    from tpudiag.cli.run_cmd import added_flags

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=true")
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    env, xla, llo = child_env({}, tmp_path, tmp_path / "dumps", tpu=True)
    assert added_flags(env) == [f"XLA_FLAGS += --xla_dump_to={xla}",
                                f"LIBTPU_INIT_ARGS += --xla_jf_dump_to={llo} --xla_jf_dump_llo_text=true "
                                "--xla_jf_dump_category_filter=misc"]
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={tmp_path}")  # the user's own: nothing added, nothing said
    assert added_flags(child_env({}, tmp_path, tmp_path / "dumps", tpu=False)[0]) == []


def test_joinable_dumps_reads_tpu_and_cpu_dumps(tmp_path):
    tpu = tmp_path / "tpu"
    tpu.mkdir()
    (tpu / "module_0001.jit_step.after_optimizations.txt").write_text("HloModule jit_step\n")
    assert joinable_dumps(tpu, None) == ([tpu], [])
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    (cpu / "module_0001.jit_step.cpu_after_optimizations.txt").write_text("HloModule jit_step\n")
    assert joinable_dumps(cpu, None) == ([cpu], [])  # the CPU compiler's, read as a TPU's
    assert joinable_dumps(tmp_path / "missing", None)[1] == [f"no HLO dump was written to `{tmp_path / 'missing'}`"]


@pytest.mark.parametrize(("text", "expected"), [("5", (5, 5)), ("10..12", (10, 12)), (" 0 .. 3 ", (0, 3))])
def test_parse_steps(text, expected):
    window = parse_steps(text)
    assert (window.first, window.last) == expected


@pytest.mark.parametrize("text", ["", "a", "3..1", "-1", "1..2..3", "1-3"])
def test_parse_steps_refuses(text):
    from tpudiag.errors import UsageError

    with pytest.raises(UsageError):
        parse_steps(text)


def test_newest_new_run_ignores_runs_that_were_there(tmp_path):
    root = tmp_path / "plugins" / "profile"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        (root / name / "h.xplane.pb").write_bytes(b"")
    before = run_dirs(tmp_path)
    assert newest_new_run(tmp_path, before) is None
    (root / "c").mkdir()
    assert newest_new_run(tmp_path, before) is None  # no trace file in it: not a run
    (root / "c" / "h.xplane.pb").write_bytes(b"")
    assert newest_new_run(tmp_path, before) == root / "c"


def _xla_only_registry(cache: Path) -> None:
    """A flag cache holding XLA's real flags (read from jaxlib in-process, no compile) and no
    libtpu flags, so `run --xla-flag` routes without a listing compile."""
    from importlib import metadata

    from tpudiag.compiler.flags import list_xla_flags

    try:
        libtpu = metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        libtpu = "none"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"flags-jaxlib-{metadata.version('jaxlib')}-libtpu-{libtpu}.json").write_text(
        json.dumps({"libtpu": [], "xla": sorted(list_xla_flags())}))


def test_run_routes_an_xla_flag_and_says_where(tmp_path):
    # Issue 35 §7: each flag goes where its runtime registers it, and run says which variable.
    _xla_only_registry(tmp_path / "cache")
    proc = run_tpudiag(tmp_path, "--xla-flag", "xla_cpu_enable_fast_math=false",
                       env={"TPUDIAG_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if "XLA_FLAGS +=" in ln)
    assert line.endswith("--xla_cpu_enable_fast_math=false")


@pytest.mark.parametrize(("flag", "message"), [
    ("xla_tpu_no_such_flag=1", "neither libtpu nor XLA registers this flag"),
    ("xla_cpu_enable_fast_math=false --xla_dump_to=/elsewhere", "would pass more than one flag"),
    ("xla_dump_to=/elsewhere", "`run` sets the dumps"),
])
def test_run_refuses_a_flag_before_the_program_starts(tmp_path, flag, message):
    _xla_only_registry(tmp_path / "cache")
    proc = run_tpudiag(tmp_path, "--xla-flag", flag, script="raise SystemExit('the program ran')",
                       env={"TPUDIAG_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "the program ran" not in proc.stderr and "Traceback" not in proc.stderr
