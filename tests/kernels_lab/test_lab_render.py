"""The tune table as the user sees it, from a sweep result built in code (no libtpu needed)."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from tpudiag.kernels_lab.render import render_sweep
from tpudiag.kernels_lab.sweep import CandidateResult, SweepResult, XlaBaseline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from snapshot_util import assert_snapshot  # noqa: E402


def v5e_sweep() -> SweepResult:
    """The reference's 2048^3 bf16 matmul on v5e (§8.2 numbers): two candidates ranked by
    max(estimate, HBM floor), one the compiler refused, one our VMEM check rejected."""
    clock, bw = 1.5e9, 819e9
    ok = [("bm=512 bk=2048 bn=512", (4, 4, 1), 10 << 20, 50_331_648, 141_831, 1.6),
          ("bm=256 bk=2048 bn=256", (8, 8, 1), 3 << 20, 142_606_336, 180_552, 1.3)]
    results = [CandidateResult(label, {}, "ok", "", grid, vmem, nbytes / bw, cycles, cycles / clock, None, secs)
               for label, grid, vmem, nbytes, cycles, secs in ok]
    results.append(CandidateResult("bm=1024 bk=1024 bn=1024", {}, "rejected",
                                   "scoped VMEM OOM (CompileTimeScopedVmemOom): 18.36 MiB needed, limit 16.00 MiB",
                                   (2, 2, 2), 16 << 20, 41_943_040 / bw))
    results.append(CandidateResult("bm=2048 bk=2048 bn=2048", {}, "invalid",
                                   "matmul blocks 2048,2048,2048: blocks need 64.00 MiB of VMEM (2 buffers per "
                                   "blocked operand, plus scratch); expected at most 16.00 MiB", (1, 1, 1), 64 << 20,
                                   25_165_824 / bw))
    xla = XlaBaseline(None, 138_056, 138_056 / clock, 25_165_824 / bw, "ok", "")
    return SweepResult("fusion.7", "matmul", {}, 1, "v5e:2x2", "v5e", "TPU v5 lite", clock, "estimate+floor",
                       "ranked by max(compiler-estimated cycles / 1.5 GHz, bytes moved / 819 GB/s HBM): a modelled "
                       "estimate, not a measurement", tuple(results), xla, "DIR/tune-v5e_2x2.jsonl")


def test_tune_table_snapshot():
    console = Console(width=140, record=True, color_system=None)
    render_sweep(v5e_sweep(), console)
    assert_snapshot(console.export_text(), "lab_tune_v5e_matmul.txt")


def test_best_is_the_lowest_bounded_time():
    result = v5e_sweep()
    assert result.best.label == "bm=512 bk=2048 bn=512"
    # 256,2048,256: estimated 120.4 us but its blocking moves 142.6 MB, 174.1 us at 819 GB/s
    slow = result.results[1]
    assert slow.est_s < slow.hbm_floor_s and slow.bounded_s == slow.hbm_floor_s
