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
