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


# -- the findings from hand-made program memory: each wording and edge, worked by hand --------------

def _program(*ops, limit: int | None = 16 * MiB, capacity: int | None = 128 * MiB, error=None):
    from tpudiag.model.memory import ProgramMemory

    return ProgramMemory("jit_step", "d/jit_step.txt", "v5e", None, None, "", (), False, error=error,
                         vmem_ops=tuple(ops), vmem_scoped_limit_bytes=limit,
                         vmem_limit_source="default for v5e, measured" if limit else "",
                         vmem_capacity_bytes=capacity)


def _use(op: str, mib: float, kernel: bool = True, op_name: str = ""):
    from tpudiag.model.memory import VmemUse

    return VmemUse(op, int(mib * MiB), "HLO backend_config", op_name, kernel)


def _check(*programs, errors=(), chip=None, **options):
    from tpudiag.model.inputs import CompiledInputs
    from tpudiag.rules.base import RuleContext
    from tpudiag.rules.vmem_pressure import Options, check

    ctx = RuleContext(analysis=None, compiled=CompiledInputs(oom_errors=tuple(errors)), memory=tuple(programs),
                      chip=chip)
    return check(ctx, Options(**options))


def test_an_xla_op_over_the_limit_is_named_an_op():
    # XLA's own op is judged only over the limit (XLA tiles it to fit); a kernel from 90 % of it.
    [f] = _check(_program(_use("fusion.3", 20, kernel=False), _use("fusion.4", 15.9, kernel=False)))
    assert f.message == ("op `fusion.3` uses 20 MiB of scoped VMEM, 4 MiB over the 16 MiB scoped limit (default for "
                         "v5e, measured): it compiled with a raised limit; the chip has 128 MiB of VMEM")
    assert f.fix == "keep `vmem_limit_bytes` within the chip's VMEM, or use smaller blocks to leave XLA room around it"
    assert (f.severity, f.blocking, f.ops, f.saving.bytes, f.saving.ps) == (Severity.LOW, False, ("fusion.3",),
                                                                           4 * MiB, 0)
    assert f.saving.explanation == "VMEM headroom is not time; the bytes over the default limit"
    assert (f.rule, f.code, f.saving.basis) == ("vmem-pressure", "TPD110", "modelled")
    # No JAX op name recorded: no `op` row.
    assert f.evidence[0].values == (("scoped VMEM", "20 MiB"), ("limit", "16 MiB"), ("chip VMEM", "128 MiB"),
                                    ("from", "HLO backend_config"))


def test_a_kernel_exactly_at_the_limit_uses_all_of_it_and_frees_nothing():
    [f] = _check(_program(_use("kernel.1", 16, op_name="jit(step)/pallas_call"), capacity=None))
    # Unknown chip VMEM: the message says nothing of it and the evidence shows a dash.
    assert f.message == ("Pallas kernel `kernel.1` uses 16 MiB of scoped VMEM, 100.0% of the 16 MiB scoped limit "
                         "(default for v5e, measured)")
    assert f.fix == ("a larger block will not compile: raise pltpu.CompilerParams(vmem_limit_bytes=...) before "
                     "growing it")
    assert f.saving.bytes == 0
    assert f.evidence[0].subject == "kernel.1"
    assert f.evidence[0].values == (("scoped VMEM", "16 MiB"), ("limit", "16 MiB"), ("chip VMEM", "-"),
                                    ("from", "HLO backend_config"), ("op", "jit(step)/pallas_call"))
    # One byte over is over: the raised-limit wording, and that byte to free.
    from tpudiag.model.memory import VmemUse

    [f] = _check(_program(VmemUse("kernel.1", 16 * MiB + 1, "HLO backend_config", "", True)))
    assert "uses 16 MiB of scoped VMEM, 1 B over the 16 MiB scoped limit" in f.message and f.saving.bytes == 1


def test_the_kernel_threshold_is_inclusive_and_a_program_without_a_limit_is_not_judged():
    # At a fraction exact in binary (15/16 of 16 MiB is 15 MiB), the edge itself counts, a byte under does not.
    assert [f.ops for f in _check(_program(_use("k", 15)), near_fraction=15 / 16)] == [("k",)]
    assert _check(_program(_use("k", 15 - 1 / MiB)), near_fraction=15 / 16) == []
    assert _check(_program(_use("k", 40), limit=None)) == []


def test_the_largest_ops_first_ties_by_name_at_most_max_findings():
    program = _program(_use("b", 17), _use("a", 17), _use("c", 30), _use("d", 18))
    assert [f.ops for f in _check(program, max_findings=3)] == [("c",), ("d",), ("a",)]


def test_errors_come_first_once_each_scoped_or_physical():
    from tpudiag.model.hardware import chip_for
    from tpudiag.model.memory import OomError

    scoped = OomError("vmem", "scoped", 28 * MiB, 16 * MiB, "scoped oom", hlo="_lambda_.1", exceeded_by_bytes=12 * MiB)
    physical = OomError("vmem", "capacity", 140 * MiB, 128 * MiB, "vmem oom")
    hbm = OomError("hbm", "hbm-temporaries", 17 << 30, 16 << 30, "hbm oom")
    chip = chip_for("TPU v5 lite")
    findings = _check(_program(_use("k", 20), error=scoped), errors=(scoped, physical, hbm), chip=chip)
    assert [f.message for f in findings[:2]] == [
        f"`_lambda_.1` needs 28 MiB of VMEM, 12 MiB over the 16 MiB scoped VMEM limit; the chip has "
        f"{chip.vmem_bytes // MiB} MiB of VMEM",
        f"needs 140 MiB of VMEM, 12 MiB over the 128 MiB VMEM; the chip has {chip.vmem_bytes // MiB} MiB of VMEM"]
    assert findings[0].fix == ("raise the limit (pltpu.CompilerParams(vmem_limit_bytes=...), up to the chip's VMEM) "
                               "or use smaller blocks")
    assert findings[1].fix == "use smaller blocks or fewer buffering levels: the kernel exceeds the chip's VMEM"
    assert [(f.severity, f.blocking, f.ops) for f in findings[:2]] == [(Severity.HIGH, True, ("_lambda_.1",)),
                                                                      (Severity.HIGH, True, ())]
    assert [f.saving.bytes for f in findings[:2]] == [12 * MiB, 12 * MiB]
    assert {(f.rule, f.code, f.saving.ps, f.saving.explanation) for f in findings[:2]} == {
        ("vmem-pressure", "TPD110", 0, "the bytes over the limit")}
    assert [(e.subject, e.values) for e in findings[0].evidence] == [("compiler error", (("message", "scoped oom"),))]
    assert [f.ops for f in findings[2:]] == [("k",)]  # the joined error is not told twice
    # Without a chip the error does not guess its VMEM; an error joined only to a program is still told.
    [alone, op] = _check(_program(_use("k", 20), error=scoped))
    assert alone.message.endswith("over the 16 MiB scoped VMEM limit") and op.ops == ("k",)


def test_an_xla_op_exactly_at_the_limit_is_not_over_it():
    # XLA sized the op to the limit: at it is within it, and only a kernel is judged from 90 %.
    assert _check(_program(_use("fusion.3", 16, kernel=False))) == []
    assert [f.ops for f in _check(_program(_use("kernel.1", 16)))] == [("kernel.1",)]
