"""LLO dump parsing on real deviceless compiles (`tests/fixtures/llo/make_fixtures.py` says what
each fixture is). Every number is checked against the dump text itself, read here independently
with the simplest grep that works, and against the other dump files that report the same fact.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from tpudiag.model import llo
from tpudiag.parsers.llo import load_llo_dump

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llo"
ALL = ("v5e_mlp", "v5e_pallas_r512", "v5e_pallas_r64", "v5e_collective", "v6e_mlp",
       "v6e_collective", "v6e_mlp_misc", "v5e_fsdp_train")

# Independent spill greps (reference §7.1).
VST_SPILL = re.compile(r"= vst[^\[]*\[vmem:\[#allocation\d+_spill")
VLD_FILL = re.compile(r"= vld[^\[]*\[vmem:\[#allocation\d+_spill")


def _dump(name: str):
    return load_llo_dump(FIXTURES / name)


def _file(name: str, program: str, label: str) -> str:
    pattern = re.compile(rf"\d+-{re.escape(program)}-\d+-{re.escape(label)}\.txt")
    [path] = [p for p in (FIXTURES / name).iterdir() if pattern.fullmatch(p.name)]
    return path.read_text()


def _op(dump, name: str) -> pd.Series:
    rows = dump.ops[dump.ops["name"] == name]
    assert len(rows) == 1, f"{name} not exactly once in the ops table: {list(dump.ops['name'])}"
    return rows.iloc[0]


def _profile_counter(name: str, hlo: str, unit: str) -> int:
    """The counter's numerator, grepped from the TLP bundle profile's block for `hlo`."""
    text = _file(name, "TLP", "hlo-static-bundle-profile")
    block = re.search(rf"^HLO: %{re.escape(hlo)} = .*?(?=^HLO: |\Z)", text, re.M | re.S).group(0)
    return int(re.search(rf"^ - {unit}: \((\d+)/", block, re.M).group(1))


def _static_cycles(name: str, hlo: str) -> tuple[int, int, str]:
    text = (FIXTURES / name / "static" / f"{hlo}_static_llo_profile.textproto").read_text()
    cycles = int(re.search(r"^  estimated_cycles: (\d+)$", text, re.M).group(1))
    equivalent = int(re.search(r"^  num_equivalent_hlos: (\d+)$", text, re.M).group(1))
    dma = re.search(r"^  dma_instruction_type: (\S+)$", text, re.M).group(1)
    return cycles, equivalent, dma


@pytest.mark.parametrize("name", ALL)
def test_real_dumps_parse_without_warnings_and_with_declared_schemas(name):
    dump = _dump(name)
    assert dump.warnings == []
    llo.OPS.require(dump.ops)
    llo.BUNDLE_PROFILE.require(dump.bundle_profile)
    llo.STATIC_PROFILE.require(dump.static_profile)
    llo.SPILL_INSTRUCTIONS.require(dump.spill_instructions)
    llo.SPILL_SLOTS.require(dump.spill_slots)
    llo.SCHEDULE.require(dump.schedule)
    llo.VMEM_ALLOCATIONS.require(dump.vmem_allocations)
    assert not dump.ops.empty
    assert dump.other_compiles == ()
    expected_module = {"v5e_mlp": "jit_mlp", "v6e_mlp": "jit_mlp", "v5e_fsdp_train": "jit_step",
                       "v6e_mlp_misc": ""}.get(name, "jit_f" if "pallas" in name else "jit_body")
    assert dump.compile.module_name == expected_module


# ---- the MLP: gelu(x @ w1) @ w2 on v5e, whose fusion spills ---------------------------------

def test_mlp_fusion_spills_agree_across_bundle_profile_utilization_and_final_bundles():
    dump = _dump("v5e_mlp")
    fusion = _op(dump, "fusion.7")
    bundles_text = _file("v5e_mlp", "fusion.7", "final_bundles")
    grep_vst, grep_vld = len(VST_SPILL.findall(bundles_text)), len(VLD_FILL.findall(bundles_text))
    util = dump.utilization_for("fusion.7")
    assert (grep_vst, grep_vld) == (107, 523)  # reference §7.1
    assert fusion["spill_stores"] == grep_vst == util.vstore_spill == _profile_counter("v5e_mlp", "fusion.7", "VMEM_SPILL_COUNT")
    assert fusion["spill_fills"] == grep_vld == util.vload_fill == _profile_counter("v5e_mlp", "fusion.7", "VMEM_FILL_COUNT")
    kinds = dump.spill_instructions.query("program == 'fusion.7'")["kind"].value_counts()
    assert kinds["vmem_spill"] == grep_vst and kinds["vmem_fill"] == grep_vld


def test_mlp_fusion_bundles_vmem_pressure_and_mxu():
    dump = _dump("v5e_mlp")
    fusion = _op(dump, "fusion.7")
    sched = _file("v5e_mlp", "fusion.7", "schedule-analysis_final_bundles")
    total = int(re.search(r"total scheduled bundles:\s+(\d+)", sched).group(1))
    util = dump.utilization_for("fusion.7")
    assert fusion["bundles"] == total == util.bundles == 4076
    # Utilization rows are the scheduled bundles: count them directly.
    util_text = _file("v5e_mlp", "fusion.7", "final_hlo-static-per-bundle-utilization")
    rows = util_text.split("== UTILIZATION:\n", 1)[1].splitlines()
    assert len([r for r in rows if r.strip()]) == total
    mxu_sum = sum(int(r.split()[0]) for r in rows if r.strip())
    assert util.column("MXU").total == mxu_sum
    assert fusion["mxu_busy_fraction"] == pytest.approx(mxu_sum / (4 * total))
    # The bundle profile says 256 matmul_packed of 276 on each of 4 MXUs.
    assert fusion["mxu_matmul_fraction"] == pytest.approx(256 / 276)
    assert fusion["register_pressure"] == 132
    rp = dump.register_pressure_for("fusion.7")
    assert rp.register_class == "vregs" and rp.top_live_ranges[0].length == 9414
    assert [r.length for r in rp.top_live_ranges] == sorted((r.length for r in rp.top_live_ranges), reverse=True)
    # 83 spill slots of one vreg (4 KiB) each in the VMEM report (post-ra trimmed from this fixture).
    assert fusion["vmem_spill_bytes"] == 83 * llo.VREG_BYTES
    assert pd.isna(fusion["spill_slots"])


def test_mlp_static_profile_cycles_and_collective():
    dump = _dump("v5e_mlp")
    cycles, equivalent, dma = _static_cycles("v5e_mlp", "fusion.7")
    assert (cycles, equivalent, dma) == (14170, 1, "DMA_INSTRUCTION_TYPE_LOCAL")
    assert _op(dump, "fusion.7")["estimated_cycles"] == cycles * equivalent
    # The same estimate is written into the op's backend_config, which the bundle profile prints.
    profile_text = _file("v5e_mlp", "TLP", "hlo-static-bundle-profile")
    assert f'"bundle_analysis_data":{{"estimated_cycles":"{cycles}"' in profile_text
    reduce = _op(dump, "all-reduce")
    assert _static_cycles("v5e_mlp", "all-reduce")[2] == "DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE"
    assert pd.isna(reduce["estimated_cycles"])  # its printed 0 is not an estimate
    assert reduce["cycles_status"] == "not-estimated-remote-dma" and reduce["is_collective"]
    assert not _op(dump, "fusion.7")["is_collective"]
    static = dump.static_profile.set_index("hlo")
    assert static.loc["all-reduce", "estimated_cycles"] == 0 and pd.isna(static.loc["all-reduce", "total_cycles"])


def test_mlp_top_level_smem_spill_is_found_with_its_bundle_and_region():
    dump = _dump("v5e_mlp")
    tlp = dump.spill_instructions.query("program == 'TLP'")
    text = _file("v5e_mlp", "TLP", "final_bundles")
    sst = re.search(r"^\s*(0x[0-9a-f]+)\s.*= sst \[smem:\[#allocation\d+_spill", text, re.M)
    assert list(tlp["kind"]) == ["smem_spill", "smem_fill"]
    assert tlp.iloc[0]["bundle"] == int(sst.group(1), 16)
    assert tlp["region"].notna().all()  # placed by matching the instruction in post-ra
    assert _op(dump, "all-reduce")["smem_spill_stores"] == 0  # the profile counts it under no op
    no_hlo = dump.bundle_profile.query("hlo == @llo.NO_HLO and unit == 'SMEM_SPILL_COUNT'")["count"].sum()
    assert no_hlo == 1


# ---- the Pallas reduction: spills at R=512, not at R=64 -------------------------------------

@pytest.mark.parametrize("name, spills", [("v5e_pallas_r512", 18), ("v5e_pallas_r64", 0)])
def test_pallas_reduction_spills_match_every_source(name, spills):
    dump = _dump(name)
    kernel = _op(dump, "f.1")
    text = _file(name, "f.1", "final_bundles")
    post_ra = _file(name, "f.1", "post-ra")
    slots_grep = len(re.findall(r"#allocation\d+_spill \[.*tag = 'spilled vreg/vmreg'\]", post_ra))
    util = dump.utilization_for("f.1")
    assert kernel["opcode"] == "custom-call" and kernel["llo_program"] == "f.1"
    assert len(VST_SPILL.findall(text)) == spills == kernel["spill_stores"] == util.vstore_spill
    assert len(VLD_FILL.findall(text)) == spills == kernel["spill_fills"] == util.vload_fill
    assert _profile_counter(name, "f.1", "VMEM_SPILL_COUNT") == spills
    assert slots_grep == spills == kernel["spill_slots"]
    assert kernel["vmem_spill_bytes"] == spills * llo.VREG_BYTES
    assert (dump.spill_instructions["hlo"] == "f.1").all()
    cycles, equivalent, _ = _static_cycles(name, "f.1")
    assert kernel["estimated_cycles"] == cycles * equivalent and kernel["cycles_status"] == "estimate"


def test_pallas_reduction_near_miss_differs_only_where_expected():
    big, small = _op(_dump("v5e_pallas_r512"), "f.1"), _op(_dump("v5e_pallas_r64"), "f.1")
    assert big["register_pressure"] == 71  # 64 live vregs of `a` + a few: over v5e's 64
    assert pd.isna(small["register_pressure"])  # libtpu writes no pressure file when nothing spills
    assert big["bundles"] > small["bundles"] and big["estimated_cycles"] > small["estimated_cycles"]


# ---- collectives, v6e, the cheap misc dump ---------------------------------------------------

@pytest.mark.parametrize("name", ["v5e_collective", "v6e_collective"])
def test_collectives_have_no_cycle_estimate_and_compute_has_one(name):
    dump = _dump(name)
    collectives = dump.ops[dump.ops["is_collective"]]
    assert set(collectives["opcode"]) == {"all-reduce", "all-gather"}
    assert collectives["estimated_cycles"].isna().all()
    assert (collectives["cycles_status"] == "not-estimated-remote-dma").all()
    fusion = _op(dump, "convolution_tanh_fusion")
    cycles, equivalent, dma = _static_cycles(name, "convolution_tanh_fusion")
    assert dma != "DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE"
    assert fusion["estimated_cycles"] == cycles * equivalent
    assert fusion["mxu_matmul_fraction"] > 0 and fusion["mxu_busy_fraction"] > 0


@pytest.mark.parametrize("name, capacities", [
    ("v5e_mlp", (4, 3, 4, 2, 1, 3, 3, 1, 1, 2)),
    ("v6e_mlp", (2, 2, 4, 2, 1, 3, 3, 2, 2, 2)),  # 2 MXUs, 2 vector store slots
])
def test_capacity_header_per_generation(name, capacities):
    util = _dump(name).utilization_for("fusion.7")
    assert tuple(c.name for c in util.columns) == llo.KNOWN_UTILIZATION_COLUMNS
    assert tuple(c.capacity for c in util.columns) == capacities


def test_v6e_mlp_fusion_spills_far_more_than_v5e():
    v6e = _op(_dump("v6e_mlp"), "fusion.7")
    util = _dump("v6e_mlp").utilization_for("fusion.7")
    assert v6e["spill_stores"] == util.vstore_spill == _profile_counter("v6e_mlp", "fusion.7", "VMEM_SPILL_COUNT") == 2474
    assert v6e["spill_fills"] == util.vload_fill == 3105
    assert v6e["vmem_spill_bytes"] % llo.VREG_BYTES == 0


def test_misc_dump_gives_profile_columns_and_says_the_rest_is_unknown():
    dump = _dump("v6e_mlp_misc")
    fusion = _op(dump, "fusion.7")
    assert fusion["spill_stores"] == _op(_dump("v6e_mlp"), "fusion.7")["spill_stores"]
    assert fusion["llo_program"] == ""  # no per-program files in a misc dump
    assert fusion["cycles_status"] == "no-static-profile" and pd.isna(fusion["estimated_cycles"])
    assert pd.isna(fusion["vmem_spill_bytes"]) and pd.isna(fusion["register_pressure"])
    # No schedule analysis: the bundles are the bundle profile's counter denominator (`VMEM_SPILL_COUNT:
    # (0/3454)` in the file), the TLP's bundles for the op, near the full dump's schedule count (3,426)
    assert fusion["bundles"] == 3454 and abs(3454 / _op(_dump("v6e_mlp"), "fusion.7")["bundles"] - 1) < 0.01
    assert dump.vmem_report is None and dump.static_profile.empty and dump.spill_instructions.empty


# ---- table invariants on every fixture -------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_bundle_profile_fractions_are_count_over_capacity(name):
    p = _dump(name).bundle_profile
    nonzero = p[p["capacity"] > 0]
    assert ((nonzero["count"] / nonzero["capacity"]) - nonzero["fraction"]).abs().max() < 1e-5
    assert (p["count"] >= 0).all()


@pytest.mark.parametrize("name", [n for n in ALL if n != "v6e_mlp_misc"])
def test_schedule_and_utilization_agree(name):
    dump = _dump(name)
    for s in dump.schedules:
        assert s.empty_bundles + s.non_empty_bundles == s.total_bundles
        rows = dump.schedule[dump.schedule["program"] == s.program]
        assert rows["bundles"].sum() == pytest.approx(s.non_empty_bundles, abs=0.01 * len(rows) + 0.01)
        assert rows["percent"].sum() == pytest.approx(100, abs=0.01 * len(rows) + 0.01)
        u = dump.utilization_for(s.program)
        if u is not None:
            assert u.bundles == s.total_bundles
    for u in dump.utilization:
        for c in u.columns:
            assert 0 <= c.total <= c.capacity * u.bundles


@pytest.mark.parametrize("name", [n for n in ALL if n != "v6e_mlp_misc"])
def test_vmem_report_matches_its_json(name):
    import json
    dump = _dump(name)
    html = next((FIXTURES / name).glob("*vmem_report.html")).read_text()
    data = json.JSONDecoder().raw_decode(html, re.search(r"const\s+DATA\s*=\s*", html).end())[0]
    assert dump.vmem_report.capacity_bytes == data["global_info"]["vmem_capacity"] == 128 << 20
    n_allocations = sum(len(b["allocations"]) for v in data["hlo_breakdowns"].values() for b in v["blocks"])
    assert len(dump.vmem_allocations) == n_allocations
    for hlo, v in data["hlo_breakdowns"].items():
        blocks = dump.vmem_allocations[dump.vmem_allocations["hlo"] == hlo].drop_duplicates("block")
        # Blocks without allocations (HLO_TEMPORARY here) do not show in the allocation table.
        assert blocks["block_bytes"].sum() <= v["total_size"]



@pytest.mark.parametrize("name", ALL)
def test_every_program_spill_count_agrees_between_profile_and_utilization(name):
    """VSTORE:SPILL / VLOAD:FILL column sums == the bundle profile's VMEM_SPILL/FILL_COUNT, per op."""
    dump = _dump(name)
    ops = dump.ops.set_index("name")
    checked = 0
    for u in dump.utilization:
        if u.program in ops.index and not pd.isna(ops.loc[u.program, "spill_stores"]):
            assert (u.vstore_spill, u.vload_fill) == (ops.loc[u.program, "spill_stores"], ops.loc[u.program, "spill_fills"])
            checked += 1
    assert checked > 0 or name == "v6e_mlp_misc"


@pytest.mark.parametrize("name", [n for n in ALL if n != "v6e_mlp_misc"])
def test_ops_cycles_follow_the_static_profile(name):
    dump = _dump(name)
    ops = dump.ops.set_index("name")
    for row in dump.static_profile.itertuples():
        op = ops.loc[row.hlo]
        if row.dma_instruction_type == "LOCAL_AND_REMOTE":
            assert pd.isna(op["estimated_cycles"]) and op["is_collective"] and row.estimated_cycles == 0
        else:
            assert op["estimated_cycles"] == row.estimated_cycles * row.num_equivalent_hlos
            assert op["cycles_per_instance"] == row.estimated_cycles
            assert op["cycles_status"] == "estimate"
        assert op["num_equivalent_hlos"] == row.num_equivalent_hlos


def test_training_step_async_collective_and_reduce_scatter_fusions():
    """v5e FSDP step: compute fusions that carry collectives have remote DMA and no estimate."""
    dump = _dump("v5e_fsdp_train")
    ops = dump.ops.set_index("name")
    carrier = ops.loc["fusion.75"]
    assert carrier["calls"] == "async_collective_fusion.75" and carrier["is_collective"]
    assert carrier["cycles_status"] == "not-estimated-remote-dma"
    assert carrier["mxu_matmul_fraction"] > 0.5  # it is mostly a matmul
    scatter = ops.loc["fusion.67"]
    assert scatter["calls"] == "all-reduce-scatter.2" and scatter["is_collective"]
    # An all-gather inlined in the TLP has no program and no estimate at all.
    gather = ops.loc["all-gather.17"]
    assert gather["llo_program"] == "" and gather["cycles_status"] == "no-static-profile"
    # The async start/done pair has no LLO of its own: it never appears as an op here.
    assert not any(n.startswith("async-collective") for n in ops.index)
    assert ops.loc["fusion.2", "register_pressure"] == 69
    assert ops.loc["fusion.2", "spill_stores"] == 10


def test_spills_inside_loops_are_marked():
    """The Pallas kernel body is a loop over the grid: post-ra puts its spills' region in `loop_body`."""
    dump = _dump("v5e_pallas_r512")
    post_ra = _file("v5e_pallas_r512", "f.1", "post-ra")
    assert re.search(r"^\s*\$region23: #\{f.1\} parent=69 // pred_region$", post_ra, re.M)
    assert re.search(r"^\s*\$region69: #\{f.1\} parent=1 // loop_body$", post_ra, re.M)
    spills = dump.spill_instructions
    assert (spills["region"] == 23).all() and spills["in_loop"].all()
    assert spills["bundle"].is_monotonic_increasing
    # Without post-ra (trimmed from the MLP fixture) nothing is claimed.
    assert _dump("v5e_mlp").spill_instructions.query("program == 'fusion.7'")["in_loop"].isna().all()
