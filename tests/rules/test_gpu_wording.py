"""Every rule that fires on a GPU capture speaks of GPUs: no TPU-only word (MXU, VMEM, ICI, a TPU
generation, a libtpu flag, `tpu-info`) in its message, fix, evidence or saving.

The captures are built in code (`tests/gpu_captures.py`), each made to fire one rule; the real
te-fused-attn capture (../shared) fires low-mxu-utilization and memory-bound.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tests import gpu_captures as gc
from tests.conftest import SHARED
from tpudiag.model.findings import Finding
from tpudiag.pipeline import diagnose

# Words that only mean something on a TPU. `tpudiag` itself is not one (`\b` keeps it out).
TPU_ONLY = re.compile(r"\b(?:TPUs?|MXUs?|VMEM|ICI|SparseCores?|TensorCores?|megacore|libtpu|LIBTPU_INIT_ARGS|"
                      r"v4|v5e|v5p|v6e|tpu-info)\b|xla_tpu_", re.IGNORECASE)


def finding_text(f: Finding) -> str:
    parts = [f.message, f.fix, f.saving.explanation]
    for e in f.evidence:
        parts.append(e.subject)
        parts.extend(f"{k}: {v}" for k, v in e.values)
    return "\n".join(parts)


def _fired(path: Path, rule: str) -> list[Finding]:
    found = [f for f in diagnose(path, jobs=1).findings if f.rule == rule]
    assert found, f"{rule} did not fire on the scenario made for it"
    return found


def _no_tpu_words(findings: list[Finding]) -> None:
    for f in findings:
        text = finding_text(f)
        assert not TPU_ONLY.findall(text), (f.rule, TPU_ONLY.findall(text), text)


def _steps(n: int, step_us: float = 1000.0) -> tuple[tuple[float, float], ...]:
    return tuple((i * step_us, step_us) for i in range(n))


def exposed_async(root: Path) -> Path:
    return gc.write(gc.training(), root)  # the all-reduce after the gemm: nothing beside it


def exposed_sync(root: Path) -> Path:  # XLA's synchronous all-reduce, on the compute stream
    kernels = []
    for i in range(4):
        kernels += [gc.gemm(i * 1000, 600), gc.Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", i * 1000 + 600, 200,
                                                      "all-reduce.2")]
    gpu = gc.Gpu(tuple(kernels), _steps(4))
    return gc.write(gc.GpuCapture((gpu, gpu), device=gc.MI300X), root)


def exposed_library(root: Path) -> Path:  # NCCL kernels no HLO op launched (TensorFlow's)
    c = gc.training()
    gpus = tuple(dataclasses.replace(g, kernels=tuple(dataclasses.replace(k, hlo_op="") if k.stream == gc.NCCL else k
                                                      for k in g.kernels)) for g in c.gpus)
    return gc.write(dataclasses.replace(c, gpus=gpus), root)


def idle(root: Path) -> Path:
    return gc.write(gc.training(ar_at_us=100), root)  # 400 µs of each 1 ms step with no kernel


def straggler_core(root: Path) -> Path:
    return gc.write(gc.training(n_gpus=4, ar_at_us=100, slow_gpu=1, slow_extra_us=100), root)


def straggler_core_extra_work(root: Path) -> Path:  # GPU 0 alone runs a runtime copy kernel each step
    c = gc.training(n_gpus=4, ar_at_us=100)
    first = c.gpus[0]
    copies = tuple(gc.Kernel("__amd_rocclr_copyBuffer.kd", s + 700, 100) for s, _ in first.steps)
    return gc.write(dataclasses.replace(c, gpus=(dataclasses.replace(first, kernels=first.kernels + copies),
                                                 *c.gpus[1:])), root)


def variance(root: Path) -> Path:
    return gc.write(gc.training(n_steps=8, ar_at_us=100, step_extra_us=(0, 0, 900)), root)


def straggler_host(root: Path) -> Path:
    for i, host in enumerate(("hostA", "hostB", "hostC")):
        slow = 200 if host == "hostC" else 0
        c = gc.training(n_steps=6, ar_at_us=100, gemm_us=600 + slow, step_us=1000 + slow)
        gc.write(dataclasses.replace(c, host=host), root)
    return root


SCENARIOS = {
    "exposed-collective": [exposed_async, exposed_sync, exposed_library],
    "device-idle": [idle],
    "straggler-core": [straggler_core, straggler_core_extra_work],
    "step-time-variance": [variance],
    "straggler-host": [straggler_host],
}


@pytest.mark.parametrize("rule, scenario", [(r, s) for r, ss in SCENARIOS.items() for s in ss],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_rule_speaks_of_gpus(rule, scenario, tmp_path):
    _no_tpu_words(_fired(scenario(tmp_path), rule))


@pytest.mark.parametrize("rule", ["low-mxu-utilization", "memory-bound", "device-idle"])
def test_rules_on_the_real_te_fused_attn_capture_speak_of_gpus(rule):
    path = SHARED / "data" / "real-captures" / "jax-gpu-te-fused-attn"
    if not path.exists():
        pytest.skip(f"the real GPU captures are in ../shared, absent here ({path})")
    _no_tpu_words(_fired(path, rule))


def test_the_word_list_catches_tpu_wording():
    # The check itself can fail: today's TPU texts trip it, `tpudiag` and `GPU` do not.
    assert TPU_ONLY.search("compile with `--xla_tpu_enable_async_collective_fusion=true`")
    assert TPU_ONLY.search("stay synchronous at entry level even on v5e")
    assert TPU_ONLY.search("check its clocks (`tpu-info`)") and TPU_ONLY.search("below the MXU width")
    assert not TPU_ONLY.search("run `tpudiag whatif` on GPU:3 with NCCL")
