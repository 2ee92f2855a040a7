"""`tpudiag run` owns its child (issue 33): programs that cannot start, a bad --logdir, the user's
XLA_FLAGS, signals sent to tpudiag, and the temporary directories of runs that captured nothing.

The children here are small Python programs that never import jax, so each test takes about a
second; the traced case (a jax program ended by SIGTERM) is in `test_run_cli.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tpudiag.cli.run_cmd import child_env


def _env(tmp_path: Path) -> dict[str, str]:
    temp = tmp_path / "temp"
    temp.mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
    return {**inherited, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "TMPDIR": str(temp), "NO_COLOR": "1"}


def _run(tmp_path: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpudiag", "run", *args], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120, cwd=tmp_path, **kwargs)


def _left_behind(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "temp").glob("tpudiag-run-*"))


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("kind, status, cause", [
    ("missing", 127, "No such file or directory"),
    ("no exec bit", 126, "Permission denied"),
    ("a directory", 126, "Permission denied"),
    ("garbage with the exec bit", 126, "Exec format error"),
])
def test_a_program_that_cannot_start_is_one_line_with_a_shells_status(tmp_path, kind, status, cause):
    program = tmp_path / "prog"
    if kind == "no exec bit":
        program.write_text("#!/bin/sh\necho ran\n")
    elif kind == "a directory":
        program.mkdir()
    elif kind == "garbage with the exec bit":
        program.write_bytes(b"\x00\x01garbage\xff" * 10)
        program.chmod(0o755)
    proc = _run(tmp_path, "--", str(program))
    assert proc.returncode == status
    line = _one_error_line(proc)
    assert f"cannot run `{program}`" in line and cause in line
    assert _left_behind(tmp_path) == []


@pytest.mark.parametrize("where", ["under a file", "/dev/null/x"])
def test_a_bad_logdir_is_refused_before_the_program_starts(tmp_path, where):
    (tmp_path / "a_file").write_text("")
    logdir = tmp_path / "a_file" / "logs" if where == "under a file" else Path(where)
    marker = tmp_path / "ran"
    proc = _run(tmp_path, "--logdir", str(logdir), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert str(logdir) in line and "--logdir" in line
    assert not marker.exists()  # refused before the program started
    assert _left_behind(tmp_path) == []


def test_a_run_with_no_capture_leaves_no_temporary_directory(tmp_path):
    proc = _run(tmp_path, "--", sys.executable, "-c", "import sys; sys.exit(4)")
    assert proc.returncode == 4 and "no capture was made" in proc.stderr
    assert _left_behind(tmp_path) == []


def test_the_users_xla_flags_pass_through_untouched_with_an_open_quote(tmp_path, monkeypatch):
    # Regression (issue 33): shlex.split of the user's flags raised "No closing quotation".
    flags = "--xla_cpu_foo='a b  --xla_cpu_bar=\"x"
    monkeypatch.setenv("XLA_FLAGS", flags)
    env, xla, _ = child_env({}, tmp_path / "boot", tmp_path / "dumps", tpu=False)
    assert env["XLA_FLAGS"] == f"{flags} --xla_dump_to={tmp_path / 'dumps' / 'xla'}"  # theirs as given, ours after
    assert xla == tmp_path / "dumps" / "xla"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/theirs --xla_cpu_foo='open")
    env, xla, _ = child_env({}, tmp_path / "boot", tmp_path / "dumps", tpu=False)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/theirs --xla_cpu_foo='open" and xla == Path("/theirs")


# A program that starts a grandchild in its own process group, says both pids, then waits.
# With TRAP set it ends with status 7 on SIGTERM, after a moment (tpudiag must wait for it).
WAITER = """\
import os, signal, subprocess, sys, time
if os.environ.get("TRAP"):
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(7)))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def test_a_stopped_program_still_ends_on_a_forwarded_signal(tmp_path):
    # A stopped program acts on a signal only once continued: tpudiag sends SIGCONT after it.
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "run", "--", sys.executable, str(script), str(pids)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
                            cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        program, _ = map(int, pids.read_text().split())
        os.kill(program, signal.SIGSTOP)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr


@pytest.mark.parametrize("sig, trap, status", [
    (signal.SIGTERM, False, 128 + signal.SIGTERM),
    (signal.SIGHUP, False, 128 + signal.SIGHUP),
    (signal.SIGINT, False, 128 + signal.SIGINT),
    (signal.SIGTERM, True, 7),
])
def test_a_signal_to_tpudiag_reaches_the_program_and_its_status_comes_back(tmp_path, sig, trap, status):
    # Regression (issue 33): SIGTERM or SIGHUP to `tpudiag run` left the program running, re-parented.
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    pids = tmp_path / "pids"
    env = {**_env(tmp_path), **({"TRAP": "1"} if trap else {})}
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "run", "--", sys.executable, str(script), str(pids)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)  # a shell's job: no terminal, its own group
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        program, grandchild = map(int, pids.read_text().split())
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, stderr
    # (the program's own KeyboardInterrupt traceback may be there: none from tpudiag)
    assert "tpudiag/cli" not in stderr and f"exited with status {status}" in stderr
    deadline = time.monotonic() + 10
    while (_alive(program) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(program) and not _alive(grandchild)  # nothing of it is left running
    assert _left_behind(tmp_path) == []


# What both terminal drivers do with the terminal's output: collect it until `text` shows.
READ_UNTIL = """
def read_until(text, timeout_s=30):
    end = time.monotonic() + timeout_s
    while text not in out and time.monotonic() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out.extend(os.read(fd, 4096))
            except OSError:
                return
"""

# Drives `tpudiag run` on a new terminal, in a fresh interpreter (forking pytest's own process,
# which may hold jax's threads, is unsafe): types a line, Ctrl-Z, SIGCONT (as `fg`), then Ctrl-C.
TERMINAL_DRIVER = """\
import json, os, pty, select, signal, sys, time
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pid, fd = pty.fork()
if pid == 0:  # tpudiag on the new terminal: its session's foreground job
    os.execve(argv[0], argv, env)
out, reaped, stopped, status = bytearray(), False, False, None
{read_until}
try:
    read_until(b"q? ")
    os.write(fd, b"hello\\n")
    read_until(b"got hello")
    os.write(fd, b"\\x1a")  # Ctrl-Z
    _, st = os.waitpid(pid, os.WUNTRACED)
    stopped = os.WIFSTOPPED(st)
    os.kill(pid, signal.SIGCONT)
    time.sleep(0.5)
    os.write(fd, b"\\x03")  # Ctrl-C: to the program, which holds the terminal again
    read_until(b"exited with status")
    _, st = os.waitpid(pid, 0)
    reaped, status = True, os.waitstatus_to_exitcode(st)
finally:
    if not reaped:  # only a pid still ours
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
print(json.dumps({"out": out.decode(errors="replace"), "stopped": stopped, "status": status}))
""".replace("{read_until}", READ_UNTIL)


def test_on_a_terminal_the_program_reads_it_and_takes_ctrl_c_and_ctrl_z(tmp_path):
    # The program runs in its own process group, so it must hold the terminal to read it; Ctrl-Z
    # stops tpudiag too (the shell sees the job stopped) and SIGCONT (`fg`) resumes both.
    import json

    code = "import time; print('got', input('q? ')); time.sleep(60)"
    argv = [sys.executable, "-m", "tpudiag", "run", "--", sys.executable, "-c", code]
    proc = subprocess.run([sys.executable, "-c", TERMINAL_DRIVER, json.dumps(argv), json.dumps(_env(tmp_path))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert "got hello" in result["out"] and result["stopped"], result
    assert result["status"] == 130, result


# A shell's background job on a terminal: `tpudiag run` started in a process group that does not
# hold the terminal; the program's read of it stops the program, tpudiag stops too (the shell sees
# the job stopped), and `fg` (the terminal handed to tpudiag's group, SIGCONT) lets it finish.
BACKGROUND_JOB = """\
import json, os, pty, select, sys, time
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
shell = r'''
import os, signal, subprocess, sys, json
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
p = subprocess.Popen(json.loads(sys.argv[1]), process_group=0)
_, st = os.waitpid(p.pid, os.WUNTRACED)
print("job stopped:", os.WIFSTOPPED(st), flush=True)
os.tcsetpgrp(0, p.pid)
os.killpg(p.pid, signal.SIGCONT)
_, st = os.waitpid(p.pid, 0)
os.tcsetpgrp(0, os.getpgrp())
print("job ended:", os.waitstatus_to_exitcode(st), "END", flush=True)
'''
pid, fd = pty.fork()
if pid == 0:
    os.execve(sys.executable, [sys.executable, "-c", shell, json.dumps(argv)], env)
out = bytearray()
{read_until}
try:
    read_until(b"job stopped")
    time.sleep(0.5)
    os.write(fd, b"hello\\n")
    read_until(b" END")
finally:
    end = time.monotonic() + 10
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > end:  # hung: its session gets the hangup, which tpudiag forwards
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.05)
print(json.dumps(out.decode(errors="replace")))
""".replace("{read_until}", READ_UNTIL)


def test_a_background_job_that_reads_the_terminal_stops_and_goes_on_with_fg(tmp_path):
    import json

    argv = [sys.executable, "-m", "tpudiag", "run", "--", sys.executable, "-c", "print('got', input('q? '))"]
    proc = subprocess.run([sys.executable, "-c", BACKGROUND_JOB, json.dumps(argv), json.dumps(_env(tmp_path))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "job stopped: True" in out and "got hello" in out, out
    assert "job ended: 2" in out, out  # it succeeded, but never imported jax: no capture
