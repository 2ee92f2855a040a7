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
program's own stdout goes to stderr, so what is meant to be parsed stays parseable.
"""

from __future__ import annotations

import json
import os
import shlex
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
named on stderr, or the trace to --logdir. With --format json and no -o (the report on stdout), the
program's own stdout goes to stderr, so stdout is the JSON alone. Without a TPU or GPU, the program
runs with JAX_PLATFORMS=cpu unless set. Exit status: the program's (the report is printed
anyway when a capture exists), or 2 when it succeeded but left no capture.
"""

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
    """The value of `--name=value` in a flag string, or None."""
    for token in shlex.split(flags):
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
    from tpudiag.parsers.dump_dir import HLO_SUFFIX, is_dump_directory

    dumps, notes = [], []
    if xla.is_dir() and any(f.name.endswith(HLO_SUFFIX) for f in xla.iterdir()):
        dumps.append(xla)
    elif xla.is_dir() and any(xla.glob("*.cpu_after_optimizations.txt")):
        notes.append(f"the HLO dumps in `{xla}` are the CPU compiler's: not joined (the report reads TPU programs)")
    else:
        notes.append(f"no HLO dump was written to `{xla}`")
    if llo is not None and llo.is_dir() and is_dump_directory(llo):
        dumps.append(llo)
    return dumps, notes


def _say(text: str) -> None:
    # One plain line: a console would wrap the paths, and the message must stay greppable
    from tpudiag.model.text import one_line

    sys.stderr.write(f"tpudiag run: {one_line(text)}\n")


def _run_child(command: list[str], env: dict[str, str], stdout_to_stderr: bool = False) -> int:
    """Run the program in the foreground; Ctrl-C goes to it (same process group), not to tpudiag.

    `stdout_to_stderr`: the program's stdout goes to tpudiag's stderr (the report owns stdout).
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stdout.flush()
        proc = subprocess.Popen(command, env=env, stdout=sys.stderr.fileno() if stdout_to_stderr else None,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        returncode = proc.wait()
    except FileNotFoundError as exc:
        from tpudiag.errors import UsageError

        raise UsageError(f"cannot run `{command[0]}`: {exc.strerror}") from None
    finally:
        signal.signal(signal.SIGINT, previous)
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
) -> None:
    from tpudiag.errors import TpudiagError, UsageError
    from tpudiag.profiling import check_step_var, newest_new_run, no_capture_reason, parse_steps, run_dirs

    if not command:
        raise UsageError("no program to run", hint="put it after `--`: `tpudiag run -- python train.py`")
    window = parse_steps(steps)
    check_step_var(step_var, window)
    work = Path(tempfile.mkdtemp(prefix="tpudiag-run-"))
    if logdir is None:
        logdir = work / "logdir"
    elif logdir.exists() and not logdir.is_dir():
        raise UsageError("--logdir exists and is not a directory", path=logdir)
    logdir = logdir.resolve()
    logdir.mkdir(parents=True, exist_ok=True)
    if output is not None:  # refused before the program runs, not after
        from tpudiag.writers.files import resolve_output

        resolve_output(output, [logdir])
    before = run_dirs(logdir)
    boot = work / "bootstrap"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(Path(__file__).resolve().parents[2])))
    status_file = work / "child-status.json"
    config = {"logdir": str(logdir), "steps": [window.first, window.last] if window else None,
              "status": str(status_file), "python_tracer": python_tracer, "step_var": step_var}
    env, xla, llo = child_env(config, boot, work / "dumps", tpu_host(), gpu_host())
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
        status = json.loads(status_file.read_text()) if status_file.is_file() else None
        _say(f"{no_capture_reason(None, status=status)} (the program exited with status {returncode})")
        raise typer.Exit(returncode or 2)
    dumps, notes = joinable_dumps(xla, llo)
    for note in notes:
        _say(note)
    _say(f"the program exited with status {returncode}; report of `{run}`")
    [report] = _REPORT
    try:
        report(path=run, dumps=dumps, output_format=Format(output_format.value), top=top, output=output)
    except TpudiagError as exc:  # the program's status still comes back, whatever the report met
        _say(f"no report: {exc.one_line()}")
        raise typer.Exit(returncode or 2) from None
    raise typer.Exit(returncode)


# `tpudiag report`, given by `register` (the report command lives in cli.app)
_REPORT: list = []


def register(app: typer.Typer, report) -> None:
    """Add `run`; `report` is the `tpudiag report` command, which prints the capture's report."""
    _REPORT[:] = [report]
    app.command("run", help=RUN_HELP,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_command)
