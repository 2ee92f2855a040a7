"""Write the bundled example: a TPU-shaped training capture of 4 v6e chips, 6 steps.

The capture follows XProf's TPU conventions and is *designed*, not measured: every op's duration
is derived from a FLOP or byte count and a chosen efficiency against the TPU v6e per-chip peaks
(918 TFLOP/s bf16, 1,640 GB/s HBM; public figures). How the numbers were chosen:

- One transformer layer's forward+backward worth of ops per step, batch 8 x sequence 1024
  (8,192 tokens), model width 4,096, MLP 16,384, vocabulary 50,257 (GPT-2's, deliberately not a
  multiple of 128 so the logits carry tile padding).
- Matmul fusions (`convolution fusion`) run at 45-62 % of peak FLOP/s: typical for well-shaped
  bf16 matmuls. Their durations are flops / (efficiency x peak).
- Layer norms, residual adds and the softmax are `loop fusion`s bound by HBM at 70-85 % of
  bandwidth: duration = bytes / (efficiency x bandwidth).
- FSDP weight all-gathers are async: `all-gather-start.1`/`done.1` is hidden behind the QKV
  matmul; `all-gather-start.2.0`/`done.2.0` (a double-suffix clone, as XLA names them) starts
  late and is partly exposed. The gradient `all-reduce.3` is synchronous and fully exposed;
  `reduce-scatter.4` is an `all-reduce-scatter` fusion, also synchronous.
- Chip 3 is a mild straggler: its matmuls run at 95 % of the others' speed.
- Steps are 26 ms with the ops packed from the step start; the remainder is idle (host overhead).

Run `python examples/make_example_capture.py` to regenerate it; the output is deterministic and a
test checks the committed file equals a fresh one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

PEAK_FLOPS = 918e12
PEAK_HBM = 1640e9
TOKENS, D, F, V = 8192, 4096, 16384, 50257
BF16 = 2
US = 1_000_000  # ps per µs
RUN = "2026_11_29_00_00_00"
OUT = Path(__file__).resolve().parent / "captures" / "train_v6e_4chip"


def matmul(name: str, m: int, k: int, n: int, efficiency: float, src: str, tf_op: str) -> tuple[OpDef, float]:
    flops = 2.0 * m * k * n
    nbytes = float((m * k + k * n + m * n) * BF16)
    shape = f"bf16[{m},{n}]{{1,0:T(8,128)(2,1)}}"
    return OpDef(name, "convolution fusion", flops=flops, bytes_accessed=nbytes, shape=shape, source=src,
                 tf_op=tf_op), flops / (efficiency * PEAK_FLOPS)


def memory(name: str, nbytes: float, efficiency: float, src: str, tf_op: str, flops: float = 0.0,
           shape: str = "") -> tuple[OpDef, float]:
    return OpDef(name, "loop fusion", flops=flops, bytes_accessed=nbytes, shape=shape, source=src,
                 tf_op=tf_op), nbytes / (efficiency * PEAK_HBM)


def build_ops() -> tuple[tuple[OpDef, ...], dict[str, float]]:
    act = TOKENS * D * BF16
    specs = [
        memory("fusion.1", 2 * act, 0.80, "model.py:41", "jit(train_step)/layer_norm",
               flops=8 * TOKENS * D, shape=f"bf16[{TOKENS},{D}]{{1,0:T(8,128)(2,1)}}"),
        matmul("fusion.2", TOKENS, D, 3 * D, 0.60, "model.py:52", "jit(train_step)/attn/qkv"),
        matmul("fusion.3", TOKENS, D, D, 0.45, "model.py:60", "jit(train_step)/attn/scores"),
        memory("fusion.4", 3 * act, 0.75, "model.py:61", "jit(train_step)/attn/softmax",
               flops=5 * TOKENS * D, shape=f"bf16[{TOKENS},{D}]{{1,0:T(8,128)(2,1)}}"),
        matmul("fusion.5", TOKENS, D, D, 0.55, "model.py:64", "jit(train_step)/attn/out"),
        matmul("fusion.6", TOKENS, D, F, 0.62, "model.py:71", "jit(train_step)/mlp/up"),
        matmul("fusion.7", TOKENS, F, D, 0.58, "model.py:73", "jit(train_step)/mlp/down"),
        matmul("fusion.8", TOKENS, D, V, 0.50, "model.py:80", "jit(train_step)/logits"),
        memory("fusion.9", 2 * TOKENS * V * BF16, 0.70, "model.py:81", "jit(train_step)/cross_entropy",
               flops=4 * TOKENS * V, shape=f"bf16[{TOKENS},{V}]{{1,0:T(8,128)(2,1)}}"),
        matmul("fusion.10", TOKENS, F, D, 0.52, "model.py:73", "jit(train_step)/transpose(mlp/down)"),
        matmul("fusion.11", TOKENS, D, F, 0.55, "model.py:71", "jit(train_step)/transpose(mlp/up)"),
        memory("copy.1", act, 0.85, "model.py:90", "jit(train_step)/optimizer/copy",
               shape=f"bf16[{TOKENS},{D}]{{0,1:T(8,128)(2,1)}}"),
        memory("fusion.12", 6 * D * F * BF16 // 4, 0.80, "optim.py:12", "jit(train_step)/adam_update",
               flops=10 * D * F // 4, shape=f"f32[{D},{F // 4}]{{1,0:T(8,128)}}"),
    ]
    ops = [op for op, _ in specs]
    seconds = {op.name: s for op, s in specs}
    weight_shard = D * 3 * D * BF16 // 4
    collectives = [
        (OpDef("all-gather-start.1", "all-gather", bytes_accessed=weight_shard,
               shape=f"bf16[{D},{3 * D}]{{1,0:T(8,128)(2,1)}}"), 12 * US),
        (OpDef("all-gather-done.1", "all-gather", bytes_accessed=weight_shard,
               shape=f"bf16[{D},{3 * D}]{{1,0:T(8,128)(2,1)}}"), 3 * US),
        (OpDef("all-gather-start.2.0", "all-gather", bytes_accessed=D * F * BF16 // 4,
               shape=f"bf16[{D},{F}]{{1,0:T(8,128)(2,1)}}"), 12 * US),
        (OpDef("all-gather-done.2.0", "all-gather", bytes_accessed=D * F * BF16 // 4,
               shape=f"bf16[{D},{F}]{{1,0:T(8,128)(2,1)}}"), 260 * US),
        (OpDef("all-reduce.3", "all-reduce", bytes_accessed=D * D * 4, shape=f"f32[{D},{D}]{{1,0:T(8,128)}}"),
         620 * US),
        (OpDef("all-reduce-scatter.4", "all-reduce-scatter fusion", bytes_accessed=D * F * 4,
               shape=f"f32[{D // 4},{F}]{{1,0:T(8,128)}}"), 410 * US),
    ]
    for op, ps in collectives:
        ops.append(op)
        seconds[op.name] = ps / 1e12
    return tuple(ops), seconds


OPS, SECONDS = build_ops()
ORDER = ["fusion.1", "all-gather-start.1", "fusion.2", "all-gather-done.1", "fusion.3", "fusion.4", "fusion.5",
         "fusion.1", "all-gather-start.2.0", "fusion.6", "all-gather-done.2.0", "fusion.7", "fusion.8", "fusion.9",
         "fusion.10", "fusion.11", "all-reduce-scatter.4", "all-reduce.3", "copy.1", "fusion.12"]


def schedule(chip: int, step: int) -> list[Placed]:
    slow = 1 / 0.95 if chip == 3 else 1.0
    t = 0
    placed = []
    for name in ORDER:
        dur = int(SECONDS[name] * 1e12 * (slow if "fusion" in name and "scatter" not in name else 1.0))
        placed.append(Placed(name, t, dur))
        t += dur
    return placed


def design() -> CaptureDesign:
    return CaptureDesign(hostname="host0", device_type="TPU v6 Lite", peak_tflops=PEAK_FLOPS / 1e12,
                         peak_hbm_gbs=PEAK_HBM / 1e9, module="jit_train_step", program_id=7731224951318207541,
                         ops=OPS, n_chips=4, n_steps=6, step_ps=26_000 * US, schedule=schedule, first_step=10)


def main(out: Path = OUT) -> Path:
    return write_capture(design(), out / "plugins" / "profile" / RUN)


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
