"""Capture a JAX program with `jax.profiler` and diagnose the capture: the run side of the loop.

Two ways in, one mechanism (`Tracer`):

- `tpudiag.profile()` in Python (a script or a notebook cell): traces the `with` block, or only
  steps N..M of it, and `p.diagnosis` is `tpudiag.diagnose()` of the capture. The compiled
  programs come from the HLO `jax.profiler` embeds in the capture, so no flags are needed.
- `tpudiag run -- python train.py` (`tpudiag.cli.run_cmd`): an unmodified script runs in a child
  process whose `sitecustomize` calls `bootstrap_child()`. That waits until the program imports
  jax, then traces the whole run (from the first backend initialisation to exit) or steps N..M.

Steps are the program's own `jax.profiler.StepTraceAnnotation`s: their `step_num`, else their
order (0, 1, ...). `jax.profiler.StepTraceAnnotation` is replaced by a subclass that starts the
trace on entering step N and stops it on leaving step M (or on entering a later step), so the
capture holds whole steps. Everything here imports jax only when a trace starts: `import
tpudiag` stays free of jax.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import InputError, UsageError
from tpudiag.parsers.input_files import TRACE_SUFFIX

if TYPE_CHECKING:
    from tpudiag.pipeline import Diagnosis

# The child's configuration, set by `tpudiag run`: {"logdir", "steps": [first, last] | null, "status"}.
CHILD_ENV = "TPUDIAG_RUN"
RUNS_DIR = ("plugins", "profile")
_STEPS = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class StepRange:
    """Steps `first`..`last`, both included, as numbered by the program's step annotations."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.last < self.first:
            raise UsageError(f"steps {self.first}..{self.last}: expected 0 <= N <= M")

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}..{self.last}"


def parse_steps(value: str | int | tuple[int, int] | range | StepRange | None) -> StepRange | None:
    """`N`, `"N..M"`, `(N, M)` or `range(N, M + 1)` -> StepRange; None -> the whole run or block."""
    if value is None or isinstance(value, StepRange):
        return value
    if isinstance(value, bool):
        raise UsageError(f"steps {value!r}: expected N, 'N..M', (N, M) or a range")
    if isinstance(value, int):
        return StepRange(value, value)
    if isinstance(value, range):
        if value.step != 1 or len(value) == 0:
            raise UsageError(f"steps {value!r}: expected a non-empty range with step 1")
        return StepRange(value.start, value.stop - 1)
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return StepRange(*value)
    m = _STEPS.match(str(value))
    if m is None:
        raise UsageError(f"steps `{value}`: expected N or N..M (step numbers, e.g. 10..12)")
    first = int(m.group(1))
    return StepRange(first, int(m.group(2)) if m.group(2) else first)


def run_dirs(logdir: Path) -> set[Path]:
    """The run directories under `logdir/plugins/profile` that hold at least one trace file."""
    root = Path(logdir).joinpath(*RUNS_DIR)
    if not root.is_dir():
        return set()
    return {p for p in root.iterdir() if p.is_dir() and any(f.name.endswith(TRACE_SUFFIX) for f in p.iterdir())}


def newest_new_run(logdir: Path, before: set[Path]) -> Path | None:
    """The newest run that was not under `logdir` before: never an older capture of someone else's."""
    new = run_dirs(logdir) - before
    return max(new, key=lambda p: (p.stat().st_mtime, p.name)) if new else None


class Tracer:
    """One `jax.profiler` trace into `logdir`: the whole time between start() and stop(), or steps N..M.

    With `steps`, start() only arms it: the trace runs from entering step `first` to leaving step
    `last` of the annotations (see `step_annotation_class`). What happened is kept for the
    message when no capture was made (`seen_steps`, `started`).
    """

    def __init__(self, logdir: Path, steps: StepRange | None = None, python_tracer: bool = False,
                 step_var: str | None = None, pprof: Path | None = None):
        self.logdir = Path(logdir)
        self.pprof = pprof  # where JAX's device memory profile goes as the trace ends (`tpudiag run`)
        self.steps = steps
        self.step_var = step_var  # a step-number variable also drives the window (`StepVariable`)
        self.python_tracer = python_tracer
        self.armed = False
        self.started = False
        self.finished = False
        self.seen_steps: list[int] = []  # first and last step number entered, for the no-capture message
        self._lock = threading.RLock()
        self._order = 0  # the number of the next annotation without `step_num`

    def start(self) -> None:
        with self._lock:
            self.armed = True
            if self.steps is None:
                self._begin()

    def stop(self) -> None:
        with self._lock:
            self.armed = False
            self._end()

    def step_number(self, kwargs: dict) -> int:
        with self._lock:
            num = kwargs.get("step_num")
            if not isinstance(num, int) or isinstance(num, bool):
                num = self._order
                self._order += 1
            self.saw(num)
            return num

    def saw(self, num: int) -> None:
        with self._lock:
            self.seen_steps = [num, num] if not self.seen_steps else [min(self.seen_steps[0], num),
                                                                      max(self.seen_steps[1], num)]

    def entering_step(self, num: int) -> None:
        with self._lock:
            if not self.armed or self.steps is None:
                return
            if self.started and num > self.steps.last:
                self._end()  # the program skipped past `last`: the capture ends with the steps it holds
            elif not self.started and not self.finished and self.steps.first <= num <= self.steps.last:
                self._begin()

    def left_step(self, num: int) -> None:
        with self._lock:
            if self.started and self.steps is not None and num >= self.steps.last:
                self._end()

    def _begin(self) -> None:
        if self.started or self.finished:
            return
        import jax

        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if self.python_tracer else 0
        self.logdir.mkdir(parents=True, exist_ok=True)
        try:
            _REAL["start_trace"](str(self.logdir), profiler_options=options)
        except RuntimeError as exc:  # jax's "Profile has already been started": one trace at a time
            if "already" not in str(exc):
                raise
            self.finished = True  # this tracer will not trace: its window is given up
            raise UsageError(f"a trace is already running (jax.profiler: {exc})",
                             hint="stop the other trace (`jax.profiler.stop_trace()`) first; "
                                  "traces cannot nest or overlap") from None
        self.started = True

    def _end(self) -> None:
        if self.started and not self.finished:
            self.finished = True
            self._save_memory_profile()
            _REAL["stop_trace"]()

    def _save_memory_profile(self) -> None:
        """JAX's live device buffers as the traced window ends (`jax.profiler.save_device_memory_profile`,
        a pprof file): what `tpudiag memory --pprof` attributes to source lines. Works on every backend,
        the CPU's included."""
        if self.pprof is None:
            return
        import jax

        try:
            jax.profiler.save_device_memory_profile(str(self.pprof))
        except Exception as exc:  # the runtime's own failure (any backend's error type): the trace must still stop
            _announce(f"no device memory profile ({type(exc).__name__}: {exc})")


# jax.profiler's own start/stop, kept before `_Installed` wraps them.
_REAL: dict = {}


def step_annotation_class(base: type, tracer: Tracer) -> type:
    """A `jax.profiler.StepTraceAnnotation` that also starts and stops `tracer` at its step window."""

    class StepTraceAnnotation(base):  # the name users see in reprs and tracebacks stays jax's
        __doc__ = base.__doc__

        def __init__(self, name: str, **kwargs):
            self._tpudiag_step = tracer.step_number(kwargs)
            # before the annotation is made: jax records it only when a trace is on at construction
            tracer.entering_step(self._tpudiag_step)
            super().__init__(name, **kwargs)

        def __exit__(self, *exc):
            result = super().__exit__(*exc)
            tracer.left_step(self._tpudiag_step)
            return result

    StepTraceAnnotation.__module__ = base.__module__
    StepTraceAnnotation.__qualname__ = base.__qualname__
    return StepTraceAnnotation


class StepVariable(threading.Thread):
    """Drives a tracer from a step-number variable of the program, for loops without step annotations.

    Every `interval_s` it reads `name` in the watched thread's innermost frame of the watched code
    that has it (a local, such as `for step in range(n):` inside `main()`, else a global); a new
    integer value is a step beginning. The watched code is the frames whose globals are `scope`
    (a profiled block's module), or with `scope=None` the frames of `__main__` (a script).
    So steps N..M run from the assignment of N to that of M + 1 (or the end of the program), but
    only approximately: the watcher notices a new value within one interval plus the thread's
    scheduling delay, and starting a trace takes milliseconds more, so on a busy machine the
    start of step N can be cut and the start of step M + 1 included. Step annotations are exact.
    A trace with no step annotation has no step markers of its own (on a TPU, tpudiag
    takes steps from the module executions).
    """

    def __init__(self, tracer: Tracer, name: str, thread_id: int, scope: dict | None = None,
                 interval_s: float = 0.001):
        super().__init__(name="tpudiag-step-variable", daemon=True)
        self.tracer, self.variable, self.thread_id, self.interval_s = tracer, name, thread_id, interval_s
        self.scope = scope
        self.done = threading.Event()

    def _watched(self, frame) -> bool:
        if self.scope is not None:
            return frame.f_globals is self.scope
        return frame.f_globals.get("__name__") == "__main__"

    def value(self) -> int | None:
        frame = sys._current_frames().get(self.thread_id)
        while frame is not None:
            if self._watched(frame):
                for scope in (frame.f_locals, frame.f_globals):
                    value = scope.get(self.variable)
                    if isinstance(value, int) and not isinstance(value, bool):
                        return value
            frame = frame.f_back
        return None

    def run(self) -> None:
        last = None
        while not self.done.is_set() and not self.tracer.finished:
            value = self.value()
            if value is not None and value != last:
                self.tracer.saw(value)
                self.tracer.entering_step(value)
                last = value
            self.done.wait(self.interval_s)


class _Installed:
    """jax.profiler patched for one tracer; `restore()` puts jax's own objects back."""

    def __init__(self, tracer: Tracer, announce):
        try:
            import jax.profiler
            from jax._src import profiler as jax_profiler
        except ImportError as exc:
            raise UsageError(f"tracing needs jax, which cannot be imported: {exc}",
                             hint="install jax for your accelerator (`pip install jax`, or the tpu extra)") from None

        self._saved = [(mod, name, getattr(mod, name)) for mod in (jax.profiler, jax_profiler)
                       for name in ("StepTraceAnnotation", "start_trace", "stop_trace")]
        _REAL.setdefault("start_trace", jax_profiler.start_trace)
        _REAL.setdefault("stop_trace", jax_profiler.stop_trace)
        step_class = step_annotation_class(jax_profiler.StepTraceAnnotation, tracer)

        def start_trace(log_dir, *args, **kwargs):
            # The program's own trace would collide with this one ("only one profile at a time")
            if tracer.armed:
                announce(f"the program's jax.profiler.start_trace(`{log_dir}`) is skipped: tpudiag is "
                         f"tracing into `{tracer.logdir}`")
                return None
            return _REAL["start_trace"](log_dir, *args, **kwargs)

        def stop_trace():
            if tracer.armed:
                return None
            return _REAL["stop_trace"]()

        for mod in (jax.profiler, jax_profiler):
            mod.StepTraceAnnotation = step_class
            mod.start_trace = start_trace
            mod.stop_trace = stop_trace

    def restore(self) -> None:
        for mod, name, value in self._saved:
            setattr(mod, name, value)


# --- the notebook / script side: tpudiag.profile() ---


class Profile:
    """What `with tpudiag.profile() as p:` gives: the capture's paths, then `p.diagnosis`.

    `run_dir` is the capture's run directory once the block has ended (None when no capture was
    made, e.g. the block never reached step N); `diagnosis` diagnoses it on first use.
    """

    def __init__(self, logdir: Path | str | None = None, steps=None, *, step_var: str | None = None,
                 python_tracer: bool = False, diagnose_kwargs: dict | None = None):
        from tpudiag import arguments
        from tpudiag.pipeline import check_diagnose_arguments

        # Every argument checked here, at the call: not after the block has run
        arguments.check_path(logdir, "logdir")
        self.steps = parse_steps(steps)
        check_step_var(step_var, self.steps)
        arguments.check_flag(python_tracer, "python_tracer")
        diagnose_kwargs = check_diagnose_arguments(dict(diagnose_kwargs or {}), "tpudiag.profile (passed on to "
                                                   "tpudiag.diagnose)")
        if "path" in diagnose_kwargs:
            raise UsageError("path is not an argument of tpudiag.profile: the capture it makes is diagnosed")
        self.fresh = logdir is None
        self.logdir = Path(tempfile.mkdtemp(prefix="tpudiag-profile-")) if logdir is None else _made_logdir(logdir)
        self.run_dir: Path | None = None
        self._tracer = Tracer(self.logdir, self.steps, python_tracer, step_var)
        self._watcher: StepVariable | None = None
        self._diagnose_kwargs = dict(diagnose_kwargs or {})
        self._diagnosis = None
        self._before: set[Path] = set()
        self._installed: _Installed | None = None

    def __enter__(self) -> Profile:
        if _ACTIVE:
            raise UsageError(f"a trace is already running: `tpudiag.profile()` into `{_ACTIVE[-1].logdir}` "
                             "has not ended", hint="end that block first; profiles cannot nest or overlap")
        self._before = run_dirs(self.logdir)
        self._installed = _Installed(self._tracer, _announce)
        try:
            self._tracer.start()
        except BaseException:
            self._installed.restore()
            raise
        _ACTIVE.append(self)
        if self._tracer.step_var:
            # the code of the block: the frames of the module that entered it
            self._watcher = StepVariable(self._tracer, self._tracer.step_var, threading.get_ident(),
                                         scope=sys._getframe(1).f_globals)
            self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.done.set()
            self._watcher.join()
        try:
            self._tracer.stop()
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            if self._installed is not None:
                self._installed.restore()
        self.run_dir = newest_new_run(self.logdir, self._before)

    def step(self, name: str = "train", **kwargs):
        """`jax.profiler.StepTraceAnnotation(name, **kwargs)`, which also starts/stops the step window."""
        import jax.profiler

        return jax.profiler.StepTraceAnnotation(name, **kwargs)

    @property
    def diagnosis(self) -> Diagnosis:
        """`tpudiag.diagnose()` of the capture (made once, on first use)."""
        if self._diagnosis is None:
            if self.run_dir is None:
                raise InputError(no_capture_reason(self._tracer, inside="the block"), path=self.logdir)
            from tpudiag.pipeline import diagnose

            self._diagnosis = diagnose(self.run_dir, **self._diagnose_kwargs)
        return self._diagnosis

    def __repr__(self) -> str:
        where = self.run_dir if self.run_dir is not None else self.logdir
        return f"<tpudiag.Profile {str(where)!r}{f' steps {self.steps}' if self.steps else ''}>"


def profile(logdir: Path | str | None = None, steps=None, *, step_var: str | None = None,
            python_tracer: bool = False, **diagnose_kwargs) -> Profile:
    """Trace a block with `jax.profiler` and diagnose it: `with tpudiag.profile() as p: ...; p.diagnosis`.

    logdir: where the capture goes (default: a fresh temporary directory, `p.logdir`); a logdir
    that already holds runs keeps them, and only the new run is diagnosed.
    steps: None traces the whole block; N, "N..M", (N, M) or range(N, M + 1) trace only those
    steps of `jax.profiler.StepTraceAnnotation` (or `p.step(...)`) inside the block.
    step_var: with `steps`, also take step numbers from this variable of the code in the block
      (e.g. "step" for `for step in range(n):`; see `StepVariable`), for loops without annotations.
    python_tracer: also record Python function calls (large captures; off by default).
    Other keyword arguments go to `tpudiag.diagnose` (`config`, `select`, `chip`, ...).
    """
    return Profile(logdir, steps, step_var=step_var, python_tracer=python_tracer, diagnose_kwargs=diagnose_kwargs)


def check_step_var(step_var: str | None, steps: StepRange | None) -> None:
    if step_var is None:
        return
    if not isinstance(step_var, str):
        raise UsageError(f"step_var must be the name of a variable (a str), got {step_var!r:.40}")
    if not step_var.isidentifier():
        raise UsageError(f"step variable `{step_var}` is not a Python name")
    if steps is None:
        raise UsageError("a step variable chooses steps: give the steps too (N or N..M)")


def no_capture_reason(tracer: Tracer | None, inside: str = "the program", status: dict | None = None) -> str:
    """Why no capture was made, in one line, from what the tracer (or the child's status file) saw."""
    if tracer is not None:
        steps, seen, started, step_var = tracer.steps, tracer.seen_steps, tracer.started, tracer.step_var
    elif status is None:
        return (f"no capture was made: tpudiag's bootstrap never ran in {inside} (not Python, or Python "
                "started with -I or -S, which skip sitecustomize)")
    else:
        if not status.get("exited"):
            return (f"no capture was made: {inside} ended without running its exit handlers (a signal or "
                    "os._exit), so the trace was never written")
        if not status.get("jax_imported"):
            return f"no capture was made: {inside} never imported jax"
        steps = StepRange(*status["steps"]) if status.get("steps") else None
        seen, started = status.get("seen_steps") or [], bool(status.get("started"))
        step_var = status.get("step_var")
    if steps is not None and not seen:
        source = "entered no jax.profiler.StepTraceAnnotation" + (
            f" and never set `{step_var}` to a step number" if step_var else "")
        return f"no capture was made: {inside} {source}, so steps {steps} never began"
    if steps is not None and not started:
        return f"no capture was made: {inside} ran steps {seen[0]}..{seen[1]}, none of {steps}"
    return f"no capture was made: {inside} ended before the trace was written"


def _made_logdir(logdir: Path | str) -> Path:
    """`profile()`'s logdir, made now (with its parents): a logdir that cannot be is refused at the call."""
    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a directory", path=path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # under a file, unwritable
        raise InputError(f"cannot be made a logdir: {exc.strerror or exc}", path=path) from None
    return path


# The `tpudiag.profile()` blocks running now (at most one: jax traces one at a time).
_ACTIVE: list[Profile] = []


def _announce(text: str) -> None:
    sys.stderr.write(f"tpudiag: {text}\n")


# --- the child side of `tpudiag run` ---


class _AfterImport:
    """A one-shot import hook: runs `callback(module)` once module `name` has finished importing."""

    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        callback = self.callback

        def exec_module(module):
            original(module)
            loader.exec_module = original
            callback(module)

        loader.exec_module = exec_module
        return spec


def bootstrap_child() -> None:
    """In `tpudiag run`'s child: trace the program once it imports jax (called from sitecustomize).

    The configuration is removed from the environment once tracing is set up, so processes the
    program starts are not traced into the same logdir.
    """
    raw = os.environ.get(CHILD_ENV)
    if not raw:
        return
    try:
        config = json.loads(raw)
        tracer = Tracer(Path(config["logdir"]), StepRange(*config["steps"]) if config.get("steps") else None,
                        bool(config.get("python_tracer")), config.get("step_var"),
                        Path(config["pprof"]) if config.get("pprof") else None)
        status_path = Path(config["status"])
    except (ValueError, KeyError, TypeError) as exc:
        _announce(f"ignoring a malformed {CHILD_ENV} ({exc}): not tracing")
        return
    status = {"exited": False, "jax_imported": False, "started": False, "seen_steps": [],
              "steps": config.get("steps"), "step_var": tracer.step_var}

    def write_status(exiting: bool = True) -> None:
        status.update(exited=exiting, started=tracer.started, seen_steps=tracer.seen_steps)
        try:
            status_path.write_text(json.dumps(status))
        except OSError:
            pass  # the parent then says only that no capture was made

    def on_jax(_module) -> None:
        os.environ.pop(CHILD_ENV, None)
        status["jax_imported"] = True
        _Installed(tracer, _announce)
        # atexit runs the last registered first: this stop runs before jax's own exit handlers
        # (registered at its import) clear the backends, and before `write_status`
        atexit.register(tracer.stop)
        _stop_on_termination(tracer)
        if tracer.steps is not None:
            tracer.start()
            if tracer.step_var:
                StepVariable(tracer, tracer.step_var, threading.main_thread().ident).start()
            return
        tracer.armed = True  # the program's own start_trace is skipped from now on
        _start_at_backend_init(tracer)

    write_status(exiting=False)  # the bootstrap ran: a status without `exited` means it was killed
    atexit.register(write_status)
    if "jax" in sys.modules:
        on_jax(sys.modules["jax"])
    else:
        sys.meta_path.insert(0, _AfterImport("jax", on_jax))


# Signals that end a program without its exit handlers, by default: `tpudiag run` forwards them.
_TERMINATING = ("SIGTERM", "SIGHUP")


def _stop_on_termination(tracer: Tracer) -> None:
    """For each terminating signal the program leaves at its default: write the trace first, then
    end as the signal would (the program's status stays "killed by signal N"). A handler the
    program installs later replaces this one, as it would the default."""
    import signal

    def on_signal(signum, _frame) -> None:
        try:
            tracer.stop()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for name in _TERMINATING:
        sig = getattr(signal, name, None)
        if sig is not None and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, on_signal)


def _start_at_backend_init(tracer: Tracer) -> None:
    """Start the whole-run trace when jax first initialises its backends, not at `import jax`.

    `jax.profiler.start_trace` initialises the backends itself, and a program may still need to
    configure them after importing jax (`jax.distributed.initialize()`, `jax_platforms`). jax
    versions without `xla_bridge.backends` get the trace started at import.
    """
    from jax._src import xla_bridge

    original = getattr(xla_bridge, "backends", None)
    if original is None or xla_bridge.backends_are_initialized():
        tracer.start()
        return
    busy = threading.local()

    def backends():
        result = original()
        if not getattr(busy, "on", False) and not tracer.started:
            busy.on = True
            try:
                xla_bridge.backends = original
                tracer.start()
            finally:
                busy.on = False
        return result

    xla_bridge.backends = backends
