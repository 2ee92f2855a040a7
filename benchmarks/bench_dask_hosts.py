"""Many hosts on a Dask cluster: wall time and the driver's peak memory as the host count grows.

A pod of H hosts is simulated with one small training host (`bench_realistic.train_design`: 2 v6e
chips, a few steps of the 52-layer while loop, about 12 k events) linked H times under other
names, so the files cost no disk; the report renames the repeated hostnames. A `LocalCluster` of
worker processes (one thread each: parsing holds the GIL) parses and digests the hosts, and
`tpudiag report --scheduler ADDRESS --format json` is the driver: it receives each host's digest
and folds its per-step tables as it arrives, keeping no events. The driver is the only process
measured (the workers belong to the cluster, not to it), so its peak is what grows with H.

What it prints: per host count, the wall time, the driver's peak resident memory and the load
average, and at the end the driver's growth per host between the smallest and the largest count,
with issue 34's check as a PASS / FAIL line: under 1 MiB per host, up to at least 256 hosts. On a 2-core machine the workers share the cores with the driver; on a real cluster
(docs/scaling.md) the wall time divides by the workers.

Usage: python benchmarks/bench_dask_hosts.py [--hosts 16,64,256] [--workers 2] [--steps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_realistic import ROOT, _generate, _linked, measure, train_design  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", default="16,64,256")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="steps of the source host (its size)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from distributed import LocalCluster

    source_dir = _generate(f"dask_host_{args.steps}", [train_design("pod-host", 2, args.steps)])
    events = json.loads((source_dir / ".complete").read_text())["events"]
    env = {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": ""}
    results: dict = {"events_per_host": events, "workers": args.workers, "loadavg_before": os.getloadavg()[0]}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        for hosts in [int(h) for h in args.hosts.split(",")]:
            run_dir = _linked(f"dask_pod_{hosts}", source_dir, hosts)  # H links to the one host file
            cmd = [sys.executable, "-m", "tpudiag", "report", "--format", "json", "--scheduler",
                   cluster.scheduler_address, str(run_dir)]
            t0 = time.perf_counter()
            wall, _, code, cpu, driver_gb, _ = measure(cmd, env)
            results[f"{hosts}_hosts"] = {"wall_s": round(wall, 2), "driver_cpu_s": round(cpu, 2),
                                         "driver_peak_mb": round(driver_gb * 1e3, 1), "exit": code,
                                         "loadavg": round(os.getloadavg()[0], 1)}
            print(json.dumps({hosts: results[f"{hosts}_hosts"]}), f"({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr)
    counts = sorted(int(k.split("_")[0]) for k in results if k.endswith("_hosts"))
    lo, hi = results[f"{counts[0]}_hosts"], results[f"{counts[-1]}_hosts"]
    if counts[-1] > counts[0]:
        results["driver_growth_mib_per_host"] = round(
            (hi["driver_peak_mb"] - lo["driver_peak_mb"]) * 1e6 / 2**20 / (counts[-1] - counts[0]), 3)
    results["loadavg_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{events:,} events per host, {args.workers} Dask worker processes on a LocalCluster; load average "
          f"{results['loadavg_before']:.1f} before, {results['loadavg_after']:.1f} after\n")
    print("| Hosts | wall | driver CPU | driver peak | exit | load average after |\n|---|---|---|---|---|---|")
    for n in counts:
        r = results[f"{n}_hosts"]
        print(f"| {n} | {r['wall_s']:.1f} s | {r['driver_cpu_s']:.1f} s | {r['driver_peak_mb']:.0f} MB | {r['exit']} "
              f"| {r['loadavg']} |")
    if "driver_growth_mib_per_host" in results:
        print(f"\ndriver growth: {results['driver_growth_mib_per_host']} MiB per host "
              f"({counts[0]} -> {counts[-1]} hosts)")
    print("\nissue 34 check:\n" + check_line(results, counts))


MAX_GROWTH_MIB_PER_HOST = 1.0
MIN_HOSTS = 256


def check_line(results: dict, counts: list[int]) -> str:
    """PASS / FAIL: the driver grows by less than 1 MiB per host, measured up to at least 256 hosts
    with every run's exit 0 (SKIP when fewer hosts were run)."""
    check = f"driver peak grows by less than {MAX_GROWTH_MIB_PER_HOST:.0f} MiB per host, up to {MIN_HOSTS}+ hosts"
    growth = results.get("driver_growth_mib_per_host")
    if growth is None or counts[-1] < MIN_HOSTS:
        return f"SKIP dask ({counts[-1]} hosts at most): {check}: run --hosts 16,{MIN_HOSTS}"
    ok = growth < MAX_GROWTH_MIB_PER_HOST and all(results[f"{n}_hosts"]["exit"] == 0 for n in counts)
    return f"{'PASS' if ok else 'FAIL'} dask ({counts[0]} -> {counts[-1]} hosts): {check}: {growth} MiB per host"


if __name__ == "__main__":
    main()
