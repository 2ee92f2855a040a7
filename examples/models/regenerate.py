"""Compile each example model for v5e:2x2 and v6e:2x2, keep trimmed dumps, write modelled captures.

For every model x topology, sequentially and each in its own process (libtpu reads its flags
once per process):

1. `tpudiag compile FILE:FUNCTION --topology TOPO -o dumps/<model>_<gen>`
2. `tpudiag simulate dumps/<model>_<gen> -o captures/<model>_<gen>`

v6e's clock is not public, so its captures use an *assumed* 2.6 GHz: the clock at which XLA's
own estimate for a 2048^3 bf16 dot on v6e (48,842 cycles) would run at the public 918 TFLOP/s
peak (`shared/reference/tpu-compiler-dumps.md` §8.2). Only v6e's relative times are meaningful.

Compile times (wall, and CPU seconds of the compile process tree, which do not grow when other
processes compete for the cores), the load average and dump sizes are written to
`measurements.json`. The compiler's stderr is not kept (it holds timestamps and local paths).
Run from the repository root with the tpu extra:
`python examples/models/regenerate.py [--out-root DIR] [MODEL ...]` (`--out-root` writes
dumps, captures and measurements elsewhere, e.g. to measure without touching the committed ones).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS = {  # name -> MODULE:FUNCTION, relative to the repository root
    "transformer_train": "examples/models/transformer_train.py:train_step",
    "llm_decode": "examples/models/llm_decode.py:decode_step",
    "pallas_matmul": "examples/models/pallas_matmul.py:matmul",
}
TOPOLOGIES = {"v5e": "v5e:2x2", "v6e": "v6e:2x2"}
ASSUMED_CLOCK_GHZ = {"v6e": 2.6}  # see the module docstring
DROP = ("compiler-stderr.txt",)


def tpudiag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=ROOT, capture_output=True, text=True)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def regenerate(model: str, gen: str, root: Path = HERE) -> dict:
    name = f"{model}_{gen}"
    dumps = root / "dumps" / name
    captures = root / "captures" / name
    shutil.rmtree(dumps, ignore_errors=True)
    shutil.rmtree(captures, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = tpudiag("compile", MODELS[model], "--topology", TOPOLOGIES[gen], "-o", _rel(dumps), "--format", "json")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - t0
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: compile failed:\n{proc.stderr}")
    for drop in DROP:
        (dumps / drop).unlink(missing_ok=True)
    facts = json.loads((dumps / "result.json").read_text())
    sim = ["simulate", _rel(dumps), "-o", _rel(captures)]
    if gen in ASSUMED_CLOCK_GHZ:
        sim += ["--clock-ghz", str(ASSUMED_CLOCK_GHZ[gen])]
    proc = tpudiag(*sim)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: simulate failed:\n{proc.stderr}")
    dump_bytes = sum(f.stat().st_size for f in dumps.rglob("*") if f.is_file())
    capture_bytes = sum(f.stat().st_size for f in captures.rglob("*") if f.is_file())
    row = {"compile_s": facts["compile_s"], "worker_wall_s": facts["wall_s"], "command_wall_s": round(wall, 1),
           "command_cpu_s": round(cpu, 1), "load_average_1min": round(load, 2),
           "static_profile": facts["static_profile"], "dump_bytes": dump_bytes,
           "dump_files": sum(1 for f in dumps.rglob("*") if f.is_file()), "capture_bytes": capture_bytes}
    print(f"{name}: compile {row['compile_s']:.1f} s ({row['command_cpu_s']:.1f} CPU s, load {load:.1f}), dumps {dump_bytes / 1e6:.2f} MB, "
          f"capture {capture_bytes / 1e6:.2f} MB", flush=True)
    return row


def main(argv: list[str]) -> None:
    root = HERE
    if argv[:1] == ["--out-root"]:
        if len(argv) < 2:
            raise SystemExit("--out-root needs a directory")
        root, argv = Path(argv[1]).resolve(), argv[2:]
    models = argv or list(MODELS)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    root.mkdir(parents=True, exist_ok=True)
    path = root / "measurements.json"
    measurements = json.loads(path.read_text()) if path.exists() else {}
    for model in models:
        for gen in TOPOLOGIES:
            measurements[f"{model}_{gen}"] = regenerate(model, gen, root)
            path.write_text(json.dumps(measurements, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
