"""Time and peak memory of `tpudiag report --format json` on a large one-host capture, beside xprof.

The capture: 2 v6e chips x 834 steps x 1,200 ops = 2,001,600 `XLA Ops` events (~120 MB), the
size used in shared/reference/xprof-trace-format.md §8. It is generated once into
benchmarks/out/ (ignored by git) and reused.

Each tool runs in its own process; memory is the peak of the resident set summed over the process
and its workers, sampled every 50 ms from /proc:
- `tpudiag report --format json FILE`
- `xprof get_hlo_stats RUN_DIR --bypass_cache` on a copy of the run directory, cold (xprof caches
  its converted OpStats next to the trace and its CLI results in $TMPDIR; both are removed first).

Usage: python benchmarks/bench_report.py [--skip-xprof] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

OUT = Path(__file__).resolve().parent / "out"
N_CHIPS, N_STEPS, OPS_PER_STEP = 2, 834, 1_200
US = 1_000_000


def make_capture(run_dir: Path) -> Path:
    path = run_dir / "host0.xplane.pb"
    if path.exists():
        return path
    ops = tuple(OpDef(f"fusion.{i}", "convolution fusion" if i % 3 == 0 else "loop fusion",
                      flops=1e9 * (i % 7 + 1), bytes_accessed=1e6 * (i % 5 + 1),
                      shape="bf16[1024,1024]{1,0:T(8,128)(2,1)}") for i in range(OPS_PER_STEP))

    def schedule(chip: int, step: int) -> list[Placed]:
        return [Placed(f"fusion.{i}", i * 8 * US, 7 * US) for i in range(OPS_PER_STEP)]

    design = CaptureDesign("host0", "TPU v6 Lite", 918.0, 1640.0, "jit_big", 99, ops, N_CHIPS, N_STEPS,
                           OPS_PER_STEP * 8 * US + 50 * US, schedule)
    t0 = time.perf_counter()
    write_capture(design, run_dir)
    print(f"generated {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return path


def process_tree(root: int) -> dict[int, tuple[int, int]]:
    """pid -> (resident kB, utime + stime clock ticks) of `root` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    facts: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            status = (entry / "status").read_text()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        facts[int(entry.name)] = (int(m.group(1)) if m else 0, int(fields[11]) + int(fields[12]))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        out[pid] = facts.get(pid, (0, 0))
        todo.extend(children.get(pid, []))
    return out


def _tree_rss_kb(root: int) -> int:
    """Resident memory of a process and all its descendants."""
    return sum(rss for rss, _ in process_tree(root).values())


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS GB summed over the process tree, exit code) of one command.

    Worker processes run at the same time as their parent, so the peak of the tree's sum is what
    the machine must hold; GNU time's maximum would report only the largest single process.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss_kb(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    return wall, peak / 1e6, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-xprof", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    run_dir = OUT / "big_2m" / "plugins" / "profile" / "run"
    trace = make_capture(run_dir)
    bindir = Path(sys.executable).parent
    results = {"events": N_CHIPS * N_STEPS * OPS_PER_STEP, "file_mb": trace.stat().st_size / 1e6}
    # Default: the host's planes parse in parallel workers; --jobs 1: one process.
    for label, extra in (("tpudiag_report_json", []), ("tpudiag_report_json_jobs1", ["--jobs", "1"])):
        runs = [measure([str(bindir / "tpudiag"), "report", "--format", "json", *extra, str(trace)])
                for _ in range(args.repeat)]
        results[label] = {"wall_s": min(r[0] for r in runs), "peak_rss_gb": max(r[1] for r in runs),
                          "exit": runs[-1][2]}
    if not args.skip_xprof:
        copy = OUT / "xprof_copy"
        shutil.rmtree(copy, ignore_errors=True)
        copy.mkdir(parents=True)
        shutil.copy(trace, copy / trace.name)
        for cache in Path(tempfile.gettempdir()).glob("xprof_cli_cache_*"):
            shutil.rmtree(cache, ignore_errors=True)
        wall, rss, code = measure([str(bindir / "xprof"), "get_hlo_stats", str(copy), "--bypass_cache"])
        results["xprof_get_hlo_stats_cold"] = {"wall_s": wall, "peak_rss_gb": rss, "exit": code}
        shutil.rmtree(copy, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
