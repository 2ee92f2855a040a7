"""GPU captures built in code: kernels on the streams of `/device:GPU:N` planes, as CUPTI/roctracer
captures record them through XLA's profiler (`hlo_op`, `hlo_module`, `program_id` on each kernel),
with an optional `Steps` line per GPU.

Each scenario says what it holds; the tests derive their expectations from the kernel spans here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpudiag.writers.xspace_builder import U64, XSpaceBuilder

US = 1_000_000  # ps
T0_NS = 1_700_000_000_000_000_000  # the lines' timestamp: an epoch clock, as real captures have
H100 = {"device_vendor": "Nvidia", "compute_cap_major": 9, "compute_cap_minor": 0, "core_count": 132,
        "clock_rate": 1_980_000, "memory_bandwidth": 3_352_320_000_000, "memory_size": 85_520_809_984}
MI300X = {"device_vendor": "AMD", "compute_cap_major": 9, "compute_cap_minor": 4, "core_count": 304,
          "clock_rate": 2_100_000, "memory_bandwidth": 2_662_400_000_000, "memory_size": 206_141_652_992}
COMPUTE, NCCL = 13, 20  # stream ids: XLA's compute stream, the collective library's


@dataclass(frozen=True)
class Kernel:
    name: str  # the kernel's own name (event metadata)
    start_us: float
    dur_us: float
    hlo_op: str = ""  # "" for a kernel no HLO op launched
    stream: int = COMPUTE


@dataclass(frozen=True)
class Gpu:
    kernels: tuple[Kernel, ...]
    steps: tuple[tuple[float, float], ...] = ()  # (start_us, dur_us) per step, numbered from 0


@dataclass(frozen=True)
class GpuCapture:
    gpus: tuple[Gpu, ...]
    host: str = "gpuhost"
    device: dict = field(default_factory=lambda: dict(H100))


def write(capture: GpuCapture, root: Path) -> Path:
    """`root/<host>.xplane.pb`, one plane per GPU, one line per stream."""
    space = XSpaceBuilder(capture.host)
    for g, gpu in enumerate(capture.gpus):
        plane = space.plane(f"/device:GPU:{g}", g + 1)
        for key, value in capture.device.items():
            plane.set_stat(key, U64(value) if isinstance(value, int) else value)
        streams = sorted({k.stream for k in gpu.kernels})
        lines = {s: plane.line(f"Stream #{s}({'compute' if s == COMPUTE else 'nccl'})", s, T0_NS) for s in streams}
        metas: dict[str, object] = {}
        for k in sorted(gpu.kernels, key=lambda k: k.start_us):
            meta = metas.setdefault(k.name, plane.event_metadata(k.name))
            stats = {"hlo_op": k.hlo_op, "hlo_module": "jit_train_step", "program_id": U64(7)} if k.hlo_op else {}
            lines[k.stream].event(meta, round(k.start_us * US), round(k.dur_us * US), stats)
        if gpu.steps:
            line = plane.line("Steps", 1000, T0_NS)
            for i, (start, dur) in enumerate(gpu.steps):
                line.event(plane.event_metadata(str(i)), round(start * US), round(dur * US), {"group_id": U64(i)})
    root.mkdir(parents=True, exist_ok=True)
    return space.write(root / f"{capture.host}.xplane.pb")


def gemm(start_us: float, dur_us: float, op: str = "gemm_fusion_dot.1") -> Kernel:
    return Kernel("sm90_xmma_gemm_bf16bf16_bf16f32", start_us, dur_us, op)


def all_reduce(start_us: float, dur_us: float, op: str = "all-reduce-start.1") -> Kernel:
    """XLA's async all-reduce: NCCL's kernel on the collective stream, named by its start op."""
    return Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", start_us, dur_us, op, NCCL)


def training(n_gpus: int = 2, n_steps: int = 4, step_us: float = 1000.0, gemm_us: float = 600.0,
             ar_us: float = 200.0, ar_at_us: float | None = None, slow_gpu: int | None = None,
             slow_extra_us: float = 0.0, step_extra_us: tuple[float, ...] = (), with_steps: bool = True) -> GpuCapture:
    """`n_steps` steps per GPU: a gemm from each step's start, then an all-reduce at `ar_at_us` into
    the step (after the gemm when None: exposed; inside it: hidden). `slow_gpu`'s gemm takes
    `slow_extra_us` longer; `step_extra_us[i]` lengthens step i's gemm on every GPU. Without
    `with_steps` the GPUs get no `Steps` line (a capture without step markers)."""
    per_gpu: list[tuple[list[Kernel], list[tuple[float, float]]]] = [([], []) for _ in range(n_gpus)]
    t = 0.0
    for i in range(n_steps):  # one step length for every GPU: the slowest one's (a synchronous program)
        extra = step_extra_us[i] if i < len(step_extra_us) else 0.0
        g_us = [gemm_us + extra + (slow_extra_us if g == slow_gpu else 0.0) for g in range(n_gpus)]
        at = [g_us[g] if ar_at_us is None else ar_at_us for g in range(n_gpus)]
        length = max(step_us + extra, *(a + ar_us for a in at), *(u + 1.0 for u in g_us))
        for g, (kernels, steps) in enumerate(per_gpu):
            kernels += [gemm(t, g_us[g]), all_reduce(t + at[g], ar_us)]
            steps.append((t, length))
        t += length
    return GpuCapture(tuple(Gpu(tuple(k), tuple(s) if with_steps else ()) for k, s in per_gpu))
