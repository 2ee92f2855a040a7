"""Block-size sweep: compile each candidate for a TPU topology, reject what the compiler refuses, rank.

Ranking basis, in order of preference (each result says which it used):

1. `measured`: a TPU is attached; the median of 10 runs on it.
2. `estimate+floor`: the compiler's estimated cycles (static LLO profile) at the generation's
   clock, bounded below by the bytes the blocking moves over HBM bandwidth. The bound matters:
   Pallas pipeline DMAs are not bandwidth-limited in the static estimate
   (`shared/reference/tpu-compiler-dumps.md` §8.2).
3. `cycles`: the clock is not public (v6e, TPU7x), so cycles cannot be compared with the HBM floor
   in seconds; candidates are ranked by estimated cycles alone, relative to each other.
4. `ici-model` (collectives, no TPU): the static profile gives remote DMAs 0 cycles, so each
   candidate is compiled for the topology (it compiles or the compiler says why) and ranked by a
   modelled ICI time, bytes sent / (links used x per-link bandwidth), at least the HBM floor.

Every candidate's outcome is appended to `DIR/tune-<topology>.jsonl` as soon as it is known, so an
interrupted sweep keeps its results and a re-run resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tpudiag.compiler.driver import wait_limit_s
from tpudiag.errors import InputError, UsageError
from tpudiag.kernels_lab.family import family_module
from tpudiag.kernels_lab.problems import problem_fields
from tpudiag.kernels_lab.spec import OpSpec, topology_generation
from tpudiag.model.hardware import chip_for

# Generations whose static LLO profile works (v4 and TPU7x abort: reference §3).
STATIC_PROFILE_GENERATIONS = frozenset({"v5e", "v5p", "v6e"})
STARTUP_TIMEOUT_S = 180.0
# Above this many grid steps the static LLO profile takes tens of seconds per compile on a small VM
# (8192x4096x4096 matmul, 256 steps: 22-41 s on 2 vCPUs; 2048^3, 16 steps: 2 s).
LONG_COMPILE_STEPS = 128

_FATAL = re.compile(r"^F\d{4} .*$|^.*Check failed.*$", re.M)
_OOM_KINDS = {"scoped": "scoped VMEM OOM (CompileTimeScopedVmemOom)", "capacity": "VMEM OOM (over physical VMEM)",
              "allocation": "VMEM OOM (one allocation over physical VMEM)"}


def compile_error_reason(text: str) -> str:
    """One line for a compiler refusal: the VMEM budget when it is an OOM (parsed by
    `tpudiag.parsers.llo.parse_vmem_oom`), else the error's first line."""
    from tpudiag.parsers.llo import parse_vmem_oom

    budget = parse_vmem_oom(text)
    if budget is not None:
        return (f"{_OOM_KINDS.get(budget.kind, 'VMEM OOM')}: {budget.used_bytes / 2**20:.2f} MiB needed, "
                f"limit {budget.limit_bytes / 2**20:.2f} MiB")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "compiler error")
    return first[:200]


@dataclass(frozen=True)
class CandidateResult:
    label: str
    blocks: dict
    status: str  # ok | rejected (compiler) | invalid (BlockSizes) | aborted (compiler crashed) | timeout
    reason: str
    grid: tuple[int, ...]
    vmem_bytes: int  # our double-buffered estimate
    hbm_floor_s: float  # bytes the blocking moves / HBM bandwidth (computed)
    est_cycles: int | None = None  # compiler estimate (modelled)
    est_s: float | None = None  # est_cycles / clock (derived); None when the clock is unknown
    measured_s: float | None = None  # on an attached TPU
    compile_s: float | None = None
    ici_s: float | None = None  # collectives: bytes over ICI / (links used x link bandwidth) (modelled)

    @property
    def grid_steps(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    @property
    def bounded_s(self) -> float | None:
        """max(estimate, HBM floor): the estimate-based time used for ranking when the clock is known;
        for a collective, max(ICI model, HBM floor)."""
        parts = [x for x in (self.est_s, self.ici_s) if x is not None]
        return max(*parts, self.hbm_floor_s) if parts else None


@dataclass(frozen=True)
class XlaBaseline:
    measured_s: float | None  # from the capture, per occurrence
    est_cycles: int | None  # the plain-JAX reference compiled for the same topology (modelled)
    est_s: float | None
    hbm_floor_s: float  # the capture's bytes accessed / HBM bandwidth
    status: str
    reason: str
    reference_measured_s: float | None = None  # the reference timed on the attached TPU (--measure)
    hbm_floor_basis: str = "the capture's bytes accessed"
    optimal_s: float | None = None  # XLA's cost model (`cost_analysis()["optimal_seconds"]`, modelled)
    captured_basis: str = "measured"  # how the capture timed the op: measured, or modelled (`simulate`)

    @property
    def reference_s(self) -> tuple[float, str] | None:
        """The standalone reference's time and what it is: measured on a TPU, else the compiler's cycles
        at the clock, else XLA's cost model; None when there is none."""
        for value, what in ((self.reference_measured_s, "measured"), (self.est_s, "compiler estimate"),
                            (self.optimal_s, "XLA's cost model")):
            if value:
                return value, what
        return None

    def reference_gap(self) -> float | None:
        """Reference time over the captured op's time (None when either is unknown)."""
        ref = self.reference_s
        return ref[0] / self.measured_s if ref is not None and self.measured_s else None


# A standalone reference this far from the captured op (either way) is not the op: `tune` says so.
REFERENCE_GAP = 1.5


@dataclass(frozen=True)
class SweepResult:
    op_name: str
    family: str
    problem: dict  # the problem compiled (scaled down when scale_down > 1)
    scale_down: int
    topology: str
    generation: str
    device_kind: str
    clock_hz: float | None
    basis: str  # measured | estimate+floor | cycles | ici-model
    basis_text: str
    results: tuple[CandidateResult, ...]  # ranked: ok first, best first
    xla: XlaBaseline
    jsonl: str
    left_out: tuple[str, ...] = ()  # what the reproduction does not do that the op does (`OpSpec.left_out`)

    @property
    def reference_warning(self) -> str | None:
        """Why the sweep's ranking against XLA may not carry over to the op: the standalone reference
        differs from the captured op by more than `REFERENCE_GAP` either way."""
        gap = self.xla.reference_gap()
        if gap is None or 1 / REFERENCE_GAP <= gap <= REFERENCE_GAP:
            return None
        value, what = self.xla.reference_s
        cause = ("the reproduction leaves out: " + "; ".join(self.left_out) if self.left_out
                 else "the standalone problem is not the op as it ran (layouts, fusion with its neighbours, or "
                      "the capture's timing)")
        return (f"the standalone XLA reference ({value * 1e6:,.1f} us, {what}) is {gap:.1f}x the op "
                f"{self.xla.captured_basis} in the capture ({self.xla.measured_s * 1e6:,.1f} us): {cause}")

    @property
    def best(self) -> CandidateResult | None:
        ok = [r for r in self.results if r.status == "ok" and self._key(r) is not None]
        return ok[0] if ok else None

    def _key(self, r: CandidateResult):
        if self.basis == "measured":
            return r.measured_s
        if self.basis in ("estimate+floor", "ici-model"):
            return r.bounded_s
        return r.est_cycles

    def to_json(self) -> str:
        data = asdict(self)
        data["best"] = asdict(self.best) if self.best else None
        data["reference_warning"] = self.reference_warning
        for r, row in zip(self.results, data["results"], strict=True):
            row["grid_steps"] = r.grid_steps
            row["bounded_s"] = r.bounded_s
        return json.dumps(data, indent=2)


def detect_tpu() -> bool:
    """A TPU VM exposes its chips as /dev/accel* (v4) or /dev/vfio/* (v5e and later)."""
    return any(Path("/dev").glob("accel*")) or any(p.name != "vfio" for p in Path("/dev/vfio").glob("*"))


class _Worker:
    """One compile_worker subprocess; a reader thread turns its stdout into a queue of lines."""

    def __init__(self, out_dir: Path, topology: str, problem: dict, measure: bool, env: dict[str, str]):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "tpudiag.kernels_lab.compile_worker", str(out_dir), topology,
               json.dumps(problem)]
        if measure:
            cmd.append("--measure")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout_s: float) -> dict | None:
        """The next JSON answer; None when the process ended or the time ran out."""
        deadline = time.monotonic() + wait_limit_s(timeout_s)
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue  # a stray print from a library

    def send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def crash_reason(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read()
        fatal = _FATAL.findall(text)
        if fatal:
            return fatal[-1].strip()[:300]
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1][:300] if lines else f"exit status {self.proc.poll()}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def _worker_env(dump_dir: Path | None, measure: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    if not measure:  # deviceless: JAX's own backend stays on CPU; the topology comes from libtpu
        env.setdefault("JAX_PLATFORMS", "cpu")
    if dump_dir is not None:
        flags = env.get("LIBTPU_INIT_ARGS", "")
        env["LIBTPU_INIT_ARGS"] = f"{flags} --xla_jf_dump_static_llo_profile_to={dump_dir}".strip()
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def jsonl_path(out_dir: Path, topology: str) -> Path:
    return out_dir / f"tune-{re.sub(r'[^A-Za-z0-9]+', '_', topology)}.jsonl"


def _load_done(path: Path, key: dict) -> dict[str, dict]:
    """Records of earlier runs for the same topology and problem, by label (last one wins)."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by an interrupt
        if record.get("key") == key:
            done[record["label"]] = record
    return done


def run_sweep(out_dir: Path, *, topology: str | None = None, measure: bool | None = None,
              max_candidates: int | None = None, scale_down: int = 1, blocks: list | None = None,
              timeout_s: float = 600.0,
              progress: Callable[[str], None] = lambda _: None) -> SweepResult:
    """Compile (or measure) every candidate, append each outcome to the JSONL, rank, return."""
    spec = OpSpec.from_json(out_dir / "spec.json")
    topology = topology or spec.topology
    generation = topology_generation(topology)
    chip = chip_for(generation)
    fam = family_module(spec.family)
    if scale_down < 1:
        raise UsageError(f"--scale-down must be at least 1, got {scale_down}")
    problem = spec.problem.scaled(scale_down)
    fields = problem_fields(problem)  # as JSON holds it: the resume key and the worker's argument
    measure = detect_tpu() if measure is None else measure
    clock = chip.clock_hz
    candidates = list(blocks) if blocks is not None else fam.candidates(problem)
    if max_candidates is not None:
        candidates = candidates[:max_candidates]
    if not candidates:
        raise UsageError("no block-size candidates to sweep")

    path = jsonl_path(out_dir, topology)
    key = {"topology": topology, "problem": fields, "measure": measure}
    done = _load_done(path, key)

    def record(result: CandidateResult | XlaBaseline, label: str) -> None:
        with path.open("a") as fh:
            fh.write(json.dumps({"key": key, "label": label, **asdict(result)}) + "\n")

    ici_model = fam.ici_seconds

    def base(b) -> CandidateResult:
        floor = fam.hbm_bytes(problem, b) / chip.hbm_bytes_per_s
        ici = ici_model(problem, b, chip.ici_bytes_per_s_per_link) if ici_model and chip.ici_bytes_per_s_per_link \
            else None
        return CandidateResult(b.label(), asdict(b), "pending", "", tuple(b.grid(problem)), b.vmem_bytes(problem),
                               floor, ici_s=ici)

    results: dict[str, CandidateResult] = {}
    pending = []
    for b in candidates:
        r = base(b)
        if r.label in done:
            results[r.label] = _from_record(done[r.label])
            continue
        try:
            b.validate(problem, chip.vmem_bytes)
        except ValueError as exc:
            results[r.label] = dataclasses.replace(r, status="invalid", reason=str(exc))
            record(results[r.label], r.label)
            continue
        pending.append((b, r))

    if scale_down == 1 and spec.bytes_accessed > 0:
        xla_floor, floor_basis = spec.bytes_accessed / chip.hbm_bytes_per_s, "the capture's bytes accessed"
    else:
        xla_floor = problem.min_hbm_bytes / chip.hbm_bytes_per_s
        floor_basis = "the problem's inputs read and output written once"
    xla_measured = spec.measured_time_ps / 1e12 if spec.measured_time_ps else None
    xla = (dataclasses.replace(_xla_from_record(done["xla"]), captured_basis=spec.captured_basis)
           if "xla" in done else None)
    n_total = len(pending) + (xla is None)
    if n_total:
        progress(f"compiling {n_total} configuration(s) of `{spec.op_name}` for {topology}"
                 + (f" ({len(candidates) - len(pending)} already done)" if len(candidates) > len(pending) else ""))
    if pending and not measure and min(r.grid_steps for _, r in pending) > LONG_COMPILE_STEPS:
        progress(f"hint: every candidate has more than {LONG_COMPILE_STEPS} grid steps; static-profile compiles "
                 "of this size take tens of seconds to minutes each: `--scale-down N` or `--max-candidates N` "
                 "shortens the sweep, and Ctrl-C keeps what has finished")

    device_kind = ""
    static = generation in STATIC_PROFILE_GENERATIONS
    dump_dir = Path(tempfile.mkdtemp(prefix="tpudiag-lab-")) if static and not measure else None
    worker = None
    try:
        queue_ = ([("xla", None, None)] if xla is None else []) + [("pallas", b, r) for b, r in pending]
        index = compiled = 0
        while index < len(queue_):
            if worker is None:
                worker = _Worker(out_dir, topology, fields, measure, _worker_env(dump_dir, measure))
                ready = worker.next(STARTUP_TIMEOUT_S)
                if not ready or not ready.get("ready"):
                    reason = worker.crash_reason()
                    worker.close()
                    raise InputError(f"the compile worker did not start: {reason}", path=out_dir,
                                     hint="check the topology name and that jax[tpu] (libtpu) is installed")
                device_kind = ready.get("device_kind", "")
            kind, b, r = queue_[index]
            label = "xla" if kind == "xla" else r.label
            step = "[xla]" if kind == "xla" else f"[{compiled + 1}/{len(pending)}]"
            progress(f"{step} compiling {'the XLA reference' if kind == 'xla' else label} ...")
            t0 = time.perf_counter()
            worker.send({"id": label, "kind": kind, "blocks": asdict(b) if b is not None else None})
            answer = worker.next(timeout_s)
            if answer is None:  # crashed or hung: record it, start a fresh worker for the rest
                timed_out = worker.proc.poll() is None
                if timed_out:
                    worker.proc.kill()
                status = "timeout" if timed_out else "aborted"
                reason = (f"no answer in {timeout_s:.0f} s" if timed_out
                          else f"compiler aborted: {worker.crash_reason()}")
                worker.close()
                worker = None
                answer = {"status": status, "error": reason, "est_cycles": None, "compile_s": None,
                          "measured_s": None}
            index += 1
            status = answer["status"]
            reason = compile_error_reason(answer["error"]) if answer.get("error") and status == "rejected" \
                else (answer.get("error") or "")
            cycles = answer.get("est_cycles")
            if status == "ok" and answer.get("note"):
                reason = answer["note"]
            elif status == "ok" and cycles is None and not measure:
                reason = ("no estimated cycles: the static LLO profile is not available for " + generation
                          if not static else "no bundle_analysis_data in the compiled module")
            est_s = cycles / clock if (cycles is not None and clock) else None
            if kind == "xla":
                xla = XlaBaseline(xla_measured, cycles, est_s, xla_floor, status, reason,
                                  answer.get("measured_s"), floor_basis, answer.get("optimal_s"), spec.captured_basis)
                record(xla, "xla")
                progress(f"[xla] reference: {_cycles_text(cycles)} ({time.perf_counter() - t0:.1f} s)")
                continue
            res = dataclasses.replace(r, status=status, reason=reason, est_cycles=cycles, est_s=est_s,
                                      measured_s=answer.get("measured_s"), compile_s=answer.get("compile_s"))
            results[r.label] = res
            record(res, r.label)
            compiled += 1
            shown = _cycles_text(cycles) if status == "ok" else f"{status}: {reason}"
            progress(f"[{compiled}/{len(pending)}] {r.label}: {shown} "
                     f"({time.perf_counter() - t0:.1f} s)")
    finally:
        if worker is not None:
            worker.close()
        if dump_dir is not None:
            shutil.rmtree(dump_dir, ignore_errors=True)

    if xla is None:
        xla = XlaBaseline(xla_measured, None, None, xla_floor, "not compiled", "", None, floor_basis,
                          captured_basis=spec.captured_basis)
    if measure:
        basis, text = "measured", "ranked by time measured on the attached TPU (median of 10 runs)"
    elif ici_model is not None:
        basis = "ici-model"
        text = (f"no TPU attached, so nothing is measured; ranked by a modelled ICI time: bytes each device sends / "
                f"(links the ring uses x {chip.ici_bytes_per_s_per_link / 1e9:g} GB/s per link), at least the HBM "
                "floor. The compiler gives no estimate for remote DMAs, and the model does not see chunking: "
                "equal chunk counts tie (fewer DMAs first); measure on a TPU to rank them")
    elif clock:
        basis = "estimate+floor"
        text = (f"ranked by max(compiler-estimated cycles / {clock / 1e9:g} GHz, bytes moved / "
                f"{chip.hbm_bytes_per_s / 1e9:,.0f} GB/s HBM): a modelled estimate, not a measurement")
    else:
        basis = "cycles"
        text = (f"ranked by compiler-estimated cycles only: {generation}'s clock is not public, so cycles are "
                "not converted to time nor compared with the HBM floor; compare candidates relative to each other")
    ordered = _rank([results[b.label()] for b in candidates if b.label() in results], basis)
    return SweepResult(spec.op_name, spec.family, fields, scale_down, topology, generation, device_kind, clock,
                       basis, text,
                       tuple(ordered), xla, str(path), left_out=spec.left_out)


def _rank(results: list[CandidateResult], basis: str) -> list[CandidateResult]:
    def key(r: CandidateResult):
        value = {"measured": r.measured_s, "estimate+floor": r.bounded_s, "cycles": r.est_cycles,
                 "ici-model": r.bounded_s}[basis]
        # ties (several candidates at the HBM floor) go to fewer estimated cycles, then fewer steps
        return (r.status != "ok", value is None, value if value is not None else 0.0,
                r.est_cycles if r.est_cycles is not None else 0, r.grid_steps)

    return sorted(results, key=key)


def _cycles_text(cycles: int | None) -> str:
    return "no estimate" if cycles is None else f"{cycles:,} cycles"


def _from_record(record: dict) -> CandidateResult:
    fields = {f.name for f in dataclasses.fields(CandidateResult)}
    data = {k: v for k, v in record.items() if k in fields}
    data["grid"] = tuple(data["grid"])
    return CandidateResult(**data)


def _xla_from_record(record: dict) -> XlaBaseline:
    fields = {f.name for f in dataclasses.fields(XlaBaseline)}
    return XlaBaseline(**{k: v for k, v in record.items() if k in fields})
