"""`tpudiag lab tune MODULE:FN --param k=v1,v2`: tune the user's own kernel function, deviceless.

Each candidate is one point of the cartesian product of the `--param` lists, bound to FN as keyword
arguments; FN is compiled on the module's `example_args(mesh)` by the same deviceless compile as
`tpudiag compile` (`tpudiag.compiler.driver.compile_program`, one worker process per compile),
with libtpu's static LLO profile on and its VMEM report dumped. From each compile's dumps
(`tpudiag.parsers.llo`): the compiler's estimated cycles summed over the program's ops, VMEM
spills and fills, and the VMEM the program's ops allocate, against the scoped limit. Every figure
is the compiler's model, never a measurement. Candidates are ranked by estimated cycles.

Compiles run in parallel, at most one per core, and are cached on disk under
`<cache>/lab-tune/<key>/` (`TPUDIAG_CACHE_DIR`, else `$XDG_CACHE_HOME/tpudiag`, else
`~/.cache/tpudiag`), keyed by the module file's bytes, the function, the parameters, the topology,
the compiler flags and the versions of tpudiag, jaxlib and libtpu. Each key's directory holds the
compile's dumps and `candidate.json`, the candidate's outcome (a refusal is cached too; a compiler
crash or timeout is not: the next run tries it again).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tpudiag.compiler.driver import CompileError, compile_program
from tpudiag.compiler.flags import cache_dir
from tpudiag.compiler.topology import Topology, parse_topology
from tpudiag.errors import InputError, UsageError
from tpudiag.kernels_lab.sweep import compile_error_reason
from tpudiag.model.compile_output import LLO_DIR, PROFILE_DIR, RESULT_FILE
from tpudiag.model.hardware import DEFAULT_SCOPED_VMEM_BYTES

# The LLO dump categories a candidate needs: `misc` (the bundle profile: spills) and `memory-report`
# (`vmem_report.html`: VMEM per op). The later filter flag replaces the driver's `misc`.
TUNE_LIBTPU_FLAGS = ("--xla_jf_dump_category_filter=misc,memory-report",)
CANDIDATE_FILE = "candidate.json"
CACHE_SUBDIR = "lab-tune"
DEFAULT_TOPOLOGY = "v5e:1x1"


@dataclass(frozen=True)
class KernelCandidate:
    """One parameter set's compile; every figure is the compiler's model (`modelled`)."""

    params: dict
    status: str  # ok | rejected (lowering or compiling refused it) | aborted (the compiler crashed)
    reason: str  # one line; '' when ok with every figure
    est_cycles: int | None = None  # static LLO profile, summed over the program's ops (modelled)
    spill_stores: int | None = None  # VMEM spill stores (vst), bundle profile (modelled: static code)
    spill_fills: int | None = None
    vmem_bytes: int | None = None  # VMEM the program's ops allocate (scoped + temporaries), VMEM report
    vmem_limit_bytes: int | None = None  # the generation's default scoped VMEM limit
    compile_s: float | None = None
    dump: str = ""  # the compile's dump directory (in the cache)
    cached: bool = False

    @property
    def vmem_fits(self) -> bool | None:
        """Within the default scoped limit; None when either figure is unknown."""
        if self.vmem_bytes is None or self.vmem_limit_bytes is None:
            return None
        return self.vmem_bytes <= self.vmem_limit_bytes


@dataclass(frozen=True)
class KernelTuneResult:
    target: str
    topology: str
    generation: str
    clock_hz: float | None
    basis: str
    candidates: tuple[KernelCandidate, ...]  # ranked: compiled with an estimate first, fewest cycles first
    cache_dir: str
    jobs: int

    @property
    def best(self) -> KernelCandidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.status == "ok" and first.est_cycles is not None else None

    def command(self, params: dict) -> str:
        """The command that compiles exactly this candidate again."""
        parts = ["tpudiag", "lab", "tune", self.target, "--topology", self.topology]
        for k, v in params.items():
            parts += ["--param", f"{k}={v}"]
        return " ".join(shlex.quote(p) for p in parts)

    def to_json(self) -> str:
        rows = []
        for c in self.candidates:
            row = asdict(c)
            row["vmem_fits"] = c.vmem_fits
            row["est_us"] = c.est_cycles / self.clock_hz * 1e6 if c.est_cycles is not None and self.clock_hz else None
            rows.append(row)
        best = self.best
        data = {"target": self.target, "topology": self.topology, "generation": self.generation,
                "clock_hz": self.clock_hz, "basis": self.basis, "figures": "modelled", "candidates": rows,
                "best": ({"params": best.params, "est_cycles": best.est_cycles, "command": self.command(best.params)}
                         if best else None),
                "cache_dir": self.cache_dir, "jobs": self.jobs}
        return json.dumps(data, indent=2)


def parse_params(texts: list[str]) -> dict[str, list]:
    """`--param bm=128,256` (repeatable) -> {"bm": [128, 256]}; ints, floats, true/false, else strings."""
    out: dict[str, list] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not values.strip():
            raise UsageError(f"--param {text!r} is not NAME=V1,V2,...", hint="e.g. --param block_m=128,256,512")
        if name in out:
            raise UsageError(f"--param {name} is given twice")
        parsed = [_value(v.strip()) for v in values.split(",") if v.strip()]
        out[name] = list(dict.fromkeys(parsed))  # a value listed twice is one candidate (and one cache entry)
    return out


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def candidates_of(params: dict[str, list]) -> list[dict]:
    names = list(params)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(params[n] for n in names))]


def _versions() -> dict[str, str]:
    from importlib import metadata

    from tpudiag.version import __version__

    found = {"tpudiag": __version__}
    for dist in ("jaxlib", "libtpu"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = ""
    return found


def _source_digest(target: str) -> str:
    """The module file's bytes (a dotted module: the file importlib finds, without importing it)."""
    import importlib.util

    from tpudiag.compiler.target import TargetError, parse_target

    try:
        spec = parse_target(target)
    except TargetError as exc:
        raise UsageError(exc.message, hint=exc.hint or None) from None
    path = Path(spec.module) if spec.is_path else None
    if path is None:
        try:
            found = importlib.util.find_spec(spec.module)
        except (ImportError, ValueError):
            found = None
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None or not path.is_file():
        raise InputError(f"no such module file for `{target}`", path=spec.module)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_key(target: str, source: str, params: dict, topology: str, flags: tuple[str, ...],
              versions: dict[str, str]) -> str:
    function = target.rpartition(":")[2]
    blob = json.dumps({"source": source, "function": function, "params": params, "topology": topology,
                       "flags": list(flags), "versions": versions}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _figures(out: Path) -> dict:
    """Cycles, spills and VMEM from one compile's LLO dumps, summed over the program's ops."""
    from tpudiag.parsers.llo import load_llo_dump

    dump = load_llo_dump(out / LLO_DIR, static_profile_dir=out / PROFILE_DIR)
    ops = dump.ops

    def total(column: str) -> int | None:
        if ops.empty or column not in ops or ops[column].isna().all():
            return None
        return int(ops[column].fillna(0).sum())

    vmem = [v for v in (total("vmem_scoped_bytes"), total("vmem_temporary_bytes")) if v is not None]
    return {"est_cycles": total("estimated_cycles"), "spill_stores": total("spill_stores"),
            "spill_fills": total("spill_fills"), "vmem_bytes": sum(vmem) if vmem else None}


def _compile_one(target: str, topology: Topology, params: dict, out: Path, timeout_s: float) -> KernelCandidate:
    limit = DEFAULT_SCOPED_VMEM_BYTES.get(topology.generation)
    try:
        run = compile_program(target, topology, out, static_profile=True, extra_flags=TUNE_LIBTPU_FLAGS,
                              timeout_s=timeout_s, params=params)
    except (CompileError, InputError) as exc:
        result = _result(out)
        if (isinstance(exc, InputError) and result.get("stage") != "lower") or result.get("stage") in ("import",
                                                                                                     "topology"):
            raise  # the module (import, example_args, mesh), jax or the topology is at fault: no candidate compiles
        # lowering's message names the exception; a compile's detail holds the VMEM budget of an OOM
        detail = (result.get("detail") if result.get("stage") == "compile" else result.get("message")) or exc.message
        aborted = isinstance(exc, CompileError) and not result  # a crash or a timeout leaves no result.json
        reason = exc.message if aborted else compile_error_reason(detail)
        return KernelCandidate(params, "aborted" if aborted else "rejected", reason, vmem_limit_bytes=limit,
                               dump=str(out))
    figures = _figures(out)
    reason = "" if figures["est_cycles"] is not None else "no estimated cycles in the static LLO profile"
    return KernelCandidate(params, "ok", reason, vmem_limit_bytes=limit, compile_s=run.facts.get("compile_s"),
                           dump=str(out), **figures)


def _result(out: Path) -> dict:
    try:
        return json.loads((out / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _rank(candidates: list[KernelCandidate]) -> list[KernelCandidate]:
    def key(c: KernelCandidate):
        spills = (c.spill_stores or 0) + (c.spill_fills or 0)
        return (c.status != "ok" or c.est_cycles is None, c.est_cycles or 0, spills)

    return sorted(candidates, key=key)


def tune_kernel(target: str, params: dict[str, list], *, topology: str = DEFAULT_TOPOLOGY,
                jobs: int | None = None, cache: Path | None = None, timeout_s: float = 900.0,
                progress: Callable[[str], None] = lambda _: None) -> KernelTuneResult:
    """Compile every candidate (cached ones are read back), rank by the compiler's estimated cycles."""
    topo = parse_topology(topology)
    if not topo.static_profile_supported:
        raise UsageError(f"libtpu's static LLO profile does not work for {topo.generation}: no cycles to rank by",
                         hint="tune for v5e, v5p or v6e (e.g. --topology v5e:1x1)")
    if not params:
        raise UsageError("no --param given", hint="e.g. --param block_m=128,256 --param block_k=256,512")
    combos = candidates_of(params)
    root = (cache if cache is not None else cache_dir() / CACHE_SUBDIR).resolve()
    source, versions = _source_digest(target), _versions()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(combos)))
    todo: list[tuple[int, dict, Path]] = []
    found: dict[int, KernelCandidate] = {}
    for i, p in enumerate(combos):
        out = root / cache_key(target, source, p, topo.name, TUNE_LIBTPU_FLAGS, versions)
        record = _result_candidate(out)
        if record is not None:
            found[i] = record
        else:
            todo.append((i, p, out))
    if found:
        progress(f"{len(found)} of {len(combos)} candidate(s) from the cache in `{root}`")
    if todo:
        progress(f"compiling {len(todo)} candidate(s) of `{target}` for {topo.name}, {jobs} at a time")

    def work(item: tuple[int, dict, Path]) -> tuple[int, KernelCandidate]:
        i, p, out = item
        c = _compile_one(target, topo, p, out, timeout_s)
        if c.status != "aborted":  # a crash or a timeout (which --timeout changes) is tried again next time
            (out / CANDIDATE_FILE).write_text(json.dumps(asdict(c), indent=1) + "\n")
        shown = f"{c.est_cycles:,} cycles" if c.est_cycles is not None else f"{c.status}: {c.reason}"
        progress(f"  {_label(p)}: {shown}")
        return i, c

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for i, c in pool.map(work, todo):
            found[i] = c
    ranked = _rank([found[i] for i in range(len(combos))])
    clock = topo.clock_hz
    basis = ("ranked by the compiler's estimated cycles (libtpu's static LLO profile, summed over the program's "
             "ops): modelled, not measured; spills and VMEM are the compiler's too")
    return KernelTuneResult(target, topo.name, topo.generation, clock, basis, tuple(ranked), str(root), jobs)


def _result_candidate(out: Path) -> KernelCandidate | None:
    """A cached candidate, marked cached; None when absent or unreadable."""
    try:
        data = json.loads((out / CANDIDATE_FILE).read_text())
        return KernelCandidate(**dict(data, cached=True))
    except (OSError, ValueError, TypeError):
        return None


def _label(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


