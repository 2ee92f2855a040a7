"""XLA dump directories and HLO text: real v5e/v6e/TPU7x dumps, their side files, damaged input.

Fixtures are real compiler output (`tests/fixtures/dumps/make_fixtures.py` says what each one
is); numbers are checked against the dump text itself and against what the compiler reported
at compile time (`facts.json`: `cost_analysis()`, `memory_analysis()`, `input_formats`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples

from tpudiag.errors import InputError
from tpudiag.model.compiled import INSTRUCTION_BYTES, CompiledDump
from tpudiag.parsers.hlo_program import FREE_OPCODES, backend_cycles, instruction_bytes
from tpudiag.parsers.hlo_text import load_hlo_dump, load_hlo_text, parse_hlo_text
from tpudiag.parsers.layout import parse_shape

DUMPS = Path(__file__).resolve().parents[1] / "fixtures" / "dumps"
MLP_FIXTURES = ("v5e_mlp_train", "v6e_mlp_train", "tpu7x_mlp_train")
_INSTRUCTION_LINE = re.compile(r"^\s+(?:ROOT )?%(\S+) = ")


def _facts(name: str) -> dict:
    return json.loads((DUMPS / name / "facts.json").read_text())


def _text(name: str) -> str:
    return next((DUMPS / name).glob("*.after_optimizations.txt")).read_text()


def _program(name: str):
    dump = load_hlo_dump(DUMPS / name)
    assert isinstance(dump, CompiledDump) and len(dump.programs) == 1
    return dump.programs[0]


# --- what the dump text says --------------------------------------------------------------

@pytest.mark.parametrize("name", MLP_FIXTURES)
def test_every_instruction_line_is_parsed(name):
    program = _program(name)
    lines = [m.group(1) for ln in _text(name).splitlines() if (m := _INSTRUCTION_LINE.match(ln))]
    assert len(program.instructions) == len(lines)
    assert program.warnings == []
    assert program.module == "jit_step" and program.is_scheduled


@pytest.mark.parametrize("name", MLP_FIXTURES)
def test_schedule_is_the_entry_order_of_the_text(name):
    program = _program(name)
    text = _text(name)
    entry_block = text[text.index("\nENTRY "):]
    entry_block = entry_block[: entry_block.index("\n}")]
    order = [m.group(1) for ln in entry_block.splitlines() if (m := _INSTRUCTION_LINE.match(ln))]
    assert program.schedule == tuple(order)
    assert [program.instruction(n).position for n in order] == list(range(len(order)))
    assert program.instruction(program.computations[program.entry].root).is_root


def test_instruction_fields_as_written_v5e():
    program = _program("v5e_mlp_train")
    fusion = program.instruction("fusion.8")
    assert fusion.opcode == "fusion" and fusion.fusion_kind == "kOutput"
    assert fusion.called_computations == ("fused_computation.12",)
    assert fusion.operands == ("copy-done", "get-tuple-element.1", "async-collective-done")
    assert fusion.shape_text == "bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)}"
    assert fusion.shape.memory_space == 1 and fusion.padded_bytes == 1024 * 1024 * 2
    assert fusion.op_name == "jit(step)/transpose(jvp())/dot_general"
    param = program.instruction("param.2")
    assert param.opcode == "parameter" and param.parameter_number == 2 and param.op_name == "w2"
    copy_start = program.instruction("copy-start")
    assert copy_start.operands == ("param.1",) and copy_start.async_role == "start"
    body = program.instruction("custom-call.1", "fused_computation.39")
    assert body.custom_call_target == "AsyncCollectiveStart" and body.is_root
    gather = program.instruction("all-gather.24")
    assert dict(gather.frontend_attributes)["async_collective_name"] == "all-gather-start.1"


def test_stack_frame_ids_resolve_to_file_and_line():
    """Current XLA writes `stack_frame_id=N` plus frame tables instead of `source_file=`.

    Expected values are read straight from the tables at the top of the dump: frame N ->
    file_location_id -> (file_name_id, line).
    """
    text = _text("v5e_mlp_train")
    frames = {int(m[1]): int(m[2]) for m in re.finditer(r"^(\d+) \{file_location_id=(\d+) ", text, re.M)}
    locations = {int(m[1]): (int(m[2]), int(m[3]))
                 for m in re.finditer(r"^(\d+) \{file_name_id=(\d+) function_name_id=\d+ line=(\d+)", text, re.M)}
    files = {int(m[1]): m[2] for m in re.finditer(r'^(\d+) "(.*)"$', text[: text.index("FunctionNames")], re.M)}
    program = _program("v5e_mlp_train")
    checked = 0
    for line in text.splitlines():
        m = re.match(r"^\s+(?:ROOT )?%(\S+) = .*stack_frame_id=(\d+)", line)
        if not m:
            continue
        file_id, source_line = locations[frames[int(m[2])]]
        inst = next(i for i in program.instructions.values() if i.name == m[1])
        assert (inst.source_file, inst.source_line) == (files[file_id], source_line), m[1]
        checked += 1
    assert checked > 20
    assert all(i.source_file.endswith("make_fixtures.py") for i in program.instructions.values() if i.source_file)


def test_backend_config_cycles_prefer_the_static_profile():
    program = load_hlo_text(DUMPS / "v5e_dot_profiled" / "compiled_as_text.hlo.txt")
    fusion = program.instruction("fusion")
    # The same config carries the classic model's 143,032 and the LLO profile's 138,056 (§4).
    assert '"estimated_cycles":"143032"' in fusion.backend_config
    assert (fusion.estimated_cycles, fusion.cycles_source) == (138_056, "bundle_analysis_data")


@pytest.mark.parametrize(("config", "expected"), [
    ('{"window_config":{"estimated_cycles":"1499"}}', (1499, "window_config")),
    ('{"bundle_analysis_data":{"estimated_cycles":"7"},"window_config":{"estimated_cycles":"9"}}',
     (7, "bundle_analysis_data")),
    ('{"flag_configs":[]}', (None, "")),
    ("opaque custom-call bytes estimated_cycles", (None, "")),  # not JSON: no estimate, no error
    ('{"window_config":{"estimated_cycles":"n/a"}}', (None, "")),
    ("", (None, "")),
])
def test_backend_cycles(config, expected):
    assert backend_cycles(config) == expected


def test_xla_dump_file_lacks_the_backend_cost_annotations_that_as_text_has():
    """A real difference: `*after_optimizations.txt` is written before the TPU backend annotates."""
    dumped = _program("v5e_dot_profiled")
    assert all(i.estimated_cycles is None for i in dumped.instructions.values())


# --- against what the compiler reported --------------------------------------------------

@pytest.mark.parametrize("name", (*MLP_FIXTURES, "v5e_dot_profiled", "v5e_odd_params"))
def test_parameters_match_input_formats_and_argument_size(name):
    program, facts = _program(name), _facts(name)
    params = program.entry_parameters()
    assert [p.parameter_number for p in params] == list(range(len(facts["input_formats"])))
    for param, fmt in zip(params, facts["input_formats"], strict=True):
        assert list(reversed(param.shape.layout.minor_to_major)) == fmt["major_to_minor"]
        assert [list(t) for t in param.shape.layout.tiles] == fmt["tiling"]
    assert sum(p.padded_bytes for p in params) == facts["memory_analysis"]["argument_size_in_bytes"]


@pytest.mark.parametrize("name", (*MLP_FIXTURES, "v5e_dot_profiled"))
def test_live_out_allocations_are_the_output_size(name):
    """output_size_in_bytes = the result arrays plus the output tuple's own index table."""
    program, facts = _program(name), _facts(name)
    live_out = sum(a.size_bytes for a in program.allocations if a.maybe_live_out)
    assert live_out == facts["memory_analysis"]["output_size_in_bytes"]
    root = program.instruction(program.computations[program.entry].root)
    table = sum(a.size_bytes for a in program.allocations if a.is_output and a.maybe_live_out
                and root.shape_text.startswith("("))
    assert root.padded_bytes + table == facts["memory_analysis"]["output_size_in_bytes"]


def test_dot_flops_from_parsed_shapes_match_cost_analysis():
    program, facts = _program("v5e_dot_profiled"), _facts("v5e_dot_profiled")
    conv = next(i for i in program.instructions.values() if i.opcode == "convolution")
    lhs = program.instruction(conv.operands[0], conv.computation)
    m, n = conv.shape.dims
    k = lhs.shape.dims[1]
    assert 2 * m * n * k == facts["cost_analysis"]["flops"]


# --- buffer assignment and memory-usage report -------------------------------------------

@pytest.mark.parametrize("name", (*MLP_FIXTURES, "v5e_dot_profiled", "v5e_odd_params"))
def test_buffer_values_are_their_padded_bytes(name):
    """Every array value the compiler placed has exactly the size our layout math gives it.

    Known exception: `s32[2]{0:S(4)}` on v5e takes 4,096 bytes, a memory-space granule, not
    padding.
    """
    program = _program(name)
    checked = 0
    for alloc in program.allocations:
        for value in alloc.values:
            shape = parse_shape(value.shape_text)
            if value.shape_text.startswith("(") or "S(4)" in value.shape_text:
                continue
            assert shape.padded_bytes == value.size_bytes, (value.name, value.shape_text)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", (*MLP_FIXTURES, "v5e_dot_profiled", "v5e_odd_params"))
def test_memory_report_totals_are_allocation_sums(name):
    program = _program(name)
    by_color: dict[int, int] = {}
    for alloc in program.allocations:
        by_color[alloc.color] = by_color.get(alloc.color, 0) + alloc.size_bytes
    report = {m.color: m.total_bytes for m in program.memory_spaces}
    assert report == {c: by_color.get(c, 0) for c in report}
    names = {m.color: m.name for m in program.memory_spaces}
    assert names[0] == "default" and names[1] == "vmem"


def test_buffer_assignment_fields_v5e():
    program = _program("v5e_mlp_train")
    text = next((DUMPS / "v5e_mlp_train").glob("*-buffer-assignment.txt")).read_text()
    assert len(program.allocations) == text.count("\nallocation ") + text.startswith("allocation ")
    params = {a.parameter_number: a.size_bytes for a in program.allocations if a.parameter_number is not None}
    assert params == {0: 262_144, 1: 1_048_576, 2: 1_048_576}
    vmem = next(a for a in program.allocations if a.color == 1)
    assert vmem.is_temp and vmem.size_bytes == 7_077_888
    assert program.total_bytes_used == 11_590_172
    assert program.target == "TPU_VERSION_VIPERFISH lite"


# --- collectives and async pairs ------------------------------------------------------------

def test_v5e_async_collective_fusions():
    program = _program("v5e_mlp_train")
    start = program.instruction("async-collective-start")
    assert (start.async_role, start.collective_family, start.fusion_kind) == ("start", "all-gather", "kCustom")
    done = program.instruction("async-collective-done")
    assert (done.async_role, done.collective_family) == ("done", "all-gather")
    continuation = program.instruction("fusion.47")
    assert continuation.is_continuation and continuation.collective_family == ""
    assert program.instruction("fusion").collective_family == "reduce-scatter"  # calls=%all-reduce-scatter
    pairs = {p.start: p for p in program.async_pairs}
    pair = pairs["async-collective-start"]
    assert (pair.done, pair.kind, pair.family) == ("async-collective-done", "collective", "all-gather")
    assert "fusion.47" in pair.scheduled_between and not pair.adjacent
    assert pairs["copy-start.1"].done == "copy-done.1" and pairs["copy-start.1"].kind == "copy"


def test_v6e_collectives_are_synchronous():
    program = _program("v6e_mlp_train")
    entry = program.computation_instructions(program.entry)
    gathers = [i for i in entry if i.opcode == "all-gather"]
    assert len(gathers) == 3 and all(i.async_role == "" for i in gathers)
    assert {p.kind for p in program.async_pairs} == {"copy"}
    assert program.instruction("fusion").collective_family == "reduce-scatter"


def test_tpu7x_sparsecore_offloads():
    program = _program("tpu7x_mlp_train")
    pairs = [p for p in program.async_pairs if p.kind == "collective"]
    assert sorted(p.family for p in pairs) == ["all-gather", "all-gather", "reduce-scatter", "reduce-scatter"]
    assert all(p.thread == "sparsecore" and p.start.endswith("call-start") for p in pairs)
    assert all(p.done == p.start.replace("call-start", "call-done") for p in pairs)
    starts = [program.instruction(p.start) for p in pairs]
    assert {(s.opcode, s.wrapped_opcode) for s in starts} == {("async-start", "call")}
    prepare = program.instruction("prepare_start_all-gather.7.cloned.1.call-start")
    assert prepare.opcode == "custom-call" and prepare.async_role == "" and prepare.collective_family == ""


def test_adjacent_start_and_done():
    """A near miss: bitcasts and get-tuple-elements between start and done do not count as work."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  %cs = (f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%p)
  %b = f32[8,128]{1,0:T(8,128)} bitcast(%p)
  %cd = f32[8,128]{1,0:T(8,128)S(1)} copy-done(%cs)
  %ags = (f32[8,128]{1,0:T(8,128)}, f32[16,128]{1,0:T(8,128)}) all-gather-start(%cd), dimensions={0}
  %e = f32[8,128]{1,0:T(8,128)} exponential(%b)
  %agd = f32[16,128]{1,0:T(8,128)} all-gather-done(%ags)
  ROOT %r = f32[8,128]{1,0:T(8,128)} slice(%agd), slice={[0:8], [0:128]}
}
"""
    program = parse_hlo_text(text)
    pairs = {p.start: p for p in program.async_pairs}
    assert pairs["cs"].adjacent and pairs["cs"].kind == "copy"
    assert pairs["ags"].scheduled_between == ("e",) and pairs["ags"].family == "all-gather"


# --- per-instruction bytes ----------------------------------------------------------------

@pytest.mark.parametrize("name", MLP_FIXTURES)
def test_instruction_bytes_table(name):
    program = _program(name)
    table = instruction_bytes(program)
    INSTRUCTION_BYTES.require(table)
    assert len(table) == len(program.instructions)
    assert (table.logical_bytes == table.result_logical_bytes + table.operand_logical_bytes).all()
    assert (table.padded_bytes >= table.logical_bytes).all()
    row = table[(table.computation == program.entry) & (table.name == "fusion")].iloc[0]
    fusion = program.instruction("fusion")
    operand = program.instruction(fusion.operands[0])
    assert row.result_padded_bytes == fusion.padded_bytes
    assert row.operand_padded_bytes == sum(program.instruction(o).padded_bytes for o in fusion.operands)
    assert operand.padded_bytes > 0


def test_padding_shows_in_instruction_bytes():
    table = instruction_bytes(_program("v5e_odd_params"))
    row = table[table.name == "xs_5_.1"].iloc[0]  # bf16[3,5,7]{2,0,1:T(4,128)(2,1)}
    assert (row.result_logical_bytes, row.result_padded_bytes) == (210, 5_120)
    assert row.memory_spaces == "hbm"
    assert not table[~table.opcode.isin(list(FREE_OPCODES))].empty


# --- damaged and partial input ----------------------------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_hlo_dump(tmp_path / "nope")


def test_directory_without_dumps_has_a_hint(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError) as info:
        load_hlo_dump(tmp_path)
    assert info.value.hint and "--xla_dump_to" in info.value.hint
    assert str(tmp_path) in info.value.one_line()


@pytest.mark.parametrize(("content", "match"), [
    (b"", "no `HloModule` line"),
    (b"\x00\x01\x02binary", "binary"),
    (b"just some text\n", "no `HloModule` line"),
    (b"HloModule m\n\n", "no complete HLO computation"),
])
def test_unreadable_hlo_files_name_the_file(tmp_path, content, match):
    path = tmp_path / "module_0000.m.after_optimizations.txt"
    path.write_bytes(content)
    with pytest.raises(InputError, match=match) as info:
        load_hlo_dump(tmp_path)
    assert info.value.path == str(path)


def test_truncated_module_keeps_what_is_complete_and_warns(tmp_path):
    text = _text("v5e_mlp_train")
    cut = text[: text.index("%fusion.8 = ")]
    path = tmp_path / "module_0000.jit_step.after_optimizations.txt"
    path.write_text(cut)
    program = load_hlo_dump(tmp_path).programs[0]
    assert any("cut off" in w for w in program.warnings)
    assert program.entry == "main.0_spmd" and "fusion.8" not in program.schedule
    assert all(str(path) in w for w in program.warnings)


def test_unparseable_instruction_line_is_skipped_with_a_warning():
    text = _text("v6e_mlp_train").replace("bf16[1024,512]{1,0:T(8,128)(2,1)} parameter(2)",
                                          "bf16[1024,512]{1,0:T(8,128)(2,1)} ", 1)
    program = parse_hlo_text(text, "damaged.txt")
    assert any("line " in w and "skipped" in w for w in program.warnings)


def test_damaged_side_files_become_warnings(tmp_path):
    source = DUMPS / "v5e_mlp_train"
    for path in source.iterdir():
        shutil.copy(path, tmp_path / path.name)
    next(tmp_path.glob("*-buffer-assignment.txt")).write_text("garbage\n")
    next(tmp_path.glob("*-memory-usage-report.txt")).write_bytes(b"\xff\xfe nonsense")
    program = load_hlo_dump(tmp_path).programs[0]
    assert program.allocations == () and program.memory_spaces == ()
    assert sum("ignored" in w for w in program.warnings) == 2


def test_one_damaged_module_among_good_ones_is_a_dump_warning(tmp_path):
    for path in (DUMPS / "v6e_mlp_train").iterdir():
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "module_0009.broken.after_optimizations.txt").write_text("not hlo")
    dump = load_hlo_dump(tmp_path)
    assert len(dump.programs) == 1 and len(dump.warnings) == 1 and "module_0009" in dump.warnings[0]


_V6E = None


def _v6e_text() -> str:
    global _V6E
    if _V6E is None:
        _V6E = _text("v6e_mlp_train")
    return _V6E


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(min_value=0.0, max_value=1.0))
def test_truncated_dump_text_gives_a_program_or_input_error(fraction):
    text = _v6e_text()
    cut = text[: int(len(text) * fraction)]
    try:
        program = parse_hlo_text(cut, "cut.txt")
    except InputError as exc:
        assert exc.path == "cut.txt"
        return
    assert program.instructions


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_random_text_gives_a_program_or_input_error(noise):
    for text in (noise, "HloModule m\n\nENTRY %e () -> f32[] {\n" + noise):
        try:
            parse_hlo_text(text, "noise.txt")
        except InputError:
            pass


@settings(max_examples=bounded_examples(150, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=1.0), st.sampled_from(list("{}()[]%=,\" \n:"))),
                min_size=1, max_size=8))
def test_edited_dump_text_gives_a_program_or_input_error(edits):
    """Real text with brackets, quotes and newlines dropped in at random places."""
    text = _v6e_text()
    for fraction, ch in edits:
        at = int(len(text) * fraction)
        text = text[:at] + ch + text[at + 1:]
    try:
        program = parse_hlo_text(text, "edited.txt")
    except InputError:
        return
    instruction_bytes(program)  # derived tables survive whatever was kept


def test_older_text_forms_and_sync_all_reduce(tmp_path):
    """`source_file=`/`source_line=` metadata, typed operands, a quoted backend_config, sync all-reduce."""
    text = """HloModule old, is_scheduled=true

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0), metadata={op_name="p[\\'w1\\']" source_file="/src/model.py" source_line=42}
  %ar = f32[8,128]{1,0:T(8,128)} all-reduce(f32[8,128]{1,0:T(8,128)} %p), replica_groups={{0,1},{2,3}}, to_apply=%sum, backend_config="{\\"window_config\\":{\\"estimated_cycles\\":\\"12\\"}}"
  ROOT %cp = f32[8,128]{1,0:T(8,128)} collective-permute(%ar), source_target_pairs={{0,1},{1,0}}
}
"""
    path = tmp_path / "old.hlo.txt"
    path.write_text(text)
    program = load_hlo_dump(path).programs[0]  # a single file is accepted too
    assert (program.instruction("p").source_file, program.instruction("p").source_line) == ("/src/model.py", 42)
    assert program.instruction("p").op_name == "p['w1']"  # XLA escapes quotes C-style: `\'`
    ar = program.instruction("ar")
    assert ar.operands == ("p",) and ar.called_computations == ("sum",)
    assert (ar.collective_family, ar.async_role) == ("all-reduce", "")
    assert (ar.estimated_cycles, ar.cycles_source) == (12, "window_config")
    assert program.instruction("cp").collective_family == "collective-permute"
    assert program.instruction("add", "sum").operands == ("a", "b")
    assert program.async_pairs == ()


def test_async_sugar_is_read_as_async_start_wrapping_the_op():
    """v5e prefetches slices of a big parameter as `slice-start`/`slice-done` (seen in a
    transformer-block train step): printer sugar for async-start/-done wrapping `slice`, which is
    how the proto of the same module states it."""
    text = """HloModule m, is_scheduled=true

ENTRY %main (p: bf16[4,512,1024]) -> bf16[1,512,1024] {
  %p = bf16[4,512,1024]{2,1,0:T(8,128)(2,1)} parameter(0)
  %slice-start = ((bf16[4,512,1024]{2,1,0:T(8,128)(2,1)}), bf16[1,512,1024]{2,1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%p), slice={[0:1], [0:512], [0:1024]}
  ROOT %slice-done = bf16[1,512,1024]{2,1,0:T(8,128)(2,1)S(1)} slice-done(%slice-start)
}
"""
    program = parse_hlo_text(text)
    start, done = program.instruction("slice-start"), program.instruction("slice-done")
    assert (start.opcode, start.wrapped_opcode, start.async_role) == ("async-start", "slice", "start")
    assert (done.opcode, done.wrapped_opcode, done.async_role) == ("async-done", "slice", "done")
    (pair,) = program.async_pairs
    assert (pair.kind, pair.family, pair.adjacent) == ("slice", "", True)


def test_unpaired_async_ops_and_duplicate_names_warn():
    text = """HloModule m, is_scheduled=true

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0:T(256)} parameter(0)
  %cs = (f32[8]{0:T(256)S(1)}, f32[8]{0:T(256)}, u32[]{:S(2)}) copy-start(%p)
  %p = f32[8]{0:T(256)} parameter(0)
  ROOT %cd = f32[8]{0:T(256)S(1)} copy-done(%p)
}
"""
    program = parse_hlo_text(text, "pairs.txt")
    assert program.async_pairs == ()
    assert any("second instruction named `p`" in w for w in program.warnings)
    assert any("`cd`" in w and "no start" in w for w in program.warnings)
    assert any("`cs`" in w and "no done" in w for w in program.warnings)
    assert all(w.startswith("`pairs.txt`") for w in program.warnings)


@pytest.mark.parametrize("tag", ["cpu_", "sm_9.0_gpu_"])
def test_cpu_and_gpu_compilers_dump_names_are_read_with_their_side_files(tmp_path, tag):
    # XLA's CPU compiler writes `<module>.cpu_after_optimizations.txt` and `…cpu_after_optimizations-
    # buffer-assignment.txt`, its GPU compiler `…sm_9.0_gpu_after_optimizations…`: the same files as a
    # TPU dump under another stage tag. The v5e dump renamed so must read exactly as the original.
    source = DUMPS / "v5e_mlp_train"
    for path in source.iterdir():
        shutil.copy(path, tmp_path / path.name.replace(".after_optimizations", f".{tag}after_optimizations"))
    (renamed,) = load_hlo_dump(tmp_path).programs
    original = _program("v5e_mlp_train")
    assert renamed.allocations == original.allocations and renamed.allocations
    assert renamed.memory_spaces == original.memory_spaces and renamed.total_bytes_used == original.total_bytes_used
    assert renamed.target == original.target  # `<module>.target_arguments.txt` carries no tag
