"""The join of compiled facts to trace ops (`tpudiag.analysis.join`).

Real inputs: the modelled captures under examples/models/captures were simulated from the dumps
under examples/models/dumps, so their op names come from the same compilation and must all match;
the v6e dumps of the same model (same module name, another compilation) and the unrelated test
fixtures must not. Expected numbers are read from the dump text and from `instruction_bytes`,
never from the join itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpudiag.analysis.join import CAPTURE_ORIGIN, JOINED, HloSource, JoinOptions, join_compiled
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.model import schemas
from tpudiag.model.hardware import ChipSource
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.hlo_program import instruction_bytes
from tpudiag.parsers.hlo_proto import parse_hlo_proto
from tpudiag.parsers.hlo_text import load_hlo_dump, parse_hlo_text
from tpudiag.parsers.llo.load import load_llo_dump
from tests.conftest import REPO, bounded_examples

MODELS = REPO / "examples" / "models"
FIXTURES = REPO / "tests" / "fixtures"


def _sources(dump_dir: Path) -> list[HloSource]:
    dump = load_hlo_dump(dump_dir)
    return [HloSource(p, instruction_bytes(p), dump.path) for p in dump.programs]


def _capture_sources(analysis) -> list[HloSource]:
    host = analysis.profile.hosts[0]
    programs = [parse_hlo_proto(data, f"{host.path} program {pid}", pid) for pid, data in host.hlo_protos.items()]
    return [HloSource(p, instruction_bytes(p), CAPTURE_ORIGIN) for p in programs]


def _llo(model: str):
    root = MODELS / "dumps" / model
    return load_llo_dump(root / "llo", static_profile_dir=root / "static_profile")


@pytest.fixture(scope="module")
def train_v5e():
    return analyze(load_capture(MODELS / "captures" / "transformer_train_v5e", jobs=1))


@pytest.fixture(scope="module")
def joined_v5e(train_v5e):
    dump_dir = MODELS / "dumps" / "transformer_train_v5e" / "xla"
    return join_compiled(train_v5e.ops, _sources(dump_dir) + _capture_sources(train_v5e),
                         [_llo("transformer_train_v5e")])


def _by_name(analysis, result) -> pd.DataFrame:
    return pd.concat([analysis.ops[["name"]].astype({"name": str}), result.columns], axis=1).set_index("name")


def test_same_compilation_matches_every_trace_op(train_v5e, joined_v5e):
    r = joined_v5e
    assert r.n_ops == len(train_v5e.ops) == 140
    assert r.hlo_matched == 140 and r.dump_matched == 140
    assert r.warnings == ()
    assert list(r.columns.columns) == JOINED.names
    assert r.columns.index.equals(train_v5e.ops.index)
    # bytes from the dump given first, found by module name (text dumps carry no program id)
    assert set(r.columns["hlo_origin"]) == {str(MODELS / "dumps" / "transformer_train_v5e" / "xla")}
    assert set(r.columns["hlo_match"]) == {"module"}


def test_bytes_equal_instruction_bytes_of_the_dump(train_v5e, joined_v5e):
    program = load_hlo_dump(MODELS / "dumps" / "transformer_train_v5e" / "xla").programs[0]
    expected = instruction_bytes(program).set_index("name")
    got = _by_name(train_v5e, joined_v5e)
    for name, row in got.iterrows():
        assert row["logical_bytes"] == expected.loc[name, "logical_bytes"], name
        assert row["padded_bytes"] == expected.loc[name, "padded_bytes"], name
    assert (got["padded_bytes"] >= got["logical_bytes"]).all()  # padding only adds bytes
    # one op by hand: dynamic-slice.11 = f32[256]{0:T(256)S(1)} of a f32[3,256] operand and an s32 index
    inst = program.instruction("dynamic-slice.11")
    assert inst.shape_text.startswith("f32[256]{0:T(256)")
    assert got.loc["dynamic-slice.11", "logical_bytes"] == expected.loc["dynamic-slice.11", "logical_bytes"]


def _profile_counts(unit: str) -> dict[str, int]:
    """VMEM spill counts per HLO straight from the bundle-profile text."""
    text = next((MODELS / "dumps" / "transformer_train_v5e" / "llo").glob("*hlo-static-bundle-profile.txt")).read_text()
    counts: dict[str, int] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"HLO: %(\S+) =", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(rf"\s*- {unit}: \((\d+)/\d+\)", line)
        if m and current is not None:
            counts[current] = counts.get(current, 0) + int(m.group(1))
    return counts


def test_spills_match_the_bundle_profile_text(train_v5e, joined_v5e):
    got = _by_name(train_v5e, joined_v5e)
    stores, fills = _profile_counts("VMEM_SPILL_COUNT"), _profile_counts("VMEM_FILL_COUNT")
    spilling = [n for n, c in stores.items() if c > 0 and n in got.index]
    assert len(spilling) >= 3  # the step spills in its matmul fusions (fusion.150: 573)
    assert got.loc["fusion.150", "spill_stores"] == 573
    for name in spilling:
        assert got.loc[name, "spill_stores"] == stores[name], name
        assert got.loc[name, "spill_fills"] == fills[name], name
    assert joined_v5e.llo_matched == sum(n in got.index for n in stores)


def _static_profile(name: str) -> dict[str, str]:
    text = (MODELS / "dumps" / "transformer_train_v5e" / "static_profile" /
            f"{name}_static_llo_profile.textproto").read_text()
    return dict(re.findall(r"^  (\w+): (\S+)", text, flags=re.M))


def test_cycles_are_the_static_profile_per_instance_and_never_a_remote_dma_zero(train_v5e, joined_v5e):
    got = _by_name(train_v5e, joined_v5e)
    fields = _static_profile("dynamic-slice.11")
    assert got.loc["dynamic-slice.11", "estimated_cycles"] == int(fields["estimated_cycles"]) == 2413
    assert got.loc["dynamic-slice.11", "cycles_source"] == "llo_static_profile"
    # add_multiply_fusion.2 stands for 3 identical ops: the per-execution figure, not the sum
    fields = _static_profile("add_multiply_fusion.2")
    assert int(fields["num_equivalent_hlos"]) == 3
    if "add_multiply_fusion.2" in got.index:
        assert got.loc["add_multiply_fusion.2", "estimated_cycles"] == int(fields["estimated_cycles"])
    fields = _static_profile("all-gather.44")
    assert fields["dma_instruction_type"].endswith("LOCAL_AND_REMOTE")
    assert pd.isna(got.loc["all-gather.44", "estimated_cycles"])
    assert got.loc["all-gather.44", "cycles_source"] == ""
    collectives = train_v5e.ops["family"].astype(str) != ""
    assert joined_v5e.columns.loc[collectives, "estimated_cycles"].isna().all()


def test_capture_alone_gives_layouts_and_cycles_from_its_embedded_hlo(train_v5e):
    sources = _capture_sources(train_v5e)
    r = join_compiled(train_v5e.ops, sources)
    assert r.hlo_matched == 140 and r.llo_matched == 0 and r.dump_matched == 0
    assert r.warnings == () and r.sources == (CAPTURE_ORIGIN,)
    assert set(r.columns["hlo_match"]) == {"program_id"}
    expected = sources[0].instruction_bytes.set_index("name")
    got = _by_name(train_v5e, r)
    assert (got["padded_bytes"].astype("int64") == expected.loc[got.index, "padded_bytes"].to_numpy()).all()
    assert got["spill_stores"].isna().all()
    # bundle_analysis_data in the proto's backend_config; 0 for collectives is not an estimate
    inst = sources[0].program.instruction("fusion.75")
    assert got.loc["fusion.75", "estimated_cycles"] == inst.estimated_cycles == 1595
    assert got.loc["fusion.75", "cycles_source"] == "bundle_analysis_data"
    assert got.loc["all-reduce.4", "estimated_cycles"] is pd.NA


def test_unrelated_dumps_match_nothing_and_say_so(train_v5e):
    r = join_compiled(train_v5e.ops, _sources(FIXTURES / "dumps" / "v5e_mlp_train"),
                      [load_llo_dump(FIXTURES / "llo" / "v5e_mlp")])
    assert r.hlo_matched == 0 and r.llo_matched == 0 and r.dump_matched == 0
    assert r.columns["padded_bytes"].isna().all() and r.columns["estimated_cycles"].isna().all()
    text = "\n".join(r.warnings)
    assert "v5e_mlp_train" in text and "`jit_step`" in text and "`jit_train_step`" in text
    assert "v5e_mlp`" in text and "`jit_mlp`" in text
    assert "none matched any of the 140 trace ops" in text


def test_unrelated_dumps_beside_the_capture_keep_the_capture_layouts(train_v5e):
    r = join_compiled(train_v5e.ops, _sources(FIXTURES / "dumps" / "v5e_mlp_train") + _capture_sources(train_v5e))
    assert r.hlo_matched == 140 and r.dump_matched == 0
    assert any("none matched" in w for w in r.warnings)


def test_another_compilation_of_the_same_module_is_rejected(train_v5e):
    """The v6e compile of the same step shares the module name and most op names, not the shapes."""
    r = join_compiled(train_v5e.ops, _sources(MODELS / "dumps" / "transformer_train_v6e" / "xla"),
                      [_llo("transformer_train_v6e")])
    assert r.hlo_matched == 0 and r.llo_matched == 0
    hlo = next(m for m in r.matches if m.kind == "hlo")
    llo = next(m for m in r.matches if m.kind == "llo")
    assert not hlo.accepted and hlo.how == "module" and 0 < hlo.agreeing < 0.9 * hlo.compared
    assert not llo.accepted and 0 < llo.agreeing < 0.9 * llo.compared
    assert any("does not match the trace's `jit_train_step`" in w and "transformer_train_v6e/xla" in w
               for w in r.warnings)
    assert any(w.startswith("LLO dump") for w in r.warnings)


def test_every_llm_decode_llo_op_joins():
    analysis = analyze(load_capture(MODELS / "captures" / "llm_decode_v5e", jobs=1))
    llo = _llo("llm_decode_v5e")
    r = join_compiled(analysis.ops, _capture_sources(analysis), [llo])
    assert r.warnings == ()
    names = set(analysis.ops["name"].astype(str))
    assert r.llo_matched == len(set(llo.ops["name"].astype(str)) & names) == 131
    assert r.hlo_matched == len(analysis.ops)


# ---- small programs built in code ------------------------------------------------------------

# One entry computation: a parameter laid out with the v5e tile of the compiler-dumps reference §9
# (f32[3,1000] in T(4,128): 12,000 logical, 16,384 padded bytes) and a fusion reading it.
SMALL_HLO = """HloModule jit_small, is_scheduled=true

%fused (p: f32[3,1000]) -> f32[3,1000] {
  %p = f32[3,1000]{1,0:T(4,128)} parameter(0)
  ROOT %neg = f32[3,1000]{1,0:T(4,128)} negate(%p)
}

ENTRY %main (a: f32[3,1000]) -> f32[3,1000] {
  %a = f32[3,1000]{1,0:T(4,128)} parameter(0)
  ROOT %fusion.1 = f32[3,1000]{1,0:T(4,128)} fusion(%a), kind=kLoop, calls=%fused
}
"""


def _ops(rows: list[tuple[str, str, str]], module: str = "jit_small", program_id: int = 7) -> pd.DataFrame:
    """A trace ops table with just the join's key columns filled (name, shape_with_layout, host)."""
    n = len(rows)
    data = {c.name: [0] * n for c in schemas.OPS.columns}
    data.update(host=[h for h, _, _ in rows], program_id=[program_id] * n, module=[module] * n,
                name=[nm for _, nm, _ in rows], category=["loop fusion"] * n, bound_by=["Unknown"] * n,
                family=[""] * n, shape_with_layout=[s for _, _, s in rows], source=[""] * n, tf_op=[""] * n)
    return schemas.OPS.frame(data)


def _small_source(origin: str = "dumpdir") -> HloSource:
    program = parse_hlo_text(SMALL_HLO)
    return HloSource(program, instruction_bytes(program), origin)


def test_small_program_bytes_are_operands_plus_result_in_tiles():
    ops = _ops([("h0", "fusion.1", "f32[3,1000]{1,0:T(4,128)}"), ("h1", "fusion.1", "")])
    r = join_compiled(ops, [_small_source()])
    assert r.columns["logical_bytes"].tolist() == [2 * 12_000, 2 * 12_000]  # every host's row
    assert r.columns["padded_bytes"].tolist() == [2 * 16_384, 2 * 16_384]
    assert r.columns["spill_stores"].isna().all()  # no LLO dump: unknown, not 0


def test_a_shape_conflict_is_not_joined():
    # near miss: right name, wrong shape (another compile of the module) -> no facts, a warning
    ops = _ops([("h0", "fusion.1", "f32[3,999]{1,0:T(4,128)}")])
    r = join_compiled(ops, [_small_source()])
    assert r.hlo_matched == 0
    assert any("only 0 of 1 ops agree" in w for w in r.warnings)


def test_an_op_the_program_lacks_stays_unknown_below_the_threshold():
    ops = _ops([("h0", "fusion.1", ""), ("h0", "copy.9", "")])  # 1 of 2 agree: 0.5
    assert join_compiled(ops, [_small_source()]).hlo_matched == 0
    r = join_compiled(ops, [_small_source()], options=JoinOptions(min_agreement=0.5))
    assert r.columns["padded_bytes"].isna().tolist() == [False, True]


def test_module_name_must_match_for_dump_programs():
    r = join_compiled(_ops([("h0", "fusion.1", "")], module="jit_other"), [_small_source()])
    assert r.hlo_matched == 0
    assert any("`jit_small`" in w and "`jit_other`" in w for w in r.warnings)


def test_no_sources_no_warnings():
    r = join_compiled(_ops([("h0", "fusion.1", "")]))
    assert r.warnings == () and r.hlo_matched == 0 and r.columns["padded_bytes"].isna().all()


def test_missing_columns_fail_early():
    with pytest.raises(ValueError, match="lacks columns"):
        join_compiled(pd.DataFrame({"name": ["fusion.1"]}))


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_options_validate(value):
    with pytest.raises(ValueError, match="min_agreement"):
        JoinOptions(min_agreement=value)


def test_a_recompile_beside_the_right_program_is_no_warning():
    other = parse_hlo_text(SMALL_HLO.replace("3,1000", "3,999"))  # same module, other shapes
    sources = [HloSource(other, instruction_bytes(other), "dumpdir"), _small_source("dumpdir")]
    r = join_compiled(_ops([("h0", "fusion.1", "f32[3,1000]{1,0:T(4,128)}")]), sources)
    assert r.warnings == ()
    assert r.columns["padded_bytes"].tolist() == [2 * 16_384]
    assert [m.accepted for m in r.matches] == [False, True]


def test_a_program_id_match_needs_names_only():
    """The capture's own program (same id) is the program: a differently printed shape does not reject it."""
    program = parse_hlo_text(SMALL_HLO)
    program.program_id = 7
    source = HloSource(program, instruction_bytes(program), CAPTURE_ORIGIN)
    r = join_compiled(_ops([("h0", "fusion.1", "f32[3,1000]{1,0}")], program_id=7), [source])
    assert r.columns["hlo_match"].tolist() == ["program_id"]
    assert r.columns["padded_bytes"].tolist() == [2 * 16_384]
    # the capture's program of another id is not this trace program's, whatever its module name
    r = join_compiled(_ops([("h0", "fusion.1", "")], program_id=8), [source])
    assert r.hlo_matched == 0 and r.matches == ()


@settings(max_examples=bounded_examples(5, 2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(140)))
def test_the_join_is_per_op_whatever_the_row_order(train_v5e, joined_v5e, order):
    shuffled = train_v5e.ops.iloc[list(order)]
    r = join_compiled(shuffled, _sources(MODELS / "dumps" / "transformer_train_v5e" / "xla")
                      + _capture_sources(train_v5e), [_llo("transformer_train_v5e")])
    pd.testing.assert_frame_equal(r.columns.loc[joined_v5e.columns.index], joined_v5e.columns,
                                  check_categorical=False)


def test_a_dump_for_another_generation_is_refused_even_when_every_name_agrees():
    """The Pallas matmul compiles to one op, `shard_map.19`, of the same shape on v5e and v6e."""
    analysis = analyze(load_capture(MODELS / "captures" / "pallas_matmul_v5e", jobs=1))
    chip = analysis.profile.hosts[0].device.chip
    xla = MODELS / "dumps" / "pallas_matmul_v6e" / "xla"
    dump = load_hlo_dump(xla)
    assert dump.programs[0].target.startswith("TPU_VERSION_GHOSTLITE")  # v6e
    sources = [HloSource(p, instruction_bytes(p), dump.path, "v6e") for p in dump.programs]
    llo = _llo("pallas_matmul_v6e")
    blind = join_compiled(analysis.ops, sources, [llo])
    assert blind.dump_matched == 1  # names and shapes alone cannot tell
    r = join_compiled(analysis.ops, sources, [llo], chip=chip)
    assert r.dump_matched == 0 and r.hlo_matched == 0
    assert any(f"`{xla}` was compiled for v6e, the trace ran on v5e" in w for w in r.warnings)
    assert any(f"`{llo.path}` was compiled for v6e" in w for w in r.warnings)  # llo/ beside xla/
    # a chip that --chip (or a dump) gave is not one the trace ran on: the warning says where it came from
    told = join_compiled(analysis.ops, sources, [llo], chip=chip, chip_source=ChipSource.USER)
    assert any(f"`{xla}` was compiled for v6e, the chip is v5e (from --chip)" in w for w in told.warnings)
    assert not any("the trace ran on" in w for w in told.warnings)


def test_an_llo_dump_with_more_mxus_than_the_chip_is_refused():
    analysis = analyze(load_capture(MODELS / "captures" / "pallas_matmul_v6e", jobs=1))
    chip = analysis.profile.hosts[0].device.chip
    assert chip.mxu_per_core == 2
    llo = _llo("pallas_matmul_v5e")  # v5e: MXU_0..MXU_3 in its bundle profile
    r = join_compiled(analysis.ops, (), [llo], chip=chip)
    assert r.llo_matched == 0
    assert any("compiled for 4+ MXUs per core, the trace ran on v6e, which has 2" in w for w in r.warnings)
    assert join_compiled(analysis.ops, (), [_llo("pallas_matmul_v6e")], chip=chip).llo_matched == 1


def test_the_report_carries_the_joined_facts_per_op(train_v5e, joined_v5e):
    from tpudiag.report_builder import build_report

    plain = build_report(train_v5e)
    assert plain.summary.compiled is None
    assert all(op.padded_bytes is None and op.estimated_cycles is None for op in plain.ops)
    report = build_report(train_v5e, join=joined_v5e)
    assert report.summary.compiled.n_ops == 140 and report.summary.compiled.with_llo == 92
    got = _by_name(train_v5e, joined_v5e)
    for op in report.ops:
        row = got.loc[op.name]
        assert op.padded_bytes == row["padded_bytes"] and op.logical_bytes == row["logical_bytes"]
        assert op.spill_stores == (None if pd.isna(row["spill_stores"]) else row["spill_stores"])
        assert op.estimated_cycles == (None if pd.isna(row["estimated_cycles"]) else row["estimated_cycles"])
    # ops stay sorted by self time; the facts follow their op, not their position
    assert [op.name for op in report.ops] == [op.name for op in plain.ops]


# ---- cycles, LLO facts and targets on a program built in code ------------------------------------

# A loop program: fusion.1 carries a static-profile estimate of 500 cycles, all-reduce.2 the 0 the
# profile prints for remote DMA (not an estimate), fusion.4 a real 0, and the `while` runs a Pallas
# kernel's custom call, kernel.3, in its body (no trace op of its own: the `while` is its entry op).
LOOP_HLO = """HloModule jit_loop, is_scheduled=true

%fused (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0} parameter(0)
  ROOT %neg = f32[8,128]{1,0} negate(%p)
}

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%body (t: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %t = (s32[], f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[8,128]{1,0} get-tuple-element(%t), index=1
  %kernel.3 = f32[8,128]{1,0} custom-call(%v), custom_call_target="tpu_custom_call"
  ROOT %out = (s32[], f32[8,128]{1,0}) tuple(%i, %kernel.3)
}

%cond (c: (s32[], f32[8,128])) -> pred[] {
  %c = (s32[], f32[8,128]{1,0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %lim = s32[] constant(3)
  ROOT %lt = pred[] compare(%n, %lim), direction=LT
}

ENTRY %main (a: f32[8,128]) -> f32[8,128] {
  %a = f32[8,128]{1,0} parameter(0)
  %fusion.1 = f32[8,128]{1,0} fusion(%a), kind=kLoop, calls=%fused, backend_config={"bundle_analysis_data":{"estimated_cycles":"500"}}
  %all-reduce.2 = f32[8,128]{1,0} all-reduce(%fusion.1), replica_groups={{0,1}}, to_apply=%sum, backend_config={"bundle_analysis_data":{"estimated_cycles":"0"}}
  %fusion.4 = f32[8,128]{1,0} fusion(%all-reduce.2), kind=kLoop, calls=%fused, backend_config={"bundle_analysis_data":{"estimated_cycles":"0"}}
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,128]{1,0}) tuple(%zero, %fusion.4)
  %while.5 = (s32[], f32[8,128]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8,128]{1,0} get-tuple-element(%while.5), index=1
}
"""
LOOP_OPS = ["fusion.1", "all-reduce.2", "fusion.4", "while.5"]


def _loop_source(origin: str = "out/xla", generation: str = "") -> HloSource:
    program = parse_hlo_text(LOOP_HLO)
    return HloSource(program, instruction_bytes(program), origin, generation)


def _loop_ops(names=LOOP_OPS) -> pd.DataFrame:
    return _ops([("h0", n, "") for n in names], module="jit_loop")


def _llo_dump(rows: list[tuple], path: str = "out/llo", module: str | None = "jit_loop", mxu=None,
              units: tuple[str, ...] = ()):
    """An LLO dump's per-op table from (name, opcode, spill_stores, spill_fills, cycles_status,
    cycles_per_instance) rows; `mxu`: the MXU capacity of a utilization header; `units`: the bundle
    profile's units."""
    from types import SimpleNamespace

    ops = pd.DataFrame(rows, columns=["name", "opcode", "spill_stores", "spill_fills", "cycles_status",
                                      "cycles_per_instance"])
    utilization = () if mxu is None else (SimpleNamespace(column=lambda name: SimpleNamespace(capacity=mxu)
                                                          if name == "MXU" else None),)
    return SimpleNamespace(path=path, ops=ops, compile=None if module is None else SimpleNamespace(module_name=module),
                           utilization=utilization, bundle_profile=pd.DataFrame({"unit": list(units)}))


def _col(r, column: str) -> list:
    return [None if pd.isna(v) else v for v in r.columns[column]]


def test_hlo_cycles_are_the_backend_configs_and_a_collectives_zero_is_none():
    r = join_compiled(_loop_ops(), [_loop_source()])
    assert _col(r, "estimated_cycles") == [500, None, 0, None]  # the while has no estimate
    assert r.columns["cycles_source"].tolist() == ["bundle_analysis_data", "", "bundle_analysis_data", ""]
    assert r.columns["hlo_match"].tolist() == ["module"] * 4 and r.dump_matched == 4
    assert r.program_for(np.uint64(7), "jit_loop") is r.programs[(7, "jit_loop")]
    assert r.program_for(7, "jit_other") is None


LLO_ROWS = [
    ("fusion.1", "fusion", 3, 4, "estimate", 120),  # the static profile wins over the HLO's 500
    ("all-reduce.2", "all-reduce", np.nan, np.nan, "not-estimated-remote-dma", np.nan),
    ("while.5", "while", 1, 2, "no-static-profile", np.nan),
    ("kernel.3", "custom-call", 10, 20, "estimate", 7),  # no trace row: rolled up into while.5
    ("<top-inlining-caller>", "", 5, 5, "estimate", 9),  # the TLP: no op
    ("", "", 1, 1, "estimate", 1),
]


def test_llo_facts_join_by_name_and_a_nested_kernels_spills_go_to_its_entry_op():
    from tpudiag.model.llo import NO_HLO

    llo = _llo_dump(LLO_ROWS + [(NO_HLO, "", 1, 1, "estimate", 1)])
    r = join_compiled(_loop_ops(), [_loop_source()], [llo])
    assert r.warnings == ()
    assert _col(r, "spill_stores") == [3, None, None, 1 + 10] and _col(r, "spill_fills") == [4, None, None, 2 + 20]
    assert _col(r, "estimated_cycles") == [120, None, 0, None]
    assert r.columns["cycles_source"].tolist() == ["llo_static_profile", "", "bundle_analysis_data", ""]
    assert r.columns["llo_origin"].tolist() == ["out/llo", "out/llo", "", "out/llo"]
    assert r.runs_inside == {"kernel.3": "while.5"} and r.llo_matched == 3
    (m,) = [m for m in r.matches if m.kind == "llo"]
    assert (m.module, m.trace_program, m.agreeing, m.compared, m.accepted, m.how) == (
        "jit_loop", "jit_loop", 4, 4, True, "module")  # the four named ops, all in the program


def test_a_nested_kernel_whose_entry_op_is_in_the_trace_keeps_its_spills_there():
    # the trace has the kernel's own row: it keeps its spills; the while keeps its own
    r = join_compiled(_loop_ops(LOOP_OPS + ["kernel.3"]), [_loop_source()], [_llo_dump(LLO_ROWS)])
    assert _col(r, "spill_stores") == [3, None, None, 1, 10] and r.runs_inside == {}


def test_a_nested_kernel_adds_to_nothing_joined_from_another_dump():
    # while.5's facts came from another dump (listed first): kernel.3's spills from the second stay out of it
    first = _llo_dump([("while.5", "while", 1, 2, "no-static-profile", np.nan)], path="first/llo")
    second = _llo_dump(LLO_ROWS, path="out/llo")
    r = join_compiled(_loop_ops(), [_loop_source()], [first, second])
    assert _col(r, "spill_stores")[3] == 1 and r.runs_inside == {}
    # without spill counts the kernel adds nothing, and the while still counts it as run inside
    bare = _llo_dump([("while.5", "while", np.nan, np.nan, "no-static-profile", np.nan),
                      ("kernel.3", "custom-call", np.nan, np.nan, "estimate", 7)])
    r = join_compiled(_loop_ops(), [_loop_source()], [bare])
    assert _col(r, "spill_stores")[3] is None and r.runs_inside == {"kernel.3": "while.5"}


def test_an_llo_dump_whose_opcodes_disagree_is_not_joined_and_says_so():
    rows = [(n, "convolution", 1, 1, "estimate", 5) for n in LOOP_OPS]  # every opcode wrong
    r = join_compiled(_loop_ops(), [_loop_source()], [_llo_dump(rows)])
    assert r.llo_matched == 0
    assert "LLO dump `out/llo` does not match the trace's `jit_loop`: only 0 of 4 of its ops are ops of that " \
           "program (another compilation?); its spills and cycles are not joined" in r.warnings
    # without an HLO program to compare opcodes with, names alone decide
    assert join_compiled(_loop_ops(), (), [_llo_dump(rows)]).llo_matched == 4


def test_an_llo_dump_of_another_module_or_of_no_ops_is_named_in_a_warning():
    other = _llo_dump(LLO_ROWS, path="other/llo", module="jit_other")
    unnamed = _llo_dump([("copy.9", "copy", 1, 1, "estimate", 5)], path="anon/llo", module=None)
    empty = _llo_dump([("<top-inlining-caller>", "", 1, 1, "estimate", 5)], path="tlp/llo", module=None)
    r = join_compiled(_loop_ops(), (), [other, unnamed, empty])
    # Only the unnamed dump is tried (by names). Regressions: the dump of no ops came back with its
    # filtered-out `<top-inlining-caller>` row (tried, "0 of 1"), and neither it nor the unnamed dump
    # that shares no name was named in any warning.
    assert r.llo_matched == 0 and [(m.origin, m.how, m.compared) for m in r.matches] == [("anon/llo", "names", 1)]
    assert list(r.warnings) == [
        "compiler dump `other/llo` matched none of the 4 trace ops: it holds `jit_other`, the trace runs "
        "`jit_loop` (dumps from another compilation?)",
        "compiler dump `anon/llo` matched none of the 4 trace ops: it names no module, the trace runs `jit_loop` "
        "(dumps from another compilation?)",
        "compiler dump `tlp/llo` matched none of the 4 trace ops: it names no module, the trace runs `jit_loop` "
        "(dumps from another compilation?)",
        "compiler dumps were given but none matched any of the 4 trace ops: no padding, spill or cycle figures "
        "come from them"]


def test_spill_counts_read_as_numbers_or_unknown():
    from tpudiag.analysis.join import _int_or_na

    assert _int_or_na(3.0) == 3 and isinstance(_int_or_na(np.int64(3)), int)
    assert _int_or_na(None) is pd.NA and _int_or_na(pd.NA) is pd.NA and _int_or_na(float("nan")) is pd.NA


def test_an_async_done_matches_its_printed_opcode():
    from types import SimpleNamespace

    from tpudiag.analysis.join import _same_opcode

    done = SimpleNamespace(opcode="async-done", wrapped_opcode="slice")
    assert _same_opcode("slice-done", done) and _same_opcode("async-done", done) and _same_opcode("slice", done)
    assert not _same_opcode("slice-start", done) and not _same_opcode("copy-done", done)
    assert not _same_opcode("slice-done", SimpleNamespace(opcode="fusion", wrapped_opcode="slice"))


def test_mxus_per_core_from_the_utilization_header_else_the_bundle_profile():
    from tpudiag.analysis.join import _llo_mxus

    assert _llo_mxus(_llo_dump([], mxu=2)) == (2, True)
    assert _llo_mxus(_llo_dump([], mxu=0, units=("MXU_0", "MXU_3", "VALU_1", "MXU_10x"))) == (4, False)
    assert _llo_mxus(_llo_dump([], units=("VALU_0",))) == (None, False)


def test_a_source_for_another_target_is_refused_and_one_for_this_target_is_not():
    from tpudiag.model.hardware import chip_for

    v5e = chip_for("v5e")  # 4 MXUs per core
    rows = [(n, "", 1, 1, "estimate", 5) for n in LOOP_OPS]
    # the generation compared without case; fewer MXUs than the chip's only as a lower bound
    ok = join_compiled(_loop_ops(), [_loop_source(generation="V5E")], [_llo_dump(rows, units=("MXU_0", "MXU_1"))],
                       chip=v5e)
    assert ok.warnings == () and ok.hlo_matched == 4 and ok.llo_matched == 4
    # an exact MXU count that differs, though smaller: refused
    exact = join_compiled(_loop_ops(), (), [_llo_dump(rows, mxu=2)], chip=v5e)
    assert exact.llo_matched == 0 and exact.warnings[0] == (
        "compiler dump `out/llo` was compiled for 2 MXUs per core, the trace ran on v5e, which has 4: its facts "
        "are not joined")
    # an HLO dump for v6e refuses the LLO dump beside it (`llo/` next to `xla/`), not one elsewhere
    beside = _llo_dump(rows, path="out/llo")
    apart = _llo_dump(rows, path="elsewhere/llo")
    r = join_compiled(_loop_ops(), [_loop_source(generation="v6e")], [beside, apart], chip=v5e)
    assert r.warnings[:2] == ("compiler dump `out/xla` was compiled for v6e, the trace ran on v5e: its facts are "
                              "not joined",
                              "compiler dump `out/llo` was compiled for v6e, the trace ran on v5e: its facts are "
                              "not joined")
    assert r.columns["llo_origin"].tolist() == ["elsewhere/llo"] * 4
    # without a chip nothing is refused
    assert join_compiled(_loop_ops(), [_loop_source(generation="v6e")]).hlo_matched == 4


def test_an_llo_dump_and_an_xla_dump_share_a_compile_in_one_directory_or_side_by_side():
    from tpudiag.analysis.join import _same_compile_output

    assert _same_compile_output("out/dump", "out/dump")
    assert _same_compile_output("out/xla", "out/llo")
    assert not _same_compile_output("out/xla", "other/llo")
    assert not _same_compile_output("out/hlo", "out/llo") and not _same_compile_output("out/xla", "out/jf")


def test_a_nested_kernels_spills_start_the_count_of_an_entry_op_without_its_own():
    # the dump has no row for while.5 (nor for ghost.9, which no entry op runs): kernel.3's spills are
    # while.5's whole count, and the op no entry op runs does not stop the roll-up
    llo = _llo_dump([("ghost.9", "custom-call", 5, 5, "estimate", 1),
                     ("kernel.3", "custom-call", 10, 20, "estimate", 7),
                     ("fusion.1", "fusion", 3, 4, "estimate", 120)])
    r = join_compiled(_loop_ops(), [_loop_source()], [llo], options=JoinOptions(min_agreement=0.5))
    assert _col(r, "spill_stores") == [3, None, None, 10] and _col(r, "spill_fills") == [4, None, None, 20]
    assert r.columns["llo_origin"].tolist() == ["out/llo", "", "", "out/llo"]
    assert r.runs_inside == {"kernel.3": "while.5"}


def test_shapes_agree_whatever_their_spacing_and_comments():
    ops = _ops([("h0", "fusion.1", "f32[3, 1000]{1,0:T(4,128)} /*index=0*/")])
    assert join_compiled(ops, [_small_source()]).columns["padded_bytes"].tolist() == [2 * 16_384]


def test_mxus_of_one_exactly_and_of_a_two_digit_unit():
    from tpudiag.analysis.join import _llo_mxus

    assert _llo_mxus(_llo_dump([], mxu=1)) == (1, True)
    assert _llo_mxus(_llo_dump([], units=("MXU_9", "MXU_10"))) == (11, False)  # by number, not text


def test_an_op_the_program_lacks_does_not_stop_the_agreement_of_the_ops_after_it():
    ops = _ops([("h0", "copy.9", ""), ("h0", "fusion.1", "")])
    r = join_compiled(ops, [_small_source()], options=JoinOptions(min_agreement=0.5))
    assert r.columns["padded_bytes"].isna().tolist() == [True, False]


def test_an_async_copys_zero_is_no_estimate():
    program = parse_hlo_text("""HloModule jit_copy, is_scheduled=true

ENTRY %main (a: f32[8,128]) -> f32[8,128] {
  %a = f32[8,128]{1,0} parameter(0)
  %copy-start.1 = (f32[8,128]{1,0}, f32[8,128]{1,0}, u32[]) copy-start(%a), backend_config={"bundle_analysis_data":{"estimated_cycles":"0"}}
  ROOT %copy-done.1 = f32[8,128]{1,0} copy-done(%copy-start.1), backend_config={"bundle_analysis_data":{"estimated_cycles":"0"}}
}
""")
    assert program.instruction("copy-start.1").async_role == "start"
    assert not program.instruction("copy-start.1").collective_family
    r = join_compiled(_ops([("h0", "copy-start.1", ""), ("h0", "copy-done.1", "")], module="jit_copy"),
                      [HloSource(program, instruction_bytes(program), "dumpdir")])
    assert _col(r, "estimated_cycles") == [None, None] and r.columns["cycles_source"].tolist() == ["", ""]


def test_a_rolled_up_kernel_counts_its_entry_op_as_joined_from_a_dump():
    # the HLO comes from the capture itself: only the LLO dump makes fusion.1 and while.5 dump facts
    llo = _llo_dump([("kernel.3", "custom-call", 10, 20, "estimate", 7), ("fusion.1", "fusion", 3, 4, "estimate", 9)])
    r = join_compiled(_loop_ops(), [_loop_source(origin=CAPTURE_ORIGIN)], [llo])
    assert r.columns["hlo_origin"].tolist() == [CAPTURE_ORIGIN] * 4
    assert r.dump_matched == 2 and _col(r, "spill_stores")[3] == 10


def test_every_llo_dump_is_checked_against_the_target_after_one_is_refused():
    from tpudiag.model.hardware import chip_for

    rows = [(n, "", 1, 1, "estimate", 5) for n in LOOP_OPS]
    r = join_compiled(_loop_ops(), [_loop_source(generation="v6e")],
                      [_llo_dump(rows, path="a/llo", mxu=2), _llo_dump(rows, path="out/llo")], chip=chip_for("v5e"))
    assert r.llo_matched == 0 and r.hlo_matched == 0
    assert [w.split(" was ")[0] for w in r.warnings[:3]] == ["compiler dump `out/xla`", "compiler dump `a/llo`",
                                                              "compiler dump `out/llo`"]


def test_the_join_needs_only_its_key_columns_and_reads_a_missing_shape_as_unknown():
    ops = _ops([("h0", "fusion.1", ""), ("h0", "copy.9", "")])[["host", "program_id", "module", "name",
                                                                  "shape_with_layout"]]
    ops["shape_with_layout"] = pd.array([pd.NA, pd.NA], dtype="string")  # not printed: no shape to compare
    r = join_compiled(ops, [_small_source()], options=JoinOptions(min_agreement=0.5))
    assert _col(r, "padded_bytes") == [2 * 16_384, None]
    assert r.columns["hlo_match"].tolist() == ["module", ""] and r.columns["hlo_origin"].tolist() == ["dumpdir", ""]


# ---- the survivors the third mutation run left open (docs/testing.md, lane mut-open) ------------

def test_two_compilations_of_one_module_in_one_trace_are_joined_each_by_its_own_ops():
    from tpudiag.analysis.join import SourceMatch

    # program 7 printed the dump's shape, program 8 (a recompile of the same module) another one: each
    # trace program is compared on its own ops, so 7 joins (1 of 1) and 8 is refused (0 of 1)
    ops = _ops([("h0", "fusion.1", "f32[3,1000]{1,0:T(4,128)}")], program_id=7)
    ops = pd.concat([ops, _ops([("h0", "fusion.1", "f32[3,999]{1,0:T(4,128)}")], program_id=8)], ignore_index=True)
    source = _small_source()
    r = join_compiled(ops, [source])
    assert _col(r, "padded_bytes") == [2 * 16_384, None] and r.hlo_matched == 1
    assert r.matches == (SourceMatch("hlo", "dumpdir", "jit_small", "jit_small", 7, 1, 1, True, "module"),
                         SourceMatch("hlo", "dumpdir", "jit_small", "jit_small", 8, 0, 1, False, "module"))
    assert list(r.programs) == [(7, "jit_small")] and r.programs[(7, "jit_small")] is source.program
    assert (r.n_ops, r.sources) == (2, ("dumpdir",))
    assert r.warnings == (
        "compiled program `jit_small` from `dumpdir` does not match the trace's `jit_small`: only 0 of 1 ops "
        "agree in name and shape (another compilation?); its layouts and cycles are not joined",)


def test_a_source_for_another_module_or_target_does_not_stop_the_sources_after_it():
    from tpudiag.model.hardware import chip_for

    other = parse_hlo_text(SMALL_HLO.replace("jit_small", "jit_other"))
    sources = [HloSource(other, instruction_bytes(other), "otherdir"), _loop_source("v6e/xla", generation="v6e"),
               _small_source()]
    r = join_compiled(_ops([("h0", "fusion.1", "")]), sources, chip=chip_for("v5e"))
    assert _col(r, "padded_bytes") == [2 * 16_384] and r.columns["hlo_origin"].tolist() == ["dumpdir"]


def test_the_llo_facts_of_an_op_after_one_the_dump_lacks_are_joined():
    # all-reduce.2 comes first in the trace and has no LLO row: fusion.1 after it still gets its spills
    llo = _llo_dump([("fusion.1", "fusion", 3, 4, "estimate", 120), ("while.5", "while", 1, 2, "no-static-profile",
                                                                       np.nan)])
    r = join_compiled(_loop_ops(["all-reduce.2", "fusion.1", "while.5"]), [_loop_source()], [llo])
    assert _col(r, "spill_stores") == [None, 3, 1] and r.columns["llo_origin"].tolist() == ["", "out/llo", "out/llo"]


def test_bytes_from_a_dump_and_cycles_from_the_capture_count_as_joined_from_a_dump():
    # the dump has no estimate; the capture's own program (same id) has 500 cycles for fusion.1
    with_cycles = parse_hlo_text(SMALL_HLO.replace(
        "calls=%fused", 'calls=%fused, backend_config={"bundle_analysis_data":{"estimated_cycles":"500"}}'))
    with_cycles.program_id = 7
    capture = HloSource(with_cycles, instruction_bytes(with_cycles), CAPTURE_ORIGIN)
    r = join_compiled(_ops([("h0", "fusion.1", "")]), [_small_source(), capture])
    assert r.columns["hlo_origin"].tolist() == ["dumpdir"] and _col(r, "estimated_cycles") == [500]
    assert r.columns["cycles_source"].tolist() == ["bundle_analysis_data"]
    assert r.dump_matched == 1  # the bytes came from the dump, whatever the cycles' source
    # the capture first: both facts from it, none from a dump
    r = join_compiled(_ops([("h0", "fusion.1", "")]), [capture, _small_source()])
    assert r.columns["hlo_origin"].tolist() == [CAPTURE_ORIGIN] and r.dump_matched == 0


def test_a_remote_dma_in_the_llo_dump_clears_the_hlos_estimate():
    # the HLO says 500 cycles for fusion.1; the static profile says it is remote DMA, not estimated
    llo = _llo_dump([("fusion.1", "fusion", 0, 0, "not-estimated-remote-dma", np.nan)])
    r = join_compiled(_loop_ops(["fusion.1"]), [_loop_source()], [llo])
    assert _col(r, "estimated_cycles") == [None] and r.columns["cycles_source"].tolist() == [""]
    assert r.columns["llo_origin"].tolist() == ["out/llo"]


def test_an_llo_dump_at_exactly_the_agreement_threshold_is_joined():
    from tpudiag.analysis.join import SourceMatch

    # 2 of the dump's 4 ops are ops of the trace program: exactly min_agreement 0.5 joins, 0.75 does not
    llo = _llo_dump([("fusion.1", "fusion", 3, 4, "estimate", 120), ("while.5", "while", 1, 2, "estimate", 9),
                     ("ghost.1", "fusion", 1, 1, "estimate", 1), ("ghost.2", "fusion", 1, 1, "estimate", 1)])
    half = join_compiled(_loop_ops(["fusion.1", "while.5"]), (), [llo], options=JoinOptions(min_agreement=0.5))
    assert half.llo_matched == 2 and half.matches == (
        SourceMatch("llo", "out/llo", "jit_loop", "jit_loop", 7, 2, 4, True, "module"),)
    more = join_compiled(_loop_ops(["fusion.1", "while.5"]), (), [llo], options=JoinOptions(min_agreement=0.75))
    assert more.llo_matched == 0 and not more.matches[0].accepted
    assert JoinOptions(min_agreement=1.0).min_agreement == 1.0  # the top of (0, 1] is allowed


def test_the_llo_dump_is_compared_with_the_trace_ops_and_the_accepted_programs_instructions():
    # kernel.3 is no trace op but an instruction of the accepted HLO program; copy.7 is a trace op the
    # HLO program lacks (so its agreement is 4 of 5, accepted at 0.8): the LLO dump's two rows agree
    llo = _llo_dump([("kernel.3", "custom-call", 10, 20, "estimate", 7), ("copy.7", "copy", 1, 1, "estimate", 2)])
    r = join_compiled(_loop_ops(LOOP_OPS + ["copy.7"]), [_loop_source()], [llo],
                      options=JoinOptions(min_agreement=0.8))
    (m,) = [m for m in r.matches if m.kind == "llo"]
    assert (m.agreeing, m.compared, m.accepted) == (2, 2, True)
    assert _col(r, "spill_stores") == [None, None, None, 10, 1]


def test_a_dump_that_was_tried_and_named_in_a_warning_is_not_named_again():
    # an HLO dump refused for its shapes, an LLO dump of the module refused for its opcodes, and an
    # unnamed LLO dump sharing one name but refused: each has its own warning, none "matched none"
    bad_shape = parse_hlo_text(LOOP_HLO.replace("f32[8,128]", "f32[8,64]"))
    rows = [(n, "convolution", 1, 1, "estimate", 5) for n in LOOP_OPS]
    unnamed = _llo_dump([("fusion.1", "fusion", 1, 1, "estimate", 5), ("x.1", "", 1, 1, "estimate", 5)],
                        path="anon/llo", module=None)
    ops = _ops([("h0", n, "" if n == "while.5" else "f32[8,128]{1,0}") for n in LOOP_OPS], module="jit_loop")
    r = join_compiled(ops, [HloSource(bad_shape, instruction_bytes(bad_shape), "bad/xla"), _loop_source()],
                      [_llo_dump(rows), unnamed])
    assert [w.split(" does not match")[0] for w in r.warnings] == [
        "compiled program `jit_loop` from `bad/xla`", "LLO dump `out/llo`", "LLO dump `anon/llo`"]


def test_a_dump_that_matched_nothing_names_every_module_it_holds_and_the_trace_runs():
    a = parse_hlo_text(SMALL_HLO.replace("jit_small", "jit_b"))
    b = parse_hlo_text(SMALL_HLO.replace("jit_small", "jit_a"))
    sources = [HloSource(p, instruction_bytes(p), "pair/xla") for p in (a, b)]
    two = pd.concat([_ops([("h0", "fusion.1", "")], module="jit_x", program_id=1),
                     _ops([("h0", "fusion.1", "")], module="jit_y", program_id=2)], ignore_index=True)
    r = join_compiled(schemas.OPS.frame({c: two[c].tolist() for c in two.columns}), sources)
    assert r.warnings[0] == ("compiler dump `pair/xla` matched none of the 2 trace ops: it holds `jit_a`, `jit_b`, the "
                             "trace runs `jit_x`, `jit_y` (dumps from another compilation?)")
    # a trace without ops
    r = join_compiled(_ops([]), [_small_source()])
    assert r.warnings[0] == ("compiler dump `dumpdir` matched none of the 0 trace ops: it holds `jit_small`, the "
                             "trace runs no ops (dumps from another compilation?)")


def test_an_llo_dump_of_no_ops_or_refused_does_not_stop_the_dumps_after_it():
    empty = _llo_dump([("<top-inlining-caller>", "", 1, 1, "estimate", 5)], path="tlp/llo", module=None)
    refused = _llo_dump([("ghost.1", "fusion", 1, 1, "estimate", 5)], path="bad/llo")
    good = _llo_dump([("fusion.1", "fusion", 3, 4, "estimate", 120)], path="out/llo")
    r = join_compiled(_loop_ops(["fusion.1"]), (), [empty, refused, good])
    assert r.columns["llo_origin"].tolist() == ["out/llo"] and _col(r, "spill_stores") == [3]


def test_only_a_dump_whose_own_tries_were_all_silent_is_named_as_matching_nothing():
    # bad/llo names the trace's module and was tried and refused (its own warning); other/llo names
    # another module and was never tried: only other/llo is named as matching none
    refused = _llo_dump([("ghost.1", "fusion", 1, 1, "estimate", 5), ("ghost.2", "fusion", 1, 1, "estimate", 5)],
                        path="bad/llo")
    other = _llo_dump(LLO_ROWS, path="other/llo", module="jit_other")
    r = join_compiled(_loop_ops(), (), [refused, other])
    assert [w.split(":")[0] for w in r.warnings] == [
        "LLO dump `bad/llo` does not match the trace's `jit_loop`", "compiler dump `other/llo` matched none of the 4 "
        "trace ops", "compiler dumps were given but none matched any of the 4 trace ops"]
