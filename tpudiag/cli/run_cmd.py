"""`tpudiag run -- python train.py ARGS`: run a program with dumps on, capture it, print its report.

The program runs unmodified in a child process. A generated `sitecustomize.py` on the child's
PYTHONPATH calls `tpudiag.profiling.bootstrap_child()`, which traces the run once it imports jax
(see there); any `sitecustomize` the environment already had is imported after it. The child's
environment gets the dump flags: `XLA_FLAGS=--xla_dump_to` always, LLO dumps
(`LIBTPU_INIT_ARGS=--xla_jf_dump_to`, the cheap `misc` category: spills and MXU use) on a TPU
host, each appended to what the user set, and never replacing a dump directory they chose.
On a machine with no accelerator (no TPU or GPU device files) the child gets `JAX_PLATFORMS=cpu`
unless the user set it, so an installed libtpu does not print its start-up noise ("could not
determine TPU accelerator type") into the run. When the report goes to stdout as JSON, the
program's own stdout goes to stderr, so what is meant to be parsed stays parseable. The program
runs in its own process group, which tpudiag forwards terminating signals to (`_run_child`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import Format, TerminalOrJson

RUN_HELP = """Run a program with compiler dumps on, capture it with jax.profiler, and print its report.

Everything after `--` is the command, e.g. `tpudiag run -- python train.py --lr 3e-4`. The
program runs unmodified: tpudiag starts jax.profiler in it when it imports jax, and traces the
whole run, or with --steps N..M only those steps of its jax.profiler.StepTraceAnnotation
(step_num, else their order) or, with --step-var NAME, of a loop variable of the script. Then the report of the new capture is printed, with the HLO
(and, on a TPU host, LLO) dumps joined. The trace and dumps go to a fresh temporary directory
named on stderr, or the trace to --logdir; so does JAX's device memory profile, taken as the trace
ends (`tpudiag memory --pprof` reads it). With --format json and no -o (the report on stdout), the
program's own stdout goes to stderr, so stdout is the JSON alone. Without a TPU or GPU, the program
runs with JAX_PLATFORMS=cpu unless set. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to tpudiag go to
the program, and tpudiag waits for it. Exit status: the program's (the report is printed anyway
when a capture exists), 126 or 127 when it cannot be started, or 2 when it succeeded but left no
capture (its temporary directory is then removed).
"""

MEMORY_PROFILE = "memory.prof"  # jax.profiler.save_device_memory_profile, as the traced window ends

SITECUSTOMIZE = '''\
# Written by `tpudiag run`: trace this program with jax.profiler (tpudiag.profiling.bootstrap_child).
import importlib, os, sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    from tpudiag.profiling import bootstrap_child
except ImportError:
    sys.path.append({root!r})
    from tpudiag.profiling import bootstrap_child
bootstrap_child()
# The environment's own sitecustomize, which this file shadows, still runs.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_self = sys.modules.pop("sitecustomize", None)
try:
    importlib.import_module("sitecustomize")
except ImportError:
    if _self is not None:  # none other: the import machinery expects this module back
        sys.modules["sitecustomize"] = _self
'''


def tpu_host() -> bool:
    """Whether this machine has TPU chips (their device files), so LLO dumps will be written."""
    dev = Path("/dev")
    return any(dev.glob("accel[0-9]*")) or any(p.name.isdigit() for p in (dev / "vfio").glob("*"))


def gpu_host() -> bool:
    """Whether this machine has GPUs (NVIDIA's or AMD's device files), where jax may use them."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()


def _has_flag(flags: str, name: str) -> str | None:
    """The value of `--name=value` in a flag string, or None. The string is only read: a quote it
    leaves open (the user's to fix, XLA's to judge) splits it at whitespace instead."""
    try:
        tokens = shlex.split(flags)
    except ValueError:
        tokens = flags.split()
    for token in tokens:
        if token.startswith(f"--{name}="):
            return token.split("=", 1)[1]
    return None


def child_env(config: dict, boot_dir: Path, dumps: Path, tpu: bool,
              gpu: bool = False) -> tuple[dict[str, str], Path, Path | None]:
    """The child's environment, and the XLA and LLO dump directories it will write.

    Without a TPU or GPU, jax runs on the CPU anyway: `JAX_PLATFORMS=cpu` (unless the user set
    it) keeps an installed libtpu from probing for a TPU and printing its start-up noise.
    """
    from tpudiag.profiling import CHILD_ENV

    env = dict(os.environ)
    if not tpu and not gpu and "JAX_PLATFORMS" not in env:
        env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(boot_dir) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[CHILD_ENV] = json.dumps(config)
    xla_flags = env.get("XLA_FLAGS", "")
    xla = _has_flag(xla_flags, "xla_dump_to")
    if xla is None:
        xla = str(dumps / "xla")
        env["XLA_FLAGS"] = f"{xla_flags} --xla_dump_to={xla}".strip()
    llo = None
    if tpu:
        args = env.get("LIBTPU_INIT_ARGS", "")
        llo = _has_flag(args, "xla_jf_dump_to")
        if llo is None:
            llo = str(dumps / "llo")
            env["LIBTPU_INIT_ARGS"] = (f"{args} --xla_jf_dump_to={llo} --xla_jf_dump_llo_text=true "
                                       "--xla_jf_dump_category_filter=misc").strip()
    return env, Path(xla), Path(llo) if llo else None


def route_flags(texts, command: str = "run") -> list[tuple[str, str]]:
    """(variable, `--NAME=VALUE`) for each `--xla-flag`: LIBTPU_INIT_ARGS when libtpu registers
    NAME, XLA_FLAGS when XLA does (`compiler.flags`); a UsageError for a flag that is not one flag,
    names neither registers or sets the dumps, which `command` owns (set XLA_FLAGS yourself for those)."""
    from tpudiag.compiler.flags import flag_registry, split_flag
    from tpudiag.errors import UsageError

    parsed = [split_flag(t) for t in texts]
    for name, _ in parsed:
        if "dump" in name.lower():
            raise UsageError(f"--xla-flag `{name}`: `{command}` sets the dumps it joins to the report itself",
                             hint="to dump elsewhere, set it in XLA_FLAGS or LIBTPU_INIT_ARGS: run keeps yours")
    if not parsed:
        return []
    registry = flag_registry()
    return [(registry.route(name).value, f"--{name}={value}") for name, value in parsed]


def added_flags(env: dict[str, str]) -> list[str]:
    """What tpudiag appended to each flag variable of the child, as `VAR += FLAGS`: each flag where
    its runtime registers it (`--xla_dump_to`: XLA's DebugOptions; `--xla_jf_*`: libtpu's)."""
    lines = []
    for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        before, after = os.environ.get(var, ""), env.get(var, "")
        if after != before and after.startswith(before):
            lines.append(f"{var} += {after[len(before):].strip()}")
    return lines


def joinable_dumps(xla: Path, llo: Path | None) -> tuple[list[Path], list[str]]:
    """The dump directories the report can read, and a note for each one it cannot."""
    from tpudiag.parsers.dump_dir import is_dump_directory
    from tpudiag.parsers.hlo_text import is_hlo_file

    dumps, notes = [], []
    if xla.is_dir() and any(is_hlo_file(f.name) for f in xla.iterdir()):  # TPU, CPU or GPU compiler's
        dumps.append(xla)
    else:
        notes.append(f"no HLO dump was written to `{xla}`")
    if llo is not None and llo.is_dir() and is_dump_directory(llo):
        dumps.append(llo)
    return dumps, notes


def _say(text: str) -> None:
    # One plain line: a console would wrap the paths, and the message must stay greppable
    from tpudiag.model.text import one_line

    sys.stderr.write(f"tpudiag run: {one_line(text)}\n")


# Signals that end a program, forwarded to it: tpudiag waits for the program, reports what it
# captured and exits with its status (a terminal's Ctrl-C and Ctrl-\ reach it directly when it holds
# the terminal, and through tpudiag when it does not).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1


def _terminal() -> int | None:
    """tpudiag's stdin when it is a terminal (its job's foreground or not), else None."""
    try:
        fd = sys.stdin.fileno()
        return fd if os.isatty(fd) else None
    except (OSError, ValueError, AttributeError):
        return None


def _hand_terminal(fd: int | None, to_pgid: int, from_pgid: int) -> None:
    """Make `to_pgid` the terminal's foreground group if `from_pgid` holds it now (a job in the
    background takes nothing); SIGTTOU ignored, as the caller may itself be in the background."""
    if fd is None:
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        if os.tcgetpgrp(fd) == from_pgid:
            os.tcsetpgrp(fd, to_pgid)
    except OSError:
        pass  # the terminal went away (a hangup): nothing to hand over
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _child_setup(terminal: int | None, parent_pgid: int, pdeathsig) -> None:
    """In the child, before exec: a process group of its own, holding the terminal (as a shell does
    for its job, so that reading it does not stop the program), and SIGTERM if tpudiag is killed outright."""
    os.setpgid(0, 0)
    _hand_terminal(terminal, os.getpgrp(), parent_pgid)
    if pdeathsig is not None:
        pdeathsig(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _pdeathsig():
    """libc's `prctl`, on Linux, for the child's parent-death signal; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _start_problem(command: list[str], exc: OSError | subprocess.SubprocessError):
    """The one-line error, with a shell's status, for a program that could not be started."""
    from tpudiag.errors import UsageError

    why = getattr(exc, "strerror", None) or str(exc)
    err = UsageError(f"cannot run `{command[0]}`: {why}",
                     hint="give a program that exists and is executable (e.g. `python train.py`)")
    err.exit_code = 127 if isinstance(exc, FileNotFoundError) else 126  # as a shell says
    return err


def _wait(proc: subprocess.Popen, terminal: int | None) -> int:
    """The program's exit status. On a terminal, when the program stops (Ctrl-Z, or reading the
    terminal from a background job), tpudiag takes the terminal back and stops too, so the shell
    sees the job stopped; on `fg` the program gets the terminal again and both go on."""
    ours = os.getpgrp()
    while True:
        try:
            _, status = os.waitpid(proc.pid, os.WUNTRACED if terminal is not None else 0)
        except ChildProcessError:
            return proc.returncode if proc.returncode is not None else 0
        if os.WIFSTOPPED(status):
            _hand_terminal(terminal, ours, proc.pid)
            os.kill(os.getpid(), signal.SIGSTOP)
            _hand_terminal(terminal, proc.pid, ours)  # resumed in the foreground (`fg`): the program's again
            try:
                os.killpg(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed while stopped: the next wait collects its status
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode


def _run_child(command: list[str], env: dict[str, str], stdout_to_stderr: bool = False) -> int:
    """Run the program in its own process group and wait for it, whatever tpudiag is sent.

    The group holds the terminal while it runs when tpudiag did (a shell's foreground job), so
    Ctrl-C and Ctrl-Z reach the program itself. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to tpudiag
    are forwarded to the group (each one not ignored when tpudiag started: under `nohup` a hangup
    stays ignored for both), and tpudiag keeps waiting, so the program's status comes back and
    nothing of it is left running. Killed outright, tpudiag takes the program with it (Linux's
    parent-death signal). `stdout_to_stderr`: the program's stdout goes to tpudiag's stderr (the
    report owns stdout).
    """
    sys.stdout.flush()
    proc: subprocess.Popen | None = None
    pending: list[int] = []  # arrived before the program had a process group

    def forward(signum, _frame) -> None:
        if proc is None:
            pending.append(signum)
            return
        try:
            os.killpg(proc.pid, signum)
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped program acts on it only once continued
        except ProcessLookupError:
            pass  # already gone: the wait collects its status

    previous = {}
    for sig in FORWARDED_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, forward)
    terminal, ours = _terminal(), os.getpgrp()
    pdeathsig = _pdeathsig()
    try:
        try:
            proc = subprocess.Popen(command, env=env, stdout=sys.stderr.fileno() if stdout_to_stderr else None,
                                    preexec_fn=lambda: _child_setup(terminal, ours, pdeathsig))
        except (OSError, subprocess.SubprocessError) as exc:  # missing, not executable, a directory,
            raise _start_problem(command, exc) from None         # not a program (ENOEXEC), ...
        _hand_terminal(terminal, proc.pid, ours)  # the child did too: whichever runs first, no read stops it
        for sig in pending:
            forward(sig, None)
        try:
            returncode = _wait(proc, terminal)
        finally:
            _hand_terminal(terminal, ours, proc.pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N, as a shell says


def run_command(
    command: Annotated[list[str] | None, typer.Argument(help="The program and its arguments, after `--`")] = None,
    steps: Annotated[str | None, typer.Option(help="Trace only steps N..M (or N) of the program's "
                                                   "jax.profiler.StepTraceAnnotation; default: the whole run")]
    = None,
    logdir: Annotated[Path | None, typer.Option(help="Write the trace here (a logdir: plugins/profile/<run>/); "
                                                     "default: a fresh temporary directory")] = None,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
    = TerminalOrJson.terminal,
    top: Annotated[int, typer.Option(help="Ops to list in the report")] = 15,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to this file instead of "
                                                "stdout, which the program's own output shares")] = None,
    step_var: Annotated[str | None, typer.Option(help="With --steps, also take step numbers from this variable "
                                                      "of the script (e.g. `step` of `for step in range(n):`), "
                                                      "for loops without step annotations")] = None,
    python_tracer: Annotated[bool, typer.Option(help="Also trace Python function calls (large captures)")]
    = False,
    xla_flag: Annotated[list[str] | None, typer.Option("--xla-flag", help="NAME=VALUE: a compiler flag for the "
                        "program, appended to LIBTPU_INIT_ARGS or XLA_FLAGS, whichever registers it (repeatable)")]
    = None,
) -> None:
    from tpudiag.errors import TpudiagError, UsageError
    from tpudiag.profiling import check_step_var, newest_new_run, no_capture_reason, parse_steps, run_dirs

    if not command:
        raise UsageError("no program to run", hint="put it after `--`: `tpudiag run -- python train.py`")
    routed = route_flags(xla_flag or ())  # usage errors before the program runs
    window = parse_steps(steps)
    check_step_var(step_var, window)
    if logdir is not None:
        logdir = _made_logdir(logdir)  # refused before the program runs
    work = Path(tempfile.mkdtemp(prefix="tpudiag-run-"))
    kept = False  # a run with no capture leaves no temporary directory behind
    try:
        if logdir is None:
            logdir = _made_logdir(work / "logdir")
        if output is not None:  # refused before the program runs, not after
            from tpudiag.writers.files import resolve_output

            resolve_output(output, [logdir])
        before = run_dirs(logdir)
        boot = work / "bootstrap"
        boot.mkdir()
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(Path(__file__).resolve().parents[2])))
        status_file = work / "child-status.json"
        config = {"logdir": str(logdir), "steps": [window.first, window.last] if window else None,
                  "status": str(status_file), "python_tracer": python_tracer, "step_var": step_var,
                  "pprof": str(work / MEMORY_PROFILE)}
        env, xla, llo = child_env(config, boot, work / "dumps", tpu_host(), gpu_host())
        for var, flag in routed:
            env[var] = f"{env.get(var, '')} {flag}".strip()
        where = f"trace in `{logdir}`, dumps in `{xla}`" + (f" and `{llo}`" if llo else "")
        _say(where)
        for line in added_flags(env):
            _say(line)
        # JSON on stdout must parse: the program's own output goes to stderr then (`-o -` is stdout too)
        parsed_stdout = output_format is TerminalOrJson.json and (output is None or str(output) == "-")
        if parsed_stdout:
            _say("the report is JSON on stdout: the program's own stdout goes to stderr")
        returncode = _run_child(command, env, stdout_to_stderr=parsed_stdout)
        run = newest_new_run(logdir, before)
        if run is None:
            _say(f"{no_capture_reason(None, status=_child_status(status_file))} "
                 f"(the program exited with status {returncode})")
            raise typer.Exit(returncode or 2)
        kept = True
    finally:
        if not kept:
            shutil.rmtree(work, ignore_errors=True)
    dumps, notes = joinable_dumps(xla, llo)
    for note in notes:
        _say(note)
    profile = work / MEMORY_PROFILE
    if profile.is_file():
        xla_dumps = "".join(f" --dumps {shlex.quote(str(d))}" for d in dumps if d == xla)
        _say(f"JAX's live device buffers as the trace ended are in `{profile}`; by source line, beside the "
             f"compiled peak: `tpudiag memory {shlex.quote(str(run))}{xla_dumps} --pprof {shlex.quote(str(profile))}`")
    _say(f"the program exited with status {returncode}; report of `{run}`")
    [report] = _REPORT
    try:
        report(path=run, dumps=dumps, output_format=Format(output_format.value), top=top, output=output)
    except TpudiagError as exc:  # the program's status still comes back, whatever the report met
        _say(f"no report: {exc.one_line()}")
        raise typer.Exit(returncode or 2) from None
    raise typer.Exit(returncode)


def _made_logdir(logdir: Path) -> Path:
    """`logdir`, resolved and made (with its parents); UsageError naming it when it cannot be."""
    from tpudiag.errors import UsageError

    if logdir.exists() and not logdir.is_dir():
        raise UsageError("--logdir exists and is not a directory", path=logdir)
    try:
        logdir = logdir.resolve()
        logdir.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as exc:  # under a file, unwritable, a symlink loop
        raise UsageError(f"--logdir cannot be made: {getattr(exc, 'strerror', None) or exc}", path=logdir) from None
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise UsageError("--logdir is not writable", path=logdir)
    return logdir


def _child_status(path: Path) -> dict | None:
    """The child's status file (`profiling.bootstrap_child`), None when it is missing or damaged."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


# `tpudiag report`, given by `register` (the report command lives in cli.app)
_REPORT: list = []


def register(app: typer.Typer, report) -> None:
    """Add `run`; `report` is the `tpudiag report` command, which prints the capture's report."""
    _REPORT[:] = [report]
    app.command("run", help=RUN_HELP,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_command)
