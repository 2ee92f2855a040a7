"""Captures for the rule tests, built in code with known values. One function per scenario.

Every design is a "TPU v6 Lite" (918 TFLOP/s, 1,640 GB/s per chip: ridge 560 FLOP/B, MXU 256)
with 2 chips and 3 steps of 10 ms unless it says otherwise. Durations are chosen so the numbers
the rules print can be worked out by hand; the comments say how.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tpudiag import rules
from tpudiag.analysis.profile_analysis import Analysis, analyze
from tpudiag.inputs import capture_compiled
from tpudiag.model.findings import Finding
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.report import RuleSkip
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import CaptureDesign, HostSpan, OpDef, Placed, write_capture

REPO = Path(__file__).resolve().parents[2]
US = 1_000_000  # ps per µs
PEAK = 918e12
HBM = 1640e9
STEP = 10_000 * US


def design(ops, schedule, **overrides) -> CaptureDesign:
    fields = dict(hostname="host0", device_type="TPU v6 Lite", peak_tflops=PEAK / 1e12, peak_hbm_gbs=HBM / 1e9,
                  module="jit_train_step", program_id=77, ops=tuple(ops), n_chips=2, n_steps=3, step_ps=STEP,
                  schedule=schedule)
    fields.update(overrides)
    return CaptureDesign(**fields)


def write_run(d: CaptureDesign, root: Path) -> Path:
    """Write the design as `<root>/plugins/profile/run/host0.xplane.pb`; return the run directory."""
    run = root / "plugins" / "profile" / "run"
    write_capture(d, run)
    return run


# Designs analysed so far in this process, by `_design_key`: the same design gives the same analysis,
# so the tests that share a design (and mutmut's forked runs, which inherit this from the run that
# timed the tests) build and analyse it once. Rules never write into an analysis.
_ANALYSED: dict[str, Analysis] = {}


def _design_key(d: CaptureDesign) -> str | None:
    """The design's repr, when every function in it is a module-level one (whose repr names it for the
    whole process); None for a design holding a closure or lambda, which is analysed afresh each time."""
    for value in vars(d).values():
        if callable(value) and "<" in getattr(value, "__qualname__", "<"):
            return None
    return repr(d)


def analyse(d: CaptureDesign, root: Path) -> Analysis:
    """The design written under `root` and analysed; a design analysed before comes from `_ANALYSED`
    (nothing is written then)."""
    key = _design_key(d)
    if key is None:
        return analyse_path(write_run(d, root))
    if key not in _ANALYSED:
        _ANALYSED[key] = analyse_path(write_run(d, root))
    return _ANALYSED[key]


def analyse_path(path: Path) -> Analysis:
    """A capture written some other way (`tests.gpu_captures`), analysed as `analyse` does."""
    return analyze(load_capture(path, jobs=1))


def run_rules(analysis: Analysis | None, config: rules.RulesConfig | None = None,
              compiled: CompiledInputs | None = None, **kwargs) -> tuple[list[Finding], list[RuleSkip]]:
    """`tpudiag.rules.run_rules` as `tpudiag.diagnose` calls it: with the compiled inputs the
    inputs stage reads with the capture (the HLO it embeds, the chip its device names). A
    `compiled` given stands for `--dumps` alone (no embedded HLO) and gets the capture's chip
    when it names none."""
    if analysis is not None:
        read, _ = capture_compiled(analysis.profile)
        compiled = read if compiled is None else replace(compiled, chip=compiled.chip or read.chip)
    return rules.run_rules(analysis, config, compiled or CompiledInputs(), **kwargs)


def matmul(name: str, m: int, k: int, n: int, util: float, dtype: str = "bf16",
           category: str = "convolution fusion") -> tuple[OpDef, int]:
    """An `m x k @ k x n` matmul fusion running at `util` of peak: (op, duration in ps)."""
    size = 4 if dtype == "f32" else 2
    flops = 2.0 * m * k * n
    nbytes = float((m * k + k * n + m * n) * size)
    text = (f"%{name} = {dtype}[{m},{n}]{{1,0}} fusion({dtype}[{m},{k}]{{1,0}} %p0, {dtype}[{k},{n}]{{1,0}} %p1), "
            f"kind=kOutput, calls=%fused_computation.{name}")
    op = OpDef(name, category, flops=flops, bytes_accessed=nbytes, shape=f"{dtype}[{m},{n}]{{1,0:T(8,128)}}",
               hlo_text=text)
    return op, round(flops / (util * PEAK) * 1e12)


# -- exposed-collective ---------------------------------------------------------------------------

COMPUTE = OpDef("fusion.1", "loop fusion", bytes_accessed=1.0e9)  # compute that hides collectives (not a matmul)
COMPUTE2 = OpDef("fusion.2", "loop fusion", bytes_accessed=1.0e9)
AG1_START = OpDef("all-gather-start.1", "all-gather", bytes_accessed=1.0e7)
AG1_DONE = OpDef("all-gather-done.1", "all-gather", bytes_accessed=1.0e7)
AG2_START = OpDef("all-gather-start.2", "all-gather", bytes_accessed=1.0e7)
AG2_DONE = OpDef("all-gather-done.2", "all-gather", bytes_accessed=1.0e7)
AG3_START = OpDef("all-gather-start.3.0", "all-gather", bytes_accessed=1.0e7)  # double suffix, as XLA clones name
AG3_DONE = OpDef("all-gather-done.3.0", "all-gather", bytes_accessed=1.0e7)
AR = OpDef("all-reduce.4", "all-reduce", bytes_accessed=4.0e7)
COLLECTIVE_OPS = (COMPUTE, COMPUTE2, AG1_START, AG1_DONE, AG2_START, AG2_DONE, AG3_START, AG3_DONE, AR)


def exposed_collectives_schedule(chip: int, step: int) -> list[Placed]:
    """Per step and chip (known values):

    - all-gather.1: start and done adjacent, nothing between: a 410 µs window, fully exposed.
    - all-gather.2: a 1,020 µs window around 1,000 µs of fusion.2: hidden (98 % covered), 20 µs exposed.
    - all-gather.3.0 (double suffix): 1,400 µs window, 1,000 µs covered: partial, 400 µs exposed.
    - all-reduce.4: synchronous, 500 µs on chip 0 and 800 µs on chip 1: fully exposed.
    Async exposed per step (worst core) = 410 + 20 + 400 = 830 µs; sync = 800 µs (chip 1).
    """
    ar = 500 * US if chip == 0 else 800 * US
    return [
        Placed("fusion.1", 0, 2000 * US),
        Placed("all-gather-start.1", 2000 * US, 10 * US),
        Placed("all-gather-done.1", 2010 * US, 400 * US),
        Placed("all-gather-start.2", 2500 * US, 10 * US),
        Placed("fusion.2", 2510 * US, 1000 * US),
        Placed("all-gather-done.2", 3510 * US, 10 * US),
        Placed("all-gather-start.3.0", 4000 * US, 10 * US),
        Placed("fusion.1", 4010 * US, 1000 * US),
        Placed("all-gather-done.3.0", 5010 * US, 390 * US),
        Placed("all-reduce.4", 6000 * US, ar),
    ]


def exposed_collectives(**overrides) -> CaptureDesign:
    return design(COLLECTIVE_OPS, exposed_collectives_schedule, **overrides)


def hidden_collectives_schedule(chip: int, step: int) -> list[Placed]:
    """Negative: every async window is covered by compute (≥ 98 %), no synchronous collective."""
    return [
        Placed("all-gather-start.2", 0, 10 * US),
        Placed("fusion.1", 10 * US, 3000 * US),
        Placed("all-gather-done.2", 3010 * US, 10 * US),
        Placed("all-gather-start.1", 3100 * US, 10 * US),
        Placed("fusion.2", 3110 * US, 1000 * US),
        Placed("all-gather-done.1", 4110 * US, 10 * US),
    ]


def hidden_collectives(**overrides) -> CaptureDesign:
    return design(COLLECTIVE_OPS, hidden_collectives_schedule, **overrides)


def barely_exposed_schedule(chip: int, step: int) -> list[Placed]:
    """Near miss: one adjacent all-gather exposing 90 µs per 10 ms step (0.9 %, just under the
    default 1 % `min_exposed_fraction`); its window is still classified exposed."""
    return [
        Placed("fusion.1", 0, 3000 * US),
        Placed("all-gather-start.1", 3000 * US, 10 * US),
        Placed("all-gather-done.1", 3010 * US, 80 * US),
    ]


def barely_exposed(**overrides) -> CaptureDesign:
    return design(COLLECTIVE_OPS, barely_exposed_schedule, **overrides)


# -- low-mxu-utilization ---------------------------------------------------------------------------

# Durations follow from FLOPs / (util x 918 TFLOP/s): about 1.8, 0.94, 1.5, 0.96, 1.1 ms and 22 µs.
MISALIGNED, MISALIGNED_PS = matmul("fusion.10", 32768, 1000, 5000, 0.20)  # dims 1000, 5000 on a 256 MXU; OI 833
SMALL_BATCH, SMALL_BATCH_PS = matmul("fusion.11", 8, 4096, 32768, 0.002)  # 8 rows: memory-bound (OI 8), 0.2 %
F32_MM, F32_MM_PS = matmul("fusion.12", 4096, 4096, 6144, 0.15, dtype="f32")  # f32 operands, 15 % of peak
ALIGNED, ALIGNED_PS = matmul("fusion.13", 16384, 4096, 4096, 0.60)  # healthy: 60 % of peak
NEAR_UTIL, NEAR_UTIL_PS = matmul("fusion.14", 16384, 4096, 4096, 0.51)  # near miss: just above 50 %
SMALL_SLOW, SMALL_SLOW_PS = matmul("fusion.15", 1024, 1000, 1000, 0.10)  # near miss: slow but 0.2 % of time
LOOP = OpDef("fusion.16", "loop fusion", flops=1.0e9, bytes_accessed=1.6e9)  # low FLOP util, but not a matmul
MXU_OPS = (MISALIGNED, SMALL_BATCH, F32_MM, ALIGNED, NEAR_UTIL, SMALL_SLOW, LOOP)


def mxu_schedule(chip: int, step: int) -> list[Placed]:
    order = [("fusion.10", MISALIGNED_PS), ("fusion.11", SMALL_BATCH_PS), ("fusion.12", F32_MM_PS),
             ("fusion.13", ALIGNED_PS), ("fusion.14", NEAR_UTIL_PS), ("fusion.15", SMALL_SLOW_PS),
             ("fusion.16", 1000 * US)]
    t, out = 0, []
    for name, dur in order:
        out.append(Placed(name, t, dur))
        t += dur
    return out


def low_mxu(**overrides) -> CaptureDesign:
    return design(MXU_OPS, mxu_schedule, **overrides)


# -- padding-waste ---------------------------------------------------------------------------------

PADDED = OpDef("fusion.20", "loop fusion", bytes_accessed=1.6e9, shape="f32[3,50257]{1,0:T(4,128)}")  # 25 % padding
ALIGNED_LAYOUT = OpDef("fusion.21", "loop fusion", bytes_accessed=1.6e9, shape="f32[8,1024]{1,0:T(8,128)}")  # none
NEAR_PADDED = OpDef("fusion.22", "loop fusion", bytes_accessed=1.6e9, shape="f32[8,1160]{1,0:T(8,128)}")  # 9.4 %
VOCAB = OpDef("fusion.23", "loop fusion", bytes_accessed=1.6e9,
              shape="bf16[8192,50257]{1,0:T(8,128)(2,1)}")  # 0.09 %: the lane padding of a vocabulary is small
PADDING_OPS = (PADDED, ALIGNED_LAYOUT, NEAR_PADDED, VOCAB)


def padding_schedule(chip: int, step: int) -> list[Placed]:
    """Each op 1,000 µs per step: fusion.20's saving is 1,000 µs x 25 % = 250 µs per step."""
    return [Placed(op.name, i * 1000 * US, 1000 * US) for i, op in enumerate(PADDING_OPS)]


def padding(**overrides) -> CaptureDesign:
    return design(PADDING_OPS, padding_schedule, **overrides)


# -- healthy ---------------------------------------------------------------------------------------

def healthy_schedule(chip: int, step: int) -> list[Placed]:
    """Aligned bf16 matmuls at 60 % of peak, an all-gather hidden behind one of them; the step is
    exactly as long as its ops (about 2.0 ms), so the TensorCores never idle."""
    return [
        Placed("all-gather-start.1", 0, 10 * US),
        Placed("fusion.13", 10 * US, ALIGNED_PS),
        Placed("all-gather-done.1", 10 * US + ALIGNED_PS, 10 * US),
        Placed("fusion.13", 20 * US + ALIGNED_PS, ALIGNED_PS),
    ]


HEALTHY_STEP = 20 * US + 2 * ALIGNED_PS


def healthy(**overrides) -> CaptureDesign:
    return design((ALIGNED, AG1_START, AG1_DONE), healthy_schedule, **{"step_ps": HEALTHY_STEP, **overrides})


def with_device(d: CaptureDesign, device_type: str, peak_tflops: float, peak_hbm_gbs: float) -> CaptureDesign:
    return replace(d, device_type=device_type, peak_tflops=peak_tflops, peak_hbm_gbs=peak_hbm_gbs)


# -- device-idle -----------------------------------------------------------------------------------

# v6e decode (the first capture): per execution seven weight matmuls x[32,8192] @ w[8192,8192]
# (bf16), each reading 134 MB of weights at 85 % of 1,640 GB/s: OI 31.7 FLOP/B, 4.8 % of peak FLOP/s.
DECODE_M, DECODE_K, DECODE_N = 32, 8192, 8192
DECODE_BYTES = float((DECODE_M * DECODE_K + DECODE_K * DECODE_N + DECODE_M * DECODE_N) * 2)
DECODE_FLOPS = 2.0 * DECODE_M * DECODE_K * DECODE_N
DECODE_MM_PS = round(DECODE_BYTES / (0.85 * HBM) * 1e12)  # 97.1 µs
DECODE_OPS = tuple(OpDef(
    f"fusion.{30 + i}", "convolution fusion", flops=DECODE_FLOPS, bytes_accessed=DECODE_BYTES,
    hbm_read_bytes=DECODE_BYTES - DECODE_M * DECODE_N * 2, hbm_write_bytes=DECODE_M * DECODE_N * 2,
    shape=f"bf16[{DECODE_M},{DECODE_N}]{{1,0:T(8,128)(2,1)}}",
    hlo_text=(f"%fusion.{30 + i} = bf16[{DECODE_M},{DECODE_N}]{{1,0}} fusion(bf16[{DECODE_M},{DECODE_K}]{{1,0}} %x, "
              f"bf16[{DECODE_K},{DECODE_N}]{{1,0}} %w{i}), kind=kOutput, calls=%fused_computation.{30 + i}"))
    for i in range(7))
DECODE_BUSY = 7 * DECODE_MM_PS  # one execution, ops back to back
DECODE_GAP = round(DECODE_BUSY * 3 / 7)  # the wait for the next dispatch: 30 % of each period
DECODE_PERIOD = DECODE_BUSY + DECODE_GAP


def decode_schedule(chip: int, step: int) -> list[Placed]:
    return [Placed(op.name, i * DECODE_MM_PS, DECODE_MM_PS) for i, op in enumerate(DECODE_OPS)]


def decode_host(step: int) -> list[HostSpan]:
    """While the device waits, the Python thread runs the sampler and dispatches the next call."""
    return [HostSpan("main/1", "$generate.py:88 sample_next", DECODE_BUSY, DECODE_GAP // 2),
            HostSpan("main/1", "PjitFunction(decode_step)", DECODE_BUSY + DECODE_GAP // 2, DECODE_GAP // 2)]


def decode_v6e(**overrides) -> CaptureDesign:
    """No Steps line: each execution of `jit_decode_step` is a step, 10 of them, 30 % idle between."""
    return design(DECODE_OPS, decode_schedule, **{
        "module": "jit_decode_step", "steps_line": False, "n_steps": 10, "step_ps": DECODE_BUSY,
        "step_gap_ps": DECODE_GAP, "host_spans": decode_host, **overrides})


IDLE_WORK = OpDef("fusion.40", "loop fusion", bytes_accessed=1.0e9)
IDLE_STEP = 10_000 * US


def idle_training(idle_ps: int, host_span: str, **overrides) -> CaptureDesign:
    """Steps of 10 ms with `idle_ps` of device idle at the end of each, covered by a host span named
    `host_span` on the main thread (the last 90 % of the gap; the first 10 % shows nothing)."""
    busy = IDLE_STEP - idle_ps

    def schedule(chip: int, step: int) -> list[Placed]:
        return [Placed("fusion.40", 0, busy // 2), Placed("fusion.40", busy // 2, busy - busy // 2)]

    def host(step: int) -> list[HostSpan]:
        return [HostSpan("main/1", "PjitFunction(train_step)", 0, 50 * US),
                HostSpan("main/1", host_span, busy + idle_ps // 10, idle_ps - idle_ps // 10)]

    return design((IDLE_WORK,), schedule, **{"n_steps": 5, "step_ps": IDLE_STEP, "host_spans": host, **overrides})


# -- memory-bound ----------------------------------------------------------------------------------

def decode_near_roof(hbm_share: float = 0.65, **overrides) -> CaptureDesign:
    """Near miss: the decode matmuls at `hbm_share` of peak bandwidth (below the 70 % roof), no idle."""
    dur = round(DECODE_BYTES / (hbm_share * HBM) * 1e12)

    def schedule(chip: int, step: int) -> list[Placed]:
        return [Placed(op.name, i * dur, dur) for i, op in enumerate(DECODE_OPS)]

    return design(DECODE_OPS, schedule, **{"step_ps": 7 * dur, **overrides})


ELEMENTWISE = OpDef("fusion.50", "loop fusion", bytes_accessed=3 * 2 * 4096 * 8192.0,
                    shape="bf16[4096,8192]{1,0:T(8,128)(2,1)}")  # reads two bf16[4096,8192], writes one
ELEMENTWISE_PS = round(ELEMENTWISE.bytes_accessed / (0.9 * HBM) * 1e12)  # 90 % of HBM bandwidth


def elementwise_bound(**overrides) -> CaptureDesign:
    """A training step whose largest op is an unfused elementwise fusion at 90 % of HBM bandwidth."""
    def schedule(chip: int, step: int) -> list[Placed]:
        return [Placed("fusion.13", 0, ALIGNED_PS), Placed("fusion.50", ALIGNED_PS, ELEMENTWISE_PS)]

    return design((ALIGNED, ELEMENTWISE), schedule, **{"step_ps": ALIGNED_PS + ELEMENTWISE_PS, **overrides})


# -- Pallas / custom calls -------------------------------------------------------------------------

PALLAS_M = PALLAS_K = PALLAS_N = 4096
PALLAS_FLOPS = 2.0 * PALLAS_M * PALLAS_N * PALLAS_K
PALLAS_PS = round(PALLAS_FLOPS / (0.12 * PEAK) * 1e12)  # ~12 % of the bf16 peak: 1.25 ms


def pallas_matmul_op(dtype: str = "f32", cost_estimate: bool = False) -> OpDef:
    """A Pallas matmul as the trace shows it: a `custom-call` with no FLOPs or bytes on its metadata."""
    estimate = (f', "cost_estimate": {{"flops": {int(PALLAS_FLOPS)}, "transcendentals": 0, '
                f'"bytes_accessed": {3 * PALLAS_M * PALLAS_N * 4}}}' if cost_estimate else "")
    text = (f"%custom-call.1 = {dtype}[{PALLAS_M},{PALLAS_N}]{{1,0}} custom-call({dtype}[{PALLAS_M},{PALLAS_K}]{{1,0}} "
            f"%a, {dtype}[{PALLAS_K},{PALLAS_N}]{{1,0}} %b), custom_call_target=\"tpu_custom_call\", "
            f'backend_config={{"custom_call_config": {{"body": "TUxJUgA="{estimate}}}}}')
    return OpDef("custom-call.1", "custom-call", shape=f"{dtype}[{PALLAS_M},{PALLAS_N}]{{1,0:T(8,128)}}",
                 hlo_text=text)


def pallas_f32(cost_estimate: bool = False, **overrides) -> CaptureDesign:
    """The issue's second capture: the Pallas kernel is 100 % of each step, at ~12 % of the bf16 peak."""
    op = pallas_matmul_op(cost_estimate=cost_estimate)
    return design((op,), lambda chip, step: [Placed(op.name, 0, PALLAS_PS)],
                  **{"module": "jit_pallas_matmul", "step_ps": PALLAS_PS, **overrides})


# -- straggler-host --------------------------------------------------------------------------------

V5P_PEAK, V5P_HBM = 459e12, 2765e9
STRAGGLER_BASE = 893 * US  # fusion.62 on the fast hosts
STRAGGLER_RATIO = 3.8  # ... and 3.8x longer on the straggler
STRAGGLER_AR_FAST, STRAGGLER_AR_SLOW = 2607 * US, 2107 * US  # fast hosts wait 500 µs longer in the all-reduce
FAST_STEP = 5000 * US + 1500 * US + STRAGGLER_BASE + STRAGGLER_AR_FAST  # 10.0 ms
STRAGGLER_OPS = (
    matmul("fusion.60", 8192, 8192, 8192, 0.5)[0],
    OpDef("fusion.61", "loop fusion", bytes_accessed=2.0e9),
    matmul("fusion.62", 4096, 8192, 4096, 0.5)[0],
    OpDef("all-reduce.63", "all-reduce", bytes_accessed=1.0e8),
)
_JITTER = (50 * US, -50 * US, 0, 25 * US, -25 * US)  # per step, the same on every host (the steps stay in lockstep)


def straggler_hosts(slow_host: int = 2, slow_op_ps: int | None = None, slow_ar_ps: int = STRAGGLER_AR_SLOW,
                    n_hosts: int = 4, slow_idle_ps: int = 0) -> list[CaptureDesign]:
    """The issue's third capture: 4 v5p hosts x 4 chips, 5 steps of 10 ms; on `slow_host` fusion.62 takes
    3.8x longer (893 µs -> 3,393 µs) and it waits 500 µs less in the all-reduce: its steps take 12.0 ms."""
    slow_op_ps = round(STRAGGLER_BASE * STRAGGLER_RATIO) if slow_op_ps is None else slow_op_ps
    out = []
    for h in range(n_hosts):
        slow = h == slow_host
        op62 = slow_op_ps if slow else STRAGGLER_BASE
        ar = slow_ar_ps if slow else STRAGGLER_AR_FAST
        idle = slow_idle_ps if slow else 0  # device idle at the end of each of the slow host's steps

        def schedule(chip: int, step: int, op62=op62, ar=ar) -> list[Placed]:
            f60 = 5000 * US + _JITTER[(step - 1) % len(_JITTER)]
            return [Placed("fusion.60", 0, f60), Placed("fusion.61", f60, 1500 * US),
                    Placed("fusion.62", f60 + 1500 * US, op62), Placed("all-reduce.63", f60 + 1500 * US + op62, ar)]

        def length(chip: int, step: int, op62=op62, ar=ar, idle=idle) -> int:
            return 5000 * US + _JITTER[(step - 1) % len(_JITTER)] + 1500 * US + op62 + ar + idle

        out.append(design(STRAGGLER_OPS, schedule, hostname=f"host{h}", device_type="TPU v5p",
                          peak_tflops=V5P_PEAK / 1e12, peak_hbm_gbs=V5P_HBM / 1e9, n_chips=4, first_chip=4 * h,
                          n_steps=5, step_ps_for=length))
    return out


CORE_EXTRA = 500 * US  # fusion.62 on the slow core: 893 µs -> 1,393 µs (1.56x)


def straggler_cores(slow: tuple[int, int] | None = (0, 3), extra_ps: int = CORE_EXTRA, n_hosts: int = 1,
                    whole_host: int = -1, lockstep: bool = True) -> list[CaptureDesign]:
    """`n_hosts` v5p hosts x 4 chips in lockstep, 5 steps of 10 ms; on chip `slow` = (host, local chip)
    fusion.62 takes `extra_ps` longer and the all-reduce `extra_ps` shorter: the other cores wait
    for it there, so every core's step ends together (a synchronous program). `whole_host` >= 0
    slows every chip of that host the same way (a host's lag, not a core's). Without `lockstep` the
    slow chip's all-reduce keeps its length and its steps end `extra_ps` later."""
    out = []
    for h in range(n_hosts):
        def schedule(chip: int, step: int, h=h) -> list[Placed]:
            late = (h, chip) == slow or h == whole_host
            f60 = 5000 * US + _JITTER[(step - 1) % len(_JITTER)]
            op62 = STRAGGLER_BASE + (extra_ps if late else 0)
            return [Placed("fusion.60", 0, f60), Placed("fusion.61", f60, 1500 * US),
                    Placed("fusion.62", f60 + 1500 * US, op62),
                    Placed("all-reduce.63", f60 + 1500 * US + op62,
                           STRAGGLER_AR_FAST - (extra_ps if late and lockstep else 0))]

        def length(chip: int, step: int, h=h) -> int:
            late = ((h, chip) == slow or h == whole_host) and not lockstep
            return (5000 * US + _JITTER[(step - 1) % len(_JITTER)] + 1500 * US + STRAGGLER_BASE + STRAGGLER_AR_FAST
                    + (extra_ps if late else 0))

        out.append(design(STRAGGLER_OPS, schedule, hostname=f"host{h}", device_type="TPU v5p",
                          peak_tflops=V5P_PEAK / 1e12, peak_hbm_gbs=V5P_HBM / 1e9, n_chips=4, first_chip=4 * h,
                          n_steps=5, step_ps_for=length))
    return out


# -- host transfers ----------------------------------------------------------------------------------

OFFLOAD_DIMS = "128,1024,256"  # 32 Mi elements: 128 MiB in f32, 64 MiB in bf16
OFFLOAD_BYTES_F32 = 128 << 20


def host_offload(dtype: str = "f32", wait_ps: int = 5000 * US, compute_ps: int = 2000 * US) -> CaptureDesign:
    """1 v6e chip, 3 steps of 10 ms: each prefetches one array from host memory (`S(5)`) into HBM
    (`copy-start` at 0, `copy-done` waiting `wait_ps` after `compute_ps` of `fusion.1`) and
    offloads a quarter-size one back (`copy-start.1` right after, `copy-done.1` 1 µs at 9.9 ms).
    The prefetch window runs from 0 to `compute_ps + wait_ps`: 128 MiB over 7 ms is 19.2 GB/s with
    the defaults; the offload's 32 MiB over 2.9 ms is 11.6 GB/s."""
    hbm = f"{dtype}[{OFFLOAD_DIMS}]{{2,1,0:T(8,128)}}"
    host = f"{dtype}[{OFFLOAD_DIMS}]{{2,1,0:T(8,128)S(5)}}"
    small, small_host = (f"{dtype}[32,1024,256]{{2,1,0:T(8,128)}}", f"{dtype}[32,1024,256]{{2,1,0:T(8,128)S(5)}}")
    ctx = "u32[]{:S(2)}"
    ops = (OpDef("copy-start", "copy-start", shape=f"({hbm}, {host}, {ctx})",
                 hlo_text=f"%copy-start = ({hbm}, {host}, {ctx}) copy-start({host} %param)"),
           OpDef("copy-done", "copy-done", shape=hbm,
                 hlo_text=f"%copy-done = {hbm} copy-done(({hbm}, {host}, {ctx}) %copy-start)"),
           OpDef("fusion.1", "loop fusion", bytes_accessed=1e9, shape=hbm),
           OpDef("copy-start.1", "copy-start", shape=f"({small_host}, {small}, {ctx})"),
           OpDef("copy-done.1", "copy-done", shape=small_host),
           # an on-chip prefetch into VMEM (S(1)): an async copy, but not a host transfer
           OpDef("copy-start.2", "copy-start", shape=f"(f32[8,128]{{1,0:T(8,128)S(1)}}, f32[8,128]{{1,0:T(8,128)}}, {ctx})"),
           OpDef("copy-done.2", "copy-done", shape="f32[8,128]{1,0:T(8,128)S(1)}"))

    def schedule(chip: int, step: int) -> list[Placed]:
        t = compute_ps + wait_ps
        return [Placed("copy-start", 0, US), Placed("fusion.1", US, compute_ps - US),
                Placed("copy-done", compute_ps, wait_ps), Placed("copy-start.1", t, US),
                Placed("copy-start.2", t + US, US), Placed("copy-done.2", t + 2 * US, 100 * US),
                Placed("copy-done.1", 9900 * US, US)]

    return design(ops, schedule, n_chips=1)


def analyse_hosts(designs: list[CaptureDesign], root: Path) -> Analysis:
    run = root / "plugins" / "profile" / "run"
    for d in designs:
        write_capture(d, run)
    return analyze(load_capture(run, jobs=1))


# -- step-time-variance ----------------------------------------------------------------------------

TRAIN_STEP_OP = OpDef("fusion.70", "loop fusion", bytes_accessed=1.0e9)
CHECKPOINT_COPY = OpDef("copy.71", "copy", bytes_accessed=4.0e9)  # device-to-host copy of the weights
CHECKPOINT_COPY_PS, CHECKPOINT_IDLE_PS = 6000 * US, 2000 * US


def periodic_checkpoint(every: int = 5, copy_ps: int = CHECKPOINT_COPY_PS, idle_ps: int = CHECKPOINT_IDLE_PS,
                        **overrides) -> CaptureDesign:
    """20 steps of 10 ms; every `every`th step also copies the weights out (`copy_ps`) and idles
    `idle_ps` while the host writes them: 18 ms with the defaults."""
    def slow(step: int) -> bool:
        return every > 0 and step % every == 0

    def schedule(chip: int, step: int) -> list[Placed]:
        out = [Placed("fusion.70", 0, STEP)]
        if slow(step):
            out.append(Placed("copy.71", STEP, copy_ps))
        return out

    def length(chip: int, step: int) -> int:
        return STEP + (copy_ps + idle_ps if slow(step) else 0)

    return design((TRAIN_STEP_OP, CHECKPOINT_COPY), schedule,
                  **{"n_steps": 20, "step_ps_for": length, "n_chips": 1, **overrides})


# -- collectives inside a layer loop -------------------------------------------------------------

LOOP_OP = OpDef("while.7", "while", shape="(s32[], f32[8])")


def looped_collectives_schedule(chip: int, step: int) -> list[Placed]:
    """`exposed_collectives_schedule` inside a `while` op (a scanned layer loop) that spans it all:
    the same windows and known values, nested one level deeper."""
    inner = [Placed(p.op, p.offset_ps + 10 * US, p.dur_ps) for p in exposed_collectives_schedule(chip, step)]
    end = max(p.offset_ps + p.dur_ps for p in inner)
    return [Placed(LOOP_OP.name, 5 * US, end)] + inner  # from 5 µs to 5 µs past the last op


def looped_collectives(**overrides) -> CaptureDesign:
    return design(COLLECTIVE_OPS + (LOOP_OP,), looped_collectives_schedule, **overrides)


# -- step-time-variance: a first step that compiles --------------------------------------------

COMPILE_PS = 40_000 * US


def first_step_compiles(compile_ps: int = COMPILE_PS, **overrides) -> CaptureDesign:
    """10 steps of 10 ms of `fusion.70`; the first also waits `compile_ps` for the host, which spends
    it in `backend_compile` (jit's first call): 50 ms against 10 ms."""
    def schedule(chip: int, step: int) -> list[Placed]:
        return [Placed("fusion.70", compile_ps if step == 1 else 0, STEP)]

    def length(chip: int, step: int) -> int:
        return STEP + (compile_ps if step == 1 else 0)

    def host(step: int) -> list[HostSpan]:
        return [HostSpan("main/1", "backend_compile", 0, compile_ps)] if step == 1 else []

    return design((TRAIN_STEP_OP,), schedule, **{"n_steps": 10, "step_ps_for": length, "n_chips": 1,
                                                  "host_spans": host, **overrides})
