"""hbm-pressure (TPD109): near capacity, over it, and the levers, on dumps written in code
(`tests/memory_dumps.py`, the issue's Adam step on v5e: 16 GiB, 15.75 GiB usable)."""

from __future__ import annotations

import pytest

from tests.memory_dumps import ACT_BYTES, STATE_BYTES, W_BYTES, write_adam_dump
from tests.rules.conftest import render_findings
from tpudiag import diagnose
from tpudiag.model.findings import Severity
from tpudiag.analysis.device_memory import first_lever

OOM_TEXT = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
            "for HLO temporaries (17.00G) exceeds available HBM (15.75G).")


def _run(tmp_path, name, error=None, **kw):
    return diagnose(write_adam_dump(tmp_path / name, **kw), select="hbm-pressure", error=error)


def test_near_capacity_names_the_peak_and_puts_donation_first(tmp_path, snapshot):
    d = _run(tmp_path, "near", layers=10, live_activations=2)  # 14.23 GB: 84 % of 15.75 GiB
    [f] = d.findings
    assert f.code == "TPD109" and f.severity is Severity.MEDIUM and not f.blocking
    assert "peaks at 13.2 GiB of HBM, 84.1% of 15.8 GiB usable" in f.message
    assert "first: donate m, params, v" in f.message
    assert f.fix == "jax.jit(step, donate_argnums=(0, 1, 2))"
    assert f.saving.ps == 0 and f.saving.bytes == 10 * (W_BYTES + 2 * STATE_BYTES)  # every update reuses its argument
    snapshot("hbm-pressure", render_findings(d.findings))


def test_oom_dump_does_not_fit_by_how_much_and_ranks_first(tmp_path):
    d = _run(tmp_path, "oom", layers=13, live_activations=2, oom=True)
    [f] = d.findings
    assert f.severity is Severity.HIGH and f.blocking
    peak = 13 * (2 * W_BYTES + 4 * STATE_BYTES) + 3 * ACT_BYTES
    assert d.memory().programs[0].hbm_peak_bytes == peak == 18_253_611_008
    assert "does not fit: it needs 17 GiB of HBM, 1.25 GiB over 15.8 GiB usable" in f.message


def test_the_error_message_gives_the_usable_hbm(tmp_path):
    d = _run(tmp_path, "oom", error=OOM_TEXT, layers=13, live_activations=2)  # no OOM marker: the error says it
    [f] = d.findings
    assert f.blocking and "usable (compiler error)" in f.message
    assert f.evidence[0].values == (("message", OOM_TEXT),)


def test_fits_and_near_miss_give_no_finding(tmp_path):
    assert _run(tmp_path, "fits", layers=4).findings == ()
    near_miss = _run(tmp_path, "miss", layers=9, live_activations=4)  # 13.42 GB: 79.4 %, under 80 %
    assert near_miss.findings == ()
    assert near_miss.memory().programs[0].hbm_peak_bytes == pytest.approx(0.794 * 16128 * 2**20, rel=1e-3)


def test_threshold_is_an_option(tmp_path):
    dump = write_adam_dump(tmp_path / "miss", layers=9, live_activations=4)
    from tpudiag.rules import RulesConfig

    config = RulesConfig(select=("hbm-pressure",), options={"hbm-pressure": {"near_fraction": 0.75}})
    assert [f.severity for f in diagnose(dump, config=config).findings] == [Severity.MEDIUM]


def test_donation_removes_the_donation_lever_and_lowers_the_peak(tmp_path):
    plain = _run(tmp_path, "plain", layers=10).memory().programs[0]
    donated = _run(tmp_path, "donated", layers=10, donate=True).memory().programs[0]
    assert "donation" in {lv.key for lv in plain.levers}
    assert "donation" not in {lv.key for lv in donated.levers}
    assert donated.hbm_peak_bytes < plain.hbm_peak_bytes
    assert donated.hbm.alias_bytes == 10 * (W_BYTES + 2 * STATE_BYTES) and donated.hbm.output_bytes == 0


def test_remat_lever_counts_forward_activations_live_at_the_peak(tmp_path):
    from tpudiag.rules import RulesConfig

    config = RulesConfig(select=("hbm-pressure",), options={"hbm-pressure": {"near_fraction": 0.3}})
    dump = write_adam_dump(tmp_path / "remat", layers=6, live_activations=3)  # 47 % of usable: levers from 30 %
    program = diagnose(dump, config=config).memory().programs[0]
    remat = next(lv for lv in program.levers if lv.key == "remat")
    assert remat.saving_bytes == 3 * ACT_BYTES  # only the 3 activations live together, not all 6
    assert all(b.startswith("act.") for b in remat.buffers)


def test_first_lever_is_the_cheapest_that_is_enough():
    from tpudiag.model.memory import MemoryLever

    levers = (MemoryLever("fsdp", "", 10, "", ""), MemoryLever("donation", "", 6, "", ""),
              MemoryLever("remat", "", 2, "", ""))
    assert first_lever(levers, 5).key == "donation"
    assert first_lever(levers, 8).key == "fsdp"
    assert first_lever(levers, 20) is None  # none is enough alone: no "cheapest that is enough"
    assert first_lever((), 1) is None


def _near(fraction):
    from tpudiag.rules import RulesConfig

    return RulesConfig(select=("hbm-pressure",), options={"hbm-pressure": {"near_fraction": fraction}})


def test_levers_only_when_needed_and_each_says_its_precondition(tmp_path):
    fits = _run(tmp_path, "fits", layers=4).memory().programs[0]  # 5.7 GiB: 37 % of usable
    assert fits.levers == () and fits.first == "" and fits.headroom_bytes == 15.75 * 2**30 - fits.hbm_peak_bytes
    near = _run(tmp_path, "near", layers=10, live_activations=2).memory().programs[0]
    assert near.workload == "training" and "optimiser state (m, v)" in near.workload_evidence
    assert {lv.key for lv in near.levers} >= {"donation", "remat", "microbatch", "dtype", "host-offload"}
    assert all(lv.precondition for lv in near.levers)
    assert "fsdp" not in {lv.key for lv in near.levers}  # one device: no mesh to shard over


def test_fsdp_follows_the_sharding_and_the_mesh(tmp_path):
    # Replicated on a 4-device mesh: FSDP frees 3/4 of each parameter and state array.
    replicated = diagnose(write_adam_dump(tmp_path / "rep", layers=10, live_activations=2, mesh=4,
                                          sharding="{replicated}"), config=_near(0.8)).memory().programs[0]
    fsdp = next(lv for lv in replicated.levers if lv.key == "fsdp")
    assert fsdp.saving_bytes == 10 * (W_BYTES + 2 * STATE_BYTES) * 3 // 4
    assert "sharded 1 ways on a 4-device mesh" in fsdp.precondition
    # Already split 4 ways on 4 devices: nothing left to shard.
    sharded = diagnose(write_adam_dump(tmp_path / "sh", layers=10, live_activations=2, mesh=4,
                                       sharding="{devices=[4,1]<=[4]}"), config=_near(0.8)).memory().programs[0]
    assert "fsdp" not in {lv.key for lv in sharded.levers} and sharded.levers


def test_fsdp_is_absent_on_the_bundled_example_whose_parameters_are_sharded_4_ways():
    [p] = diagnose(select="hbm-pressure", config=_near(1e-4)).memory().programs  # forced: levers from 0.01 %
    assert p.needs_levers and p.mesh_devices == 4 and p.workload == "training"
    assert "fsdp" not in {lv.key for lv in p.levers}


def test_inference_near_capacity_gets_no_training_lever(tmp_path):
    p = _run(tmp_path, "inf", layers=10, live_activations=2, inference=True).memory().programs[0]
    assert p.workload == "inference" and p.needs_levers
    assert not {lv.key for lv in p.levers} & {"remat", "microbatch", "dtype", "host-offload", "fsdp"}
    assert {lv.key for lv in p.levers} == {"donation"}  # outputs with an argument's shape, not donated


def test_the_real_v6e_inference_capture_gets_no_training_advice():
    from tests.conftest import REPO

    trace = REPO.parent / "shared" / "data" / "real-captures" / "tpu-v6e-hostoffload-inference" / "trace"
    if not trace.exists():
        pytest.skip("the shared real captures are not beside the repository")
    # `jit_f` peaks at 62.5 % of 32 GiB (checked with `tpudiag memory`); levers forced from 50 %.
    memory = diagnose(trace, config=_near(0.5)).memory()
    jit_f = next(p for p in memory.programs if p.module == "jit_f")
    assert jit_f.workload == "inference" and jit_f.needs_levers
    assert not {lv.key for lv in jit_f.levers} & {"remat", "microbatch", "dtype", "host-offload", "fsdp"}
    assert memory.programs[0].hbm_peak_bytes >= memory.programs[-1].hbm_peak_bytes  # largest first


def test_an_error_text_joins_only_the_program_it_names_or_matches(tmp_path):
    from tpudiag.analysis.device_memory import joined_program
    from tpudiag.model.memory import OomError

    dump = write_adam_dump(tmp_path / "oom", layers=13, live_activations=2)
    program = diagnose(dump, select="hbm-pressure").compiled.hlo[0].program
    by_size = OomError("hbm", "hbm-temporaries", 17 * 2**30, int(15.75 * 2**30), "m")
    assert joined_program(by_size, [program]) is program  # 17.00 GiB vs 16.9998 GiB
    assert joined_program(OomError("hbm", "hbm-temporaries", 20 * 2**30, 16 * 2**30, "m"), [program]) is None
    named_other = OomError("hbm", "hbm-capacity", 17 * 2**30, 16 * 2**30, "m", programs=("jit_other",))
    assert joined_program(named_other, [program]) is None  # its size matches, but it names another program


# -- the finding from hand-made program memory: every branch of its text, worked by hand ----------

GIB = 2**30


def _memory(peak_gib: float, *, usable_gib: float | None = 16, levers=(), first: str = "", error=None,
            oom: bool = False, groups=None, capacity_gib: float | None = None, source: str = "compiler error"):
    from tpudiag.model.memory import MemoryBuffer, MemoryGroup, ProgramMemory, SpaceMemory

    live = tuple(MemoryBuffer(f"b.{i}", f"fusion.{i}", "temporary", GIB, GIB, "f32[1]", "", "", 0) for i in range(4))
    if groups is None:
        groups = (MemoryGroup("params", "argument", 3, 6 * GIB, "train.py:3"),
                  MemoryGroup("jit(step)/add", "temporary", 2, 2 * GIB, "train.py:9"),
                  MemoryGroup("jit(step)/dot_general", "output", 1, GIB, ""))
    hbm = SpaceMemory("hbm", 0, int(peak_gib * GIB), 8 * GIB, 2 * GIB, 4 * GIB, 0, GIB, None, live, None,
                      groups=groups)
    return ProgramMemory("jit_step", "d/jit_step.txt", "v5e",
                         int(capacity_gib * GIB) if capacity_gib else None,
                         int(usable_gib * GIB) if usable_gib else None, source if usable_gib else "", (hbm,),
                         oom, error=error, levers=tuple(levers), first=first)


def _lever(key: str, gib: float):
    from tpudiag.model.memory import MemoryLever

    return MemoryLever(key, f"{key} it", int(gib * GIB), f"{key} frees {gib} GiB", f"do {key}")


def _check(*programs, errors=(), **options):
    from tpudiag.model.inputs import CompiledInputs
    from tpudiag.rules.base import RuleContext
    from tpudiag.rules.hbm_pressure import Options, check

    ctx = RuleContext(analysis=None, compiled=CompiledInputs(oom_errors=tuple(errors)), memory=tuple(programs))
    return check(ctx, Options(**options))


SPLIT = "(arguments 8 GiB, outputs 2 GiB, temporaries 4 GiB, aliased 1 GiB)"


def test_near_capacity_finding_from_the_programs_memory():
    # 14 of 16 GiB usable: 87.5 %, over the 80 % default. Donation alone is enough: it comes first.
    [f] = _check(_memory(14, levers=(_lever("donation", 3), _lever("remat", 1)), first="donation"))
    assert f.message == ("`jit_step` peaks at 14 GiB of HBM, 87.5% of 16 GiB usable (compiler error) "
                         f"{SPLIT}; largest: argument `params` 6 GiB; first: donation it")
    assert (f.code, f.severity, f.blocking) == ("TPD109", Severity.MEDIUM, False)
    assert (f.saving.ps, f.saving.basis, f.saving.bytes) == (0, "modelled", 3 * GIB)
    assert f.saving.explanation == "donation: donation frees 3 GiB; levers overlap, never add them"
    assert f.fix == "do donation"
    assert [(e.subject, e.values) for e in f.evidence] == [
        ("argument `params`", (("size", "6 GiB"), ("buffers", "3"), ("source", "train.py:3"))),
        ("temporaries of `jit(step)/add`", (("size", "2 GiB"), ("buffers", "2"), ("source", "train.py:9"))),
        ("output of `jit(step)/dot_general`", (("size", "1 GiB"), ("buffers", "1"), ("source", "-"))),
        ("lever: donation", (("frees up to", "3 GiB"), ("do", "do donation"))),
        ("lever: remat", (("frees up to", "1 GiB"), ("do", "do remat")))]
    assert f.ops == ("fusion.0", "fusion.1", "fusion.2", "fusion.3")


def test_max_buffers_caps_the_groups_and_ops_but_not_the_levers():
    [f] = _check(_memory(14, levers=(_lever("donation", 3),), first="donation"), max_buffers=2)
    assert [e.subject for e in f.evidence] == ["argument `params`", "temporaries of `jit(step)/add`",
                                              "lever: donation"]
    assert f.ops == ("fusion.0", "fusion.1")


def test_group_names_read_as_english():
    from tpudiag.model.memory import MemoryGroup
    from tpudiag.rules.hbm_pressure import _group_text

    # Regression: several temporaries were "temporarys of ...".
    assert _group_text(MemoryGroup("jit(step)/add", "temporary", 2, GIB)) == "temporaries of `jit(step)/add`"
    assert _group_text(MemoryGroup("jit(step)/add", "temporary", 1, GIB)) == "temporary of `jit(step)/add`"
    assert _group_text(MemoryGroup("jit(step)/mul", "output", 3, GIB)) == "outputs of `jit(step)/mul`"
    assert _group_text(MemoryGroup("c", "constant", 2, GIB)) == "constants of `c`"
    assert _group_text(MemoryGroup("params", "argument", 5, GIB)) == "argument `params`"


def test_the_threshold_is_inclusive_and_a_program_without_a_limit_is_not_judged():
    # 12 GiB is exactly 75 % of 16 GiB (a fraction exact in binary): reported at 0.75, not at the default 80 %.
    assert len(_check(_memory(12), near_fraction=0.75)) == 1
    assert _check(_memory(12)) == []
    assert _check(_memory(12 - 2**-30), near_fraction=0.75) == []  # one byte under
    # No usable HBM and no capacity known: nothing to compare with, unless it ran out.
    assert _check(_memory(14, usable_gib=None)) == []


def test_without_a_lever_enough_alone_the_largest_is_offered():
    [f] = _check(_memory(14, levers=(_lever("remat", 1), _lever("fsdp", 2.5))))
    assert f.saving.bytes == int(2.5 * GIB) and f.fix == "do fsdp"
    assert f.saving.explanation == ("no single lever is enough; the largest, fsdp: fsdp frees 2.5 GiB; "
                                    "levers overlap, never add them")
    assert "; first:" not in f.message


def test_without_any_lever_the_fix_is_to_lower_the_peak():
    [f] = _check(_memory(14))
    assert f.saving.bytes == 0 and f.saving.explanation == "no lever's precondition holds in the buffers at the peak"
    assert f.fix == "lower the peak: shrink the batch or the model, or use more devices"
    assert f.message.endswith("; largest: argument `params` 6 GiB")
    [f] = _check(_memory(14, groups=()))
    assert f.message.endswith(SPLIT) and f.evidence == ()


def test_over_the_limit_says_by_how_much_and_blocks():
    [f] = _check(_memory(18, capacity_gib=16, usable_gib=None))  # the public capacity only
    assert f.message.startswith(f"`jit_step` does not fit: it needs 18 GiB of HBM, 2 GiB over 16 GiB of HBM {SPLIT}")
    assert (f.severity, f.blocking) == (Severity.HIGH, True)
    # Ran out (the compiler's OOM dump) with no HBM size known at all.
    [f] = _check(_memory(18, usable_gib=None, oom=True))
    assert f.message.startswith(f"`jit_step` does not fit: it ran out of HBM at 18 GiB {SPLIT}")


def test_a_joined_hbm_error_leads_the_evidence_and_a_vmem_one_does_not():
    from tpudiag.model.memory import OomError

    hbm = OomError("hbm", "hbm-temporaries", 18 * GIB, 16 * GIB, "Ran out of memory in memory space hbm")
    [f] = _check(_memory(14, error=hbm))  # the error's 18 GiB is the peak: over the limit
    assert f.evidence[0].subject == "compiler error"
    assert f.evidence[0].values == (("message", "Ran out of memory in memory space hbm"),)
    assert f.blocking and "needs 18 GiB of HBM, 2 GiB over 16 GiB usable" in f.message
    vmem = OomError("vmem", "scoped", 20 * 2**20, 16 * 2**20, "Ran out of memory in memory space vmem")
    [f] = _check(_memory(14, error=vmem))
    assert f.evidence[0].subject == "argument `params`" and not f.blocking


def test_an_error_joined_to_no_program_is_reported_alone_once():
    from tpudiag.model.memory import OomError

    joined = OomError("hbm", "hbm-temporaries", 18 * GIB, 16 * GIB, "joined")
    alone = OomError("hbm", "hbm-temporaries", 17 * GIB, int(15.75 * GIB), "alone", form="hbm-temporaries")
    vmem = OomError("vmem", "scoped", 20 * 2**20, 16 * 2**20, "vmem")
    findings = _check(_memory(14, error=joined), errors=(joined, alone, vmem))
    assert [f.message.split(":")[0] for f in findings] == ["`jit_step` does not fit", "the program does not fit"]
    f = findings[1]
    assert f.message == "the program does not fit: it needs 17 GiB of HBM, 1.25 GiB over the 15.8 GiB available"
    assert (f.severity, f.blocking, f.ops) == (Severity.HIGH, True, ())
    # No allocation list and no dump: no lever to model, and the way to get one.
    assert f.saving.bytes == 0 and f.saving.explanation == (
        "no buffer assignment to model levers from: dump with XLA_FLAGS=--xla_dump_to=DIR and pass DIR")
    assert f.fix == "rerun the compile with XLA_FLAGS=--xla_dump_to=DIR and run `tpudiag report DIR --error FILE`"
    assert f.evidence[0].subject == "compiler error" and f.evidence[0].values[0] == ("message", "alone")


def test_an_error_alone_names_its_largest_allocation_and_the_levers_its_list_supports():
    from tpudiag.analysis.device_memory import oom_analysis
    from tpudiag.model.findings import Evidence
    from tpudiag.model.memory import OomAllocation, OomError
    from tpudiag.model.units import fmt_bytes

    # The largest allocation is padded 8x (f32[1000,18] laid out in 128-wide tiles): the padding lever
    # covers the 1.25 GiB overrun alone, so it is the first.
    padded = OomAllocation(1, 2 * GIB, "f32[1000,18]{1,0:T(8,128)}", unpadded_bytes=GIB // 4,
                           padding_bytes=2 * GIB - GIB // 4, expansion=8.0, op_name="jit(step)/mul",
                           allocation_type="HLO temp", instruction="fusion.1")
    plain = OomAllocation(2, GIB, "bf16[4096,4096]{1,0}", op_name="jit(step)/dot_general", allocation_type="HLO temp",
                          instruction="fusion.2")
    error = OomError("hbm", "hbm-temporaries", 17 * GIB, int(15.75 * GIB), "the message", form="hbm-temporaries",
                     allocations=(padded, plain))
    [f] = _check(errors=(error,))
    first = oom_analysis(error).first_lever
    assert first.key == "padding"
    assert f.message == ("the program does not fit: it needs 17 GiB of HBM, 1.25 GiB over the 15.8 GiB available; "
                         f"largest allocation: 2 GiB `f32[1000,18]`, padded 8.0x; first: {first.title}")
    assert (f.rule, f.code, f.saving.ps, f.saving.basis) == ("hbm-pressure", "TPD109", 0, "modelled")
    assert f.saving.bytes == first.saving_bytes and f.fix == first.fix
    assert f.saving.explanation == f"padding: {first.explanation}"
    assert f.evidence[0] == Evidence("compiler error", (("message", "the message"), ("form", error.form_text)))
    assert f.evidence[1:] == tuple(Evidence(f"lever: {lv.key}", (("frees up to", fmt_bytes(lv.saving_bytes)),
                                                                 ("do", lv.fix), ("because", lv.precondition)))
                                   for lv in oom_analysis(error).levers)
    assert [e.subject for e in f.evidence[1:]] == ["lever: padding", "lever: temporaries"]
    # Only the unpadded allocation: no lever is enough alone (1 GiB of 1.25), the first one listed is offered.
    alone = OomError("hbm", "hbm-temporaries", 17 * GIB, int(15.75 * GIB), "m", allocations=(plain,))
    [f] = _check(errors=(alone,))
    [lever] = oom_analysis(alone).levers
    assert f.message == ("the program does not fit: it needs 17 GiB of HBM, 1.25 GiB over the 15.8 GiB available; "
                         f"largest allocation: 1 GiB `bf16[4096,4096]`; first: {lever.title}")
    assert f.saving.bytes == GIB and f.fix == lever.fix
