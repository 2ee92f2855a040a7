"""vmem-pressure (TPD110): Pallas kernels near or over the scoped VMEM limit, and VMEM OOM errors,
on dumps written in code (`tests/memory_dumps.py`, v5e: 16 MiB scoped limit, 128 MiB of VMEM)."""

from __future__ import annotations

from pathlib import Path

from tests.memory_dumps import write_adam_dump
from tests.rules.conftest import render_findings
from tpudiag import diagnose
from tpudiag.model.findings import Severity

MiB = 1 << 20
SCOPED_OOM = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem while "
              "allocating on stack for %_lambda_.1 = f32[4096,4096]{1,0:T(8,128)} custom-call(...). Scoped "
              "allocation with size 28.00M and limit 16.00M exceeded scoped vmem limit by 12.00M.")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps"


def _run(tmp_path, error=None, **kernels):
    dump = write_adam_dump(tmp_path / "k", layers=1, kernels=kernels)
    return diagnose(dump, select="vmem-pressure", error=error)


def test_kernels_near_and_over_the_scoped_limit(tmp_path, snapshot):
    d = _run(tmp_path, near=15 * MiB, raised=24 * MiB, roomy=14 * MiB)  # 93.8 %, over, 87.5 % (near miss)
    assert sorted(f.ops for f in d.findings) == [("near",), ("raised",)]  # not `roomy`
    near, raised = sorted(d.findings, key=lambda f: f.ops)
    # The engine names where each op comes from (`kernel.py:7`, its JAX op) after its name.
    assert raised.message.endswith("uses 24 MiB of scoped VMEM, 8 MiB over the 16 MiB scoped limit (default for v5e, "
                                   "measured): it compiled with a raised limit; the chip has 128 MiB of VMEM")
    assert "`near` (at `kernel.py:7`" in near.message
    assert "uses 15 MiB of scoped VMEM, 93.8% of the 16 MiB scoped limit" in near.message
    assert all(f.severity is Severity.LOW and not f.blocking for f in d.findings)
    snapshot("vmem-pressure", render_findings(d.findings))


def test_scoped_oom_error_is_high_and_first(tmp_path):
    # The error names `_lambda_.1`: it joins the program that has that op (and no other).
    unrelated = _run(tmp_path / "other", error=SCOPED_OOM).memory()
    assert unrelated.programs[0].error is None and unrelated.programs[0].vmem_limit_source != "compiler error"
    d = _run(tmp_path, error=SCOPED_OOM, **{"_lambda_.1": 12 * MiB})
    [f] = d.findings
    assert f.blocking and f.severity is Severity.HIGH and f.ops == ("_lambda_.1",)
    assert f.message == ("`_lambda_.1` (at `kernel.py:7`, `jit(step)/pallas_call`) needs 28 MiB of VMEM, 12 MiB "
                         "over the 16 MiB scoped VMEM limit; the chip has 128 MiB of VMEM")
    assert "vmem_limit_bytes" in f.fix
    [p] = d.memory().programs
    assert p.vmem_limit_source == "compiler error" and p.vmem_scoped_limit_bytes == 16 * MiB


def test_the_bundled_pallas_matmul_has_room():
    """The compile output's `compiled.hlo.txt` records 4.34 MiB for the kernel: well under 16 MiB."""
    d = diagnose(EXAMPLES / "pallas_matmul_v5e", select="vmem-pressure")
    assert d.findings == ()
    [p] = d.memory().programs
    [kernel] = [v for v in p.vmem_ops if v.kernel]
    assert kernel.scoped_bytes == 4_550_656 and kernel.source == "HLO backend_config"
    assert kernel.op_name.endswith("pallas_call")


REAL_V6E = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "tpu-v6e-hostoffload-inference" / "trace"


def test_an_xla_op_near_the_limit_is_not_a_finding():
    """The real v6e capture's `all-reduce` uses 31 MiB of the 32 MiB scoped limit: XLA tiled it to fit,
    so there is no lever for the user, and no finding (a Pallas kernel there would be one)."""
    d = diagnose(REAL_V6E, select="vmem-pressure")
    ops = [v for p in d.memory().programs for v in p.vmem_ops if v.op == "all-reduce"]
    assert ops and not ops[0].kernel
    limit = d.memory().programs[0].vmem_scoped_limit_bytes
    assert 0.9 * limit <= ops[0].scoped_bytes <= limit
    assert d.findings == ()
