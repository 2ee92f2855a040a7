"""Run one deviceless TPU compile in a worker subprocess and keep only the dumps tpudiag reads.

Output directory layout (what `tpudiag simulate` and the static report read):

    result.json          compile facts from the worker, plus the driver's wall time and flags
    compiled.hlo.txt     `compiled.as_text()` (with the static profile: per-op estimated cycles)
    module.pb            the optimised HloModuleProto (embedded in modelled captures)
    xla/                 `--xla_dump_to`, trimmed to the main module's after-optimizations HLO,
                         buffer assignment, memory-usage report and target arguments
    llo/                 `--xla_jf_dump_to` with `category_filter=misc`, trimmed to the files the
                         LLO parser reads (the TLP bundle profile)
    static_profile/      `--xla_jf_dump_static_llo_profile_to`: one textproto per HLO op
    compiler-stderr.txt  the compiler's stderr (tail), for failures and for the record

Failures become one-line `TpudiagError`s quoting the compiler's own error line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpudiag.compiler.topology import Topology
from tpudiag.compiler.worker import EXIT_COMPILE_ERROR, EXIT_INPUT_ERROR
from tpudiag.errors import InputError, TpudiagError
from tpudiag.model.compile_output import HLO_PROTO_FILE, HLO_TEXT_FILE, LLO_DIR, PROFILE_DIR, RESULT_FILE, XLA_DIR

STDERR_FILE = "compiler-stderr.txt"
STDERR_KEEP_BYTES = 64 * 1024
XLA_KEEP_SUFFIXES = (
    ".after_optimizations.txt",
    ".after_optimizations-buffer-assignment.txt",
    ".after_optimizations-memory-usage-report.txt",
    ".after_optimizations-live-range.txt",  # what is live when the temporaries peak (`tpudiag memory`)
    ".oom_intermediate_module.txt",  # written only when the compile ran out of memory
    ".target_arguments.txt",
)
# glog fatal lines: `F1129 22:10:00.123456   1234 file.cc:123] message`
_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+\s+(?P<where>[^\]]+)\]\s*(?P<message>.*)$")
_CHECK = re.compile(r"(Check failed|LLO_CHECK|RESOURCE_EXHAUSTED|INVALID_ARGUMENT|INTERNAL:)")
DEFAULT_TIMEOUT_S = 900.0
# Waits past this overflow the platform's timers (poll's milliseconds are a C int: about 24 days), so a
# longer timeout (`--timeout-s 1e308`) waits this long: no limit in practice.
MAX_WAIT_S = 1_000_000.0


def wait_limit_s(timeout_s: float) -> float:
    """`timeout_s`, at most MAX_WAIT_S: what a subprocess or queue wait can be given."""
    return min(timeout_s, MAX_WAIT_S)


class CompileError(TpudiagError):
    """The compiler rejected or aborted on the program; the message quotes its own error line."""


@dataclass(frozen=True)
class CompileRun:
    """A finished compile: where its dumps are and what the worker reported."""

    out: Path
    topology: Topology
    facts: dict  # result.json as written (worker facts + driver fields)
    static_profile: bool
    wall_s: float

    @property
    def dump_bytes(self) -> int:
        return dump_size(self.out)


def dump_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def libtpu_flags(out: Path, static_profile: bool, extra: tuple[str, ...] = ()) -> list[str]:
    flags = [f"--xla_jf_dump_to={out / LLO_DIR}", "--xla_jf_dump_llo_text=true",
             "--xla_jf_dump_category_filter=misc"]
    if static_profile:
        flags.append(f"--xla_jf_dump_static_llo_profile_to={out / PROFILE_DIR}")
    return flags + list(extra)


def dump_options(out: Path, static_profile: bool) -> list[str]:
    """The dump flags of a compile into `out`, its path written `<out>`: what `whatif` checks to be
    the same for the baseline and every variant before it compares them."""
    flags = [f"--xla_dump_to={out / XLA_DIR}", *libtpu_flags(out, static_profile)]
    return [f.replace(str(out), "<out>") for f in flags]


def worker_env(out: Path, static_profile: bool, extra: tuple[str, ...] = (),
               xla_flags: tuple[str, ...] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # `cpu` would hide the TPU plugin that compiles for the topology
    env.update(TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               XLA_FLAGS=" ".join([f"--xla_dump_to={out / XLA_DIR}", *xla_flags]),
               LIBTPU_INIT_ARGS=" ".join(libtpu_flags(out, static_profile, extra)))
    # The worker must import this tpudiag, wherever the command was started.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def compiler_error_line(stderr: str) -> str | None:
    """The compiler's own fatal line from stderr: the first glog `F` line, else a CHECK/status line."""
    lines = stderr.splitlines()
    for line in lines:
        if line.startswith("ERROR: Unknown command line flag"):  # libtpu's flag parser, before any noise
            return line.strip()
    for line in lines:
        m = _FATAL.match(line.strip())
        if m:
            return f"{m.group('message').strip()} ({m.group('where').strip()})"
    for line in lines:
        if _CHECK.search(line):
            return line.strip()
    return None


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def _compile_error(topology: Topology, result: dict) -> CompileError:
    """The compiler's error as one line; VMEM OOMs get their budget, parsed by the LLO parser."""
    from tpudiag.parsers.llo import parse_vmem_oom

    message = result["message"].strip().rstrip(":")
    if result.get("stage") == "import":
        return CompileError(f"cannot compile for {topology.name}: {message}",
                            hint="deviceless TPU compiles need jax with libtpu: `pip install -e \".[tpu]\"`")
    if result.get("stage") == "topology":
        return CompileError(f"libtpu rejected topology {topology.name}: {message}",
                            hint="grids that compile: v5e:1x1, v5e:2x2, v5e:4x4, v6e:2x2, v5p:2x2x1, v4:2x2x1, "
                                 "TPU7x:2x2x1")
    budget = parse_vmem_oom(result.get("detail", "") or message)
    if budget is None:
        return CompileError(f"compiling for {topology.name} failed: {message}")
    what = "scoped VMEM" if budget.kind == "scoped" else "VMEM"
    op = f" by `{budget.hlo}`" if budget.hlo else ""
    return CompileError(f"compiling for {topology.name} failed: {message}: {_mib(budget.used_bytes)} of {what} "
                        f"needed{op}, limit {_mib(budget.limit_bytes)} (over by {_mib(budget.exceeded_by_bytes)})",
                        hint="smaller blocks, or a larger `vmem_limit_bytes` in pltpu.CompilerParams"
                        if budget.kind == "scoped" else "smaller blocks or fewer buffers: the program exceeds "
                        "physical VMEM")


def _prepare(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", path=out)
    out.mkdir(parents=True, exist_ok=True)
    for name in (XLA_DIR, LLO_DIR, PROFILE_DIR):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (RESULT_FILE, HLO_TEXT_FILE, HLO_PROTO_FILE, STDERR_FILE):
        (out / name).unlink(missing_ok=True)


def trim_xla_dump(xla_dir: Path, module: str) -> None:
    """Keep the main module's after-optimizations files; drop every other file XLA wrote."""
    if not xla_dir.is_dir():
        return
    for f in xla_dir.iterdir():
        keep = f.is_file() and f.name.endswith(XLA_KEEP_SUFFIXES) and (not module or f".{module}." in f.name)
        if not keep:
            if f.is_dir():
                shutil.rmtree(f)
            else:
                f.unlink()


def trim_llo_dump(llo_dir: Path) -> None:
    """Keep the LLO files the LLO parser reads (with `misc`: the TLP bundle profile)."""
    from tpudiag.parsers.llo.files import PARSED_LABELS, classify

    if not llo_dir.is_dir():
        return
    for f in llo_dir.rglob("*"):
        if not f.is_file():
            continue
        info = classify(f)
        if info is None or info.label not in PARSED_LABELS:
            f.unlink()


def compile_program(target: str, topology: Topology, out: Path, static_profile: bool | None = None,
                    extra_flags: tuple[str, ...] = (), timeout_s: float = DEFAULT_TIMEOUT_S,
                    xla_flags: tuple[str, ...] = (), compiler_options: dict | None = None,
                    params: dict | None = None) -> CompileRun:
    """Compile `target` (MODULE:FUNCTION) for `topology` into `out`; raise TpudiagError on failure.

    params: keyword arguments bound to the function before it is jitted (`lab tune MODULE:FN --param`).

    extra_flags go to LIBTPU_INIT_ARGS, xla_flags to XLA_FLAGS, compiler_options to
    `lowered.compile(compiler_options=...)` (per-compile overrides of XLA and libtpu options).
    """
    profile = topology.static_profile_supported if static_profile is None else static_profile
    out = out.resolve()
    _prepare(out)
    request = {"target": target, "topology": topology.name, "out": str(out),
               "single_chip": topology.single_chip, "compiler_options": dict(compiler_options or {}),
               "params": dict(params or {})}
    cmd = [sys.executable, "-m", "tpudiag.compiler.worker", json.dumps(request)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=worker_env(out, profile, extra_flags, xla_flags), capture_output=True, text=True,
                              timeout=wait_limit_s(timeout_s), errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise CompileError(f"the compile did not finish within {timeout_s:.0f} s",
                           hint="a smaller program, or --no-static-profile (it is the slow part)") from exc
    wall = time.perf_counter() - t0
    stderr = proc.stderr or ""
    (out / STDERR_FILE).write_text(stderr[-STDERR_KEEP_BYTES:])
    result_path = out / RESULT_FILE
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode == EXIT_INPUT_ERROR and result:
        raise InputError(result["message"], hint=result.get("hint") or None)
    if proc.returncode == EXIT_COMPILE_ERROR and result:
        error = _compile_error(topology, result)
        if result.get("module") and (out / XLA_DIR).is_dir():
            # An out-of-memory compile still writes its buffer assignment: keep it, and say how to read it.
            trim_xla_dump(out / XLA_DIR, result["module"])
            if any((out / XLA_DIR).iterdir()) and "memory" in result.get("message", "").lower():
                error.hint = f"the dump is kept: `tpudiag memory {out}` shows what holds the memory"
        raise error
    if proc.returncode != 0 or result is None or result.get("status") != "ok":
        line = compiler_error_line(stderr)
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        hint = f"the compiler's stderr is in `{out / STDERR_FILE}`"
        if profile and ("profil" in stderr.lower() or "latency model" in stderr.lower()):
            hint = "the static LLO profile is not supported for this program or generation: rerun with " \
                   "--no-static-profile"
        if line is None:
            tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or ["(no stderr)"]
            line = tail[0].strip()
        raise CompileError(f"the compiler aborted ({how}) compiling for {topology.name}: {line}", hint=hint)
    trim_xla_dump(out / XLA_DIR, result.get("module", ""))
    trim_llo_dump(out / LLO_DIR)
    result.update(wall_s=round(wall, 3), static_profile=profile, libtpu_flags=list(extra_flags),
                  xla_flags=list(xla_flags), compiler_options=dict(compiler_options or {}),
                  generation=topology.generation, dump_options=dump_options(out, profile))
    result["dump_bytes"] = dump_size(out)
    result_path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return CompileRun(out=out, topology=topology, facts=result, static_profile=profile, wall_s=wall)
