"""Captures for the diff and check tests: a 2-chip step of three ops with known durations.

Each op's duration is jittered per (seed, chip, step, op) by a uniform factor in ±`jitter`, and the
step lasts exactly as long as its ops plus a fixed 200 µs gap (host overhead), so an op that gets
slower makes the step slower by the same amount. Seeds make every capture reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

US = 1_000_000  # ps per µs
GAP_PS = 200 * US

OPS = {
    # name: (category, nominal duration in ps)
    "fusion.1": ("convolution fusion", 3000 * US),  # the matmul: 3 ms
    "fusion.2": ("loop fusion", 1000 * US),  # a memory-bound elementwise op: 1 ms
    "all-reduce.1": ("all-reduce", 500 * US),  # a synchronous gradient all-reduce: 0.5 ms
}


def op_defs(names) -> tuple[OpDef, ...]:
    defs = []
    for name in names:
        category, _ = OPS.get(name, ("loop fusion", 0))
        flops = 2.0e12 if category == "convolution fusion" else 1.0e9
        defs.append(OpDef(name, category, flops=flops, bytes_accessed=1.0e9, shape="bf16[1024,1024]{1,0}",
                          source=f"model.py:{10 + len(defs)}"))
    return tuple(defs)


def design(seed: int, jitter: float = 0.01, scale: Mapping[str, float] | None = None,
           durations: Mapping[str, int] | None = None, n_steps: int = 10, hostname: str = "host0",
           op_list: tuple[OpDef, ...] | None = None) -> CaptureDesign:
    """`scale`: op -> factor on its nominal duration (the planted change); `durations` overrides the op set."""
    nominal = dict(durations) if durations is not None else {k: v for k, (_, v) in OPS.items()}
    scale = scale or {}

    def dur(chip: int, step: int, op: str) -> int:
        r = random.Random(f"{seed}/{hostname}/{chip}/{step}/{op}")
        return int(nominal[op] * scale.get(op, 1.0) * (1 + r.uniform(-jitter, jitter)))

    def schedule(chip: int, step: int) -> list[Placed]:
        t, out = 0, []
        for op in nominal:
            d = dur(chip, step, op)
            out.append(Placed(op, t, d))
            t += d
        return out

    def step_length(chip: int, step: int) -> int:
        # Every chip's step ends when the slowest chip's ops are done (they synchronise in the all-reduce).
        return max(sum(dur(c, step, op) for op in nominal) for c in range(2)) + GAP_PS

    return CaptureDesign(hostname=hostname, device_type="TPU v6 Lite", peak_tflops=918.0, peak_hbm_gbs=1640.0,
                         module="jit_train_step", program_id=1000 + seed, ops=op_list or op_defs(nominal),
                         n_chips=2, n_steps=n_steps, step_ps=0, schedule=schedule, step_ps_for=step_length)


def write(root: Path, name: str, d: CaptureDesign) -> Path:
    """Write `d` as a one-run logdir `root/name` and return the run directory."""
    run_dir = root / name / "plugins" / "profile" / "run"
    write_capture(d, run_dir)
    return run_dir
