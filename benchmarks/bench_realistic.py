"""Time and peak memory of `tpudiag report` on realistic captures, beside a cold `xprof get_hlo_stats`.

Three captures, written by the project's own writers (`tpudiag.writers.tpu_design`) and cached under
benchmarks/out/ (ignored by git):

- `train`: a v6e training capture, 2 chips x 1,670 steps. Each step is one `while` loop (the
  layer loop, category `while`) holding 52 layers; each layer prefetches its weights with an
  `all-gather-start.L` / `all-gather-done.L` pair around 8 compute fusions, and the `Async XLA Ops`
  line carries one window per layer. The last 8 layers start and finish their all-gather with
  nothing between (exposed windows); a synchronous `all-reduce` of the gradients ends each step.
  The exposed-collective rule reports both: the enclosing `while` is a container, not compute
  (XProf's `analyze_async_overlap` counts it as covering every window: docs/xprof-differences.md).
  About 1.95 M events, of which about 520 k are async (start, done and window events).
- `infer`: a v6e inference capture, 2 chips x 2,000 executions of `jit_decode` with idle gaps
  between them and no `Steps` line; copy-start/done pairs (host offload) paired from names.
  About 500 k events.
- `pod16`: 16 hosts of 4 v6e chips each, ~250 k events per host (the training step, shorter).
- `train16`: 16 hosts of `train` (symbolic links to its one file, so no disk is spent; the report
  renames the repeated hostname): about 31 M events, 1.3 GB, the pod of issue 34's check. xprof is
  not run on it (its copy would take 1.3 GB of disk and minutes).

Each tool runs in its own process; memory is the peak of the resident set summed over the process
and its children, sampled every 50 ms from /proc (see bench_report.py). xprof runs cold on a copy
of the run directory with `--bypass_cache` (its OpStats cache and CLI cache removed first).
With `--repeat N` (default 3) the two tools run N times each, in turn, so that a slow moment of the
machine hits both alike; the table on stdout gives the median wall and CPU time and the largest
peak of each, side by side (`--json FILE` keeps every figure). Below it, issue 34's checks on one
host of `train` print as PASS / FAIL lines (SKIP without xprof): at most 1.5 s and 600 MiB, and at
least 10x faster than xprof in wall time, from the same run's medians; and on `train16`, at most
12 s (median wall) with no process above 1.5 GB (the largest peak of any one process: the driver
or a pool worker).

`--host-scaling 1,4,16,64` instead runs `tpudiag report` on 1, 4, 16 and 64 hosts of `pod16`
(run directories of links to its files; past 16 the files are linked again under other names),
with `--jobs 1` (one process: the driver is all there is) and with the default pool, and prints
wall time, peak memory over the process tree and the driver's own peak for each count: how the
cost grows with the number of hosts.

Usage: python benchmarks/bench_realistic.py [--only train,infer,pod16,train16] [--skip-xprof] [--repeat N]
       [--json FILE] [--tpudiag-args "--jobs 1"] [--host-scaling 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import process_tree  # noqa: E402  (the same /proc memory sampler for every benchmark)

from tpudiag.writers.tpu_design import AsyncWindow, CaptureDesign, OpDef, Placed, write_capture  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parents[1]
US = 1_000_000
N_LAYERS = 52
FUSIONS_PER_LAYER = 8
EXPOSED_LAYERS = 8  # the last layers' all-gathers have nothing scheduled between start and done
LAYER_PS = 12 * US


def _train_ops(n_layers: int) -> tuple[OpDef, ...]:
    shape = "bf16[4096,4096]{1,0:T(8,128)(2,1)}"
    ops = [OpDef("while.1", "while", shape="(s32[], bf16[4096,4096])"),
           OpDef("all-reduce.2", "all-reduce", bytes_accessed=64e6, shape="f32[8192,2048]{1,0:T(8,128)}")]
    for layer in range(n_layers):
        ops.append(OpDef(f"all-gather-start.{layer}", "all-gather-start", bytes_accessed=32e6, shape=shape))
        ops.append(OpDef(f"all-gather-done.{layer}", "all-gather-done", bytes_accessed=32e6, shape=shape))
        for k in range(FUSIONS_PER_LAYER):
            conv = k % 2 == 0
            ops.append(OpDef(f"fusion.{layer}.{k}", "convolution fusion" if conv else "loop fusion",
                             flops=2 * 4096 ** 3 / 8 if conv else 1e7, bytes_accessed=4e7 if conv else 6e7,
                             shape=shape, tf_op=f"jit(train_step)/layer_{layer}/dot_general"))
    return tuple(ops)


def _train_schedule(n_layers: int):
    def schedule(chip: int, step: int) -> list[Placed]:
        out = [Placed("while.1", 10 * US, n_layers * LAYER_PS)]
        for layer in range(n_layers):
            t = 10 * US + layer * LAYER_PS
            exposed = layer >= n_layers - EXPOSED_LAYERS
            out.append(Placed(f"all-gather-start.{layer}", t, US // 2))
            if exposed:  # start, done, then the compute: the transfer is not overlapped
                out.append(Placed(f"all-gather-done.{layer}", t + US // 2, 5 * US // 2))
                first = t + 3 * US
            else:
                out.append(Placed(f"all-gather-done.{layer}", t + 10 * US, US // 2))
                first = t + US
            for k in range(FUSIONS_PER_LAYER):
                out.append(Placed(f"fusion.{layer}.{k}", first + k * US, US - US // 10))
        out.append(Placed("all-reduce.2", 10 * US + n_layers * LAYER_PS + US, 16 * US + chip * 2 * US))
        return out
    return schedule


def _train_windows(n_layers: int):
    def windows(chip: int, step: int) -> list[AsyncWindow]:
        out = []
        for layer in range(n_layers):
            t = 10 * US + layer * LAYER_PS
            end = t + 3 * US if layer >= n_layers - EXPOSED_LAYERS else t + 10 * US + US // 2
            out.append(AsyncWindow(f"all-gather-start.{layer}", t, end - t, "all-gather"))
        return out
    return windows


def train_design(hostname: str, n_chips: int, n_steps: int, n_layers: int = N_LAYERS,
                 first_chip: int = 0) -> CaptureDesign:
    return CaptureDesign(hostname, "TPU v6 Lite", 918.0, 1640.0, "jit_train_step", 4242, _train_ops(n_layers),
                         n_chips, n_steps, 10 * US + n_layers * LAYER_PS + 25 * US, _train_schedule(n_layers),
                         first_chip=first_chip, async_windows=_train_windows(n_layers))


def infer_design(hostname: str, n_chips: int, n_steps: int) -> CaptureDesign:
    shape = "bf16[8,2048,128]{2,1,0:T(8,128)(2,1)}"
    ops = [OpDef("copy-start.1", "copy-start", bytes_accessed=8e6, shape=shape),
           OpDef("copy-done.1", "copy-done", bytes_accessed=8e6, shape=shape)]
    ops += [OpDef(f"fusion.{i}", "convolution fusion" if i % 3 == 0 else "loop fusion",
                  flops=1e9 * (i % 5 + 1), bytes_accessed=2e6 * (i % 7 + 1), shape=shape) for i in range(120)]

    def schedule(chip: int, step: int) -> list[Placed]:
        out = [Placed("copy-start.1", 0, US // 4)]
        out += [Placed(f"fusion.{i}", US // 2 + i * 2 * US, US + (i % 4) * US // 5) for i in range(120)]
        out.append(Placed("copy-done.1", 60 * US, US // 4))
        return out

    return CaptureDesign(hostname, "TPU v6 Lite", 918.0, 1640.0, "jit_decode", 777, tuple(ops), n_chips, n_steps,
                         242 * US, schedule, steps_line=False, async_line=False,
                         step_gap_ps=150 * US)  # the host prepares the next request: the chip is idle


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, float, int, float, float, float]:
    """(wall s, peak RSS GB over the process tree, exit code, CPU s of the process tree, peak RSS GB
    of the command's own process: the driver, which gathers every host's results; the largest peak
    RSS GB of any one process of the tree: the driver or a pool worker).

    On a shared machine the wall time moves with the other users' load; the CPU time (user +
    system) much less, so both are printed. Pool workers are grandchildren (a forkserver's), so
    their CPU is sampled from /proc every 50 ms (the last 50 ms of a worker may be missed) and
    the direct child's comes from its rusage.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    peak = driver = largest = 0
    cpu_ticks: dict[int, int] = {}
    while proc.poll() is None:
        tree = process_tree(proc.pid)  # one /proc walk gives both: the sum's peak and each pid's CPU
        peak = max(peak, sum(rss for rss, _ in tree.values()))
        driver = max(driver, tree.get(proc.pid, (0, 0))[0])
        largest = max([largest, *(rss for rss, _ in tree.values())])
        for pid, (_, ticks) in tree.items():
            cpu_ticks[pid] = max(cpu_ticks.get(pid, 0), ticks)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    direct = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hz = os.sysconf("SC_CLK_TCK")
    others = sum(t for pid, t in cpu_ticks.items() if pid != proc.pid) / hz
    return wall, peak / 1e6, proc.returncode, direct + others, driver / 1e6, largest / 1e6


def _events(path: Path) -> int:
    from tpudiag.proto import XSpace

    space = XSpace.FromString(path.read_bytes())  # a file this benchmark just wrote
    return sum(len(ln.events) for p in space.planes for ln in p.lines)


def _generate(name: str, designs) -> Path:
    """Write the designs' hosts into OUT/name/plugins/profile/run unless already there."""
    run_dir = OUT / name / "plugins" / "profile" / "run"
    done = run_dir / ".complete"
    if done.exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    for design in designs:
        write_capture(design, run_dir)
    events = sum(_events(p) for p in sorted(run_dir.glob("*.xplane.pb")))
    done.write_text(json.dumps({"events": events}))
    print(f"generated {name}: {events:,} events in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return run_dir


def _linked(name: str, source: Path, hosts: int) -> Path:
    """OUT/name/plugins/profile/run holding `hosts` symbolic links to the one host file of `source`."""
    [host] = sorted(source.glob("*.xplane.pb"))
    events = json.loads((source / ".complete").read_text())["events"]
    run_dir = OUT / name / "plugins" / "profile" / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for i in range(hosts):
        (run_dir / f"host{i:02d}.xplane.pb").symlink_to(host.resolve())
    (run_dir / ".complete").write_text(json.dumps({"events": events * hosts}))
    return run_dir


CAPTURES = {
    "train": lambda: _generate("train_2m", [train_design("train-host0", 2, 1_670)]),
    "infer": lambda: _generate("infer_500k", [infer_design("infer-host0", 2, 2_000)]),
    "pod16": lambda: _generate("pod16_250k", [train_design(f"pod-host{h:02d}", 4, 106, first_chip=4 * h)
                                              for h in range(16)]),
    "train16": lambda: _linked("train16_2m", CAPTURES["train"](), 16),
}
NO_XPROF = {"train16"}  # 16 copies of 82 MB for xprof: 1.3 GB of disk and minutes, for no check


def _xprof(run_dir: Path, bindir: Path) -> tuple[float, float, int, float]:
    copy = OUT / "xprof_copy" / run_dir.name
    shutil.rmtree(copy.parent, ignore_errors=True)
    copy.mkdir(parents=True)
    for f in run_dir.glob("*.xplane.pb"):
        shutil.copy(f, copy / f.name)
    for cache in Path(tempfile.gettempdir()).glob("xprof_cli_cache_*"):
        shutil.rmtree(cache, ignore_errors=True)
    try:
        return measure([str(bindir / "xprof"), "get_hlo_stats", str(copy), "--bypass_cache"])
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def host_scaling(counts: list[int], repeat: int) -> dict:
    """Wall time and peak memory of `tpudiag report` on N hosts of `pod16`, per N. Past 16 the same
    files are linked again under other names (their hostnames repeat, so the report renames them):
    as many hosts as asked, each of 244 k events."""
    files = sorted(CAPTURES["pod16"]().glob("*.xplane.pb"))
    env = {"PYTHONPATH": str(ROOT)}
    out = {"loadavg_before": os.getloadavg()[0]}
    for n in counts:
        run_dir = OUT / "pod16_subsets" / str(n) / "plugins" / "profile" / "run"
        shutil.rmtree(run_dir.parent.parent.parent, ignore_errors=True)
        run_dir.mkdir(parents=True)
        for i in range(n):
            f = files[i % len(files)]
            copy = i // len(files)
            (run_dir / (f.name if not copy else f"{f.name.removesuffix('.xplane.pb')}-{copy}.xplane.pb")).symlink_to(f)
        row = {}
        for label, extra in (("jobs1", ["--jobs", "1"]), ("default_jobs", [])):
            cmd = [sys.executable, "-m", "tpudiag", "report", "--format", "json", *extra, str(run_dir)]
            runs = [measure(cmd, env) for _ in range(repeat)]
            row[label] = {"wall_s": round(min(r[0] for r in runs), 2), "cpu_s": round(min(r[3] for r in runs), 2),
                          "peak_rss_gb": round(max(r[1] for r in runs), 2),
                          "driver_peak_rss_gb": round(max(r[4] for r in runs), 2), "exit": runs[-1][2]}
        out[f"{n}_hosts"] = row
        print(json.dumps({f"{n}_hosts": row}), file=sys.stderr)
    out["loadavg_after"] = os.getloadavg()[0]
    return out


def _summary(runs: list[tuple], driver: bool) -> dict:
    """Medians over the repeats (wall and CPU), the largest peak; every run's wall time kept."""
    out = {"wall_s": round(statistics.median(r[0] for r in runs), 2),
           "cpu_s": round(statistics.median(r[3] for r in runs), 2),
           "peak_rss_gb": round(max(r[1] for r in runs), 2), "exit": runs[-1][2],
           "all_wall_s": [round(r[0], 2) for r in runs]}
    if driver:
        out["driver_peak_rss_gb"] = round(max(r[4] for r in runs), 2)
        out["largest_process_rss_gb"] = round(max(r[5] for r in runs), 2)
    return out


# Issue 34's checks on one host of the training capture, and on 16 of them, from one run of this
# benchmark (medians).
ONE_HOST_MAX_WALL_S = 1.5
ONE_HOST_MAX_PEAK_MIB = 600
ONE_HOST_MIN_XPROF_RATIO = 10.0
POD_MAX_WALL_S = 12.0
POD_MAX_PROCESS_GB = 1.5


def one_host_checks(runs: list[tuple], xruns: list[tuple]) -> list[dict]:
    """Pass/fail of the one-host checks from the unrounded figures: median wall time, the largest
    peak (MiB of the process tree) and xprof's median wall over tpudiag's (None: xprof not run)."""
    wall = statistics.median(r[0] for r in runs)
    peak_mib = max(r[1] for r in runs) * 1e6 / 1024  # measure() gives kB / 1e6
    out = [{"check": f"tpudiag wall time at most {ONE_HOST_MAX_WALL_S} s", "value": f"{wall:.2f} s",
            "pass": wall <= ONE_HOST_MAX_WALL_S},
           {"check": f"tpudiag peak memory at most {ONE_HOST_MAX_PEAK_MIB} MiB", "value": f"{peak_mib:.0f} MiB",
            "pass": peak_mib <= ONE_HOST_MAX_PEAK_MIB}]
    ratio = statistics.median(r[0] for r in xruns) / wall if xruns else None
    out.append({"check": f"at least {ONE_HOST_MIN_XPROF_RATIO:.0f}x faster than xprof in wall time",
                "value": f"{ratio:.1f}x" if ratio is not None else "xprof not run",
                "pass": None if ratio is None else ratio >= ONE_HOST_MIN_XPROF_RATIO})
    return out


def pod_checks(runs: list[tuple]) -> list[dict]:
    """Pass/fail of the 16-host checks: the median wall time and the largest peak of any one process."""
    wall = statistics.median(r[0] for r in runs)
    largest = max(r[5] for r in runs)
    return [{"check": f"tpudiag wall time at most {POD_MAX_WALL_S:.0f} s", "value": f"{wall:.2f} s",
             "pass": wall <= POD_MAX_WALL_S, "scope": "16 hosts"},
            {"check": f"no process above {POD_MAX_PROCESS_GB} GB", "value": f"{largest:.2f} GB at most",
             "pass": largest <= POD_MAX_PROCESS_GB, "scope": "16 hosts"}]


def check_lines(results: dict) -> str:
    """One line per check: PASS, FAIL or SKIP, what was checked and the measured value."""
    lines = []
    for name, row in results.items():
        for c in row.get("checks", []) if isinstance(row, dict) else []:
            verdict = "SKIP" if c["pass"] is None else "PASS" if c["pass"] else "FAIL"
            lines.append(f"{verdict} {name} ({c.get('scope', 'one host')}): {c['check']}: {c['value']}")
    return "\n".join(lines)


def table(results: dict) -> str:
    """The side-by-side table the README and docs/speed.md quote: medians over the repeats."""
    lines = ["| Capture | tpudiag wall | tpudiag CPU | tpudiag peak | xprof wall | xprof CPU | xprof peak | "
             "xprof / tpudiag (wall, CPU) |", "|---|---|---|---|---|---|---|---|"]
    for name, row in results.items():
        if not isinstance(row, dict) or "tpudiag" not in row:
            continue
        t, x = row["tpudiag"], row.get("xprof_get_hlo_stats_cold")
        label = f"{name}: {row['hosts']} host{'s' * (row['hosts'] != 1)}, {row['events'] / 1e6:.2f} M events"
        theirs = (f"{x['wall_s']:.2f} s | {x['cpu_s']:.2f} s | {x['peak_rss_gb']:.2f} GB | "
                  f"{row['xprof_over_tpudiag_time']}x, {row['xprof_over_tpudiag_cpu']}x" if x else "- | - | - | -")
        lines.append(f"| {label} | {t['wall_s']:.2f} s | {t['cpu_s']:.2f} s | {t['peak_rss_gb']:.2f} GB | {theirs} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="train,infer,pod16,train16")
    parser.add_argument("--skip-xprof", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tool, taken in turn; medians are shown")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON to this file")
    parser.add_argument("--tpudiag-args", default="", help="extra arguments for `tpudiag report`")
    parser.add_argument("--host-scaling", default="", help="host counts of pod16 to time, e.g. 1,4,16")
    args = parser.parse_args()
    if args.host_scaling:
        print(json.dumps(host_scaling([int(n) for n in args.host_scaling.split(",")], args.repeat), indent=2))
        return
    bindir = Path(sys.executable).parent
    # This checkout's tpudiag, whatever is installed, with its bytecode cached as an installed
    # package's is (a shell with PYTHONDONTWRITEBYTECODE would recompile ~90 modules per run).
    env = {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": ""}
    subprocess.run([sys.executable, "-c", "import tpudiag.pipeline, tpudiag.cli.app"], env={**os.environ, **env},
                   check=True)
    results = {"loadavg_before": os.getloadavg()[0]}
    for name in args.only.split(","):
        run_dir = CAPTURES[name]()
        files = sorted(run_dir.glob("*.xplane.pb"))
        row = {"hosts": len(files), "events": json.loads((run_dir / ".complete").read_text())["events"],
               "mb": round(sum(f.stat().st_size for f in files) / 1e6, 1)}
        target = files[0] if len(files) == 1 else run_dir
        cmd = [sys.executable, "-m", "tpudiag", "report", "--format", "json", *args.tpudiag_args.split(),
               str(target)]
        runs, xruns = [], []
        for _ in range(args.repeat):  # in turn, so a slow moment of the machine hits both tools alike
            runs.append(measure(cmd, env))
            if not args.skip_xprof and name not in NO_XPROF:
                xruns.append(_xprof(run_dir, bindir))
        row["tpudiag"] = _summary(runs, driver=True)
        if xruns:
            row["xprof_get_hlo_stats_cold"] = _summary(xruns, driver=False)
            row["xprof_over_tpudiag_time"] = round(row["xprof_get_hlo_stats_cold"]["wall_s"]
                                                   / row["tpudiag"]["wall_s"], 1)
            row["xprof_over_tpudiag_cpu"] = round(row["xprof_get_hlo_stats_cold"]["cpu_s"]
                                                  / row["tpudiag"]["cpu_s"], 1)
        if len(files) == 1 and name == "train":
            row["checks"] = one_host_checks(runs, xruns)
        if name == "train16":
            row["checks"] = pod_checks(runs)
        results[name] = row
        print(json.dumps({name: row}), file=sys.stderr)
    results["loadavg_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"medians of {args.repeat} runs each, taken in turn; load average {results['loadavg_before']:.1f} before, "
          f"{results['loadavg_after']:.1f} after\n")
    print(table(results))
    checks = check_lines(results)
    if checks:
        print(f"\nissue 34 checks (load average {results['loadavg_after']:.1f}):\n{checks}")


if __name__ == "__main__":
    main()
