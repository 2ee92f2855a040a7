"""The small lookups of `model/` that only other packages' tests called: by name, by number, by key.

mutmut runs each package against its own tests (docs/testing.md, lane mut-notests); these functions
were reached by no test in `tests/model`, so their mutants had no verdict. Every expectation is
written by hand from the records built here.
"""

from __future__ import annotations

import pytest

from tpudiag.model.compiled import (
    ArrayShape,
    CompiledDump,
    CompiledProgram,
    Computation,
    Instruction,
    TupleShape,
    leaf_arrays,
    memory_space_name,
)
from tpudiag.model.findings import OpSite, Severity
from tpudiag.model.hardware import VmemBandwidth
from tpudiag.model.hlo_shapes import Shape
from tpudiag.model.llo import BundleDma, BundleUtilization, LloDump, RegisterPressure
from tpudiag.model.memory import OomError, OomPart


def _array(dims: tuple[int, ...]) -> ArrayShape:
    return ArrayShape("f32", dims, None, logical_bytes=4, padded_bytes=4)


def _inst(name: str, opcode: str, number: int | None = None, attributes=(), computation="main") -> Instruction:
    return Instruction(computation, name, opcode, "f32[]", None, (), (), "", "", "", "", 0, "", "", (), False, 0,
                       parameter_number=number, attributes=attributes)


def _program(module: str, entry: str = "main", instructions=()) -> CompiledProgram:
    comps = {entry: Computation(entry, True, tuple(i.name for i in instructions), "")}
    return CompiledProgram(module=module, path="", source="hlo_text", entry=entry, is_scheduled=True,
                           computations=comps, instructions={(entry, i.name): i for i in instructions})


def test_memory_spaces_by_number_and_an_unknown_one_as_written():
    assert [memory_space_name(n) for n in (0, 1, 2)] == ["hbm", "vmem", "smem"]
    assert memory_space_name(7) == "S(7)"  # no name for space 7: printed as the layout writes it


def test_leaf_arrays_flatten_nested_tuples_in_order():
    a, b, c = _array((1,)), _array((2,)), _array((3,))
    shape = TupleShape((a, TupleShape((b, TupleShape(()))), c))
    assert leaf_arrays(shape) == [a, b, c]
    assert leaf_arrays(a) == [a]


def test_a_dump_finds_the_last_program_of_a_module_and_raises_for_a_missing_one():
    first, other, last = _program("jit_f"), _program("jit_g"), _program("jit_f", entry="main.2")
    dump = CompiledDump("/d", [first, other, last])
    assert dump.program("jit_f") is last  # compiled twice: the later one
    assert dump.program("jit_g") is other
    with pytest.raises(KeyError) as info:
        dump.program("jit_h")
    assert info.value.args == ("jit_h",)


def test_entry_parameters_by_number_a_numberless_one_last():
    # Written in the order p1, add, p0, loose: the parameters sort 0, 1, then the one without a number.
    p1, add, p0, loose = _inst("p1", "parameter", 1), _inst("add", "add"), _inst("p0", "parameter", 0), \
        _inst("loose", "parameter")
    program = _program("m", instructions=(loose, p1, add, p0))
    assert [i.name for i in program.entry_parameters()] == ["p0", "p1", "loose"]


def test_an_instruction_by_name_in_the_entry_unless_a_computation_is_given():
    program = _program("m", instructions=(_inst("a", "add"),))
    inner = _inst("a", "multiply", computation="body")
    program.instructions[("body", "a")] = inner
    assert program.instruction("a").opcode == "add"
    assert program.instruction("a", "body") is inner


def test_attributes_print_as_key_value_pairs():
    inst = _inst("d", "dot", attributes=(("lhs_contracting_dims", "{1}"), ("rhs_contracting_dims", "{0}")))
    assert inst.attributes_text() == "lhs_contracting_dims={1}, rhs_contracting_dims={0}"


def test_an_op_site_label_skips_what_is_unknown():
    assert OpSite("dot.1", "train.py:12", "jit(step)/dot_general").label() == "train.py:12, jit(step)/dot_general"
    assert OpSite("dot.1", "", "jit(step)/dot_general").label() == "jit(step)/dot_general"


def test_severity_parse_ignores_case_and_names_the_choices():
    assert Severity.parse(" High ") is Severity.HIGH
    with pytest.raises(ValueError) as info:
        Severity.parse("urgent")
    assert str(info.value) == "unknown severity 'urgent'; expected one of info, low, medium, high"


def test_vmem_bandwidth_reads_once_when_both_directions_agree():
    def fmt(v):
        return f"{v / 1e12:g} TB/s"
    assert VmemBandwidth(18e12, 18e12, "approximate").describe(fmt) == "VMEM 18 TB/s (approximate)"
    assert VmemBandwidth(23e12, 16e12, "trace").describe(fmt) == "VMEM 23 TB/s read, 16 TB/s write (trace)"


def test_a_shape_prints_dtype_and_dims():
    assert str(Shape("bf16", (8, 128))) == "bf16[8,128]"


def test_an_llo_dump_finds_each_programs_summaries_by_name():
    util = (BundleUtilization("fusion.1", 10, ()), BundleUtilization("fusion.2", 20, ()))
    dma = (BundleDma("fusion.1", 10, 1, 1), BundleDma("fusion.2", 20, 2, 2))
    pressure = (RegisterPressure("fusion.1", "vregs", 40, ()), RegisterPressure("fusion.2", "vregs", 70, ()))
    dump = LloDump("/d", (), *([None] * 7), utilization=util, register_pressure=pressure, bundle_dma=dma)
    assert dump.utilization_for("fusion.2").bundles == 20
    assert dump.dma_for("fusion.2").issue_bundles == 2
    assert dump.register_pressure_for("fusion.2").pressure == 70
    assert dump.utilization_for("fusion.3") is None
    assert dump.dma_for("fusion.3") is None
    assert dump.register_pressure_for("fusion.3") is None


def test_an_oom_part_by_name_from_requirement_then_usage_then_persistent():
    oom = OomError("hbm", "hbm-temporaries", 17 << 30, 16 << 30, "m",
                   usage=(OomPart("reserved", 1), OomPart("arguments", 2)),
                   requirement=(OomPart("reserved", 3), OomPart("HLO temp", 4)),
                   persistent=(OomPart("output", 5),))
    assert oom.part("reserved").size_bytes == 3  # the requirement's comes first
    assert oom.part("arguments").size_bytes == 2
    assert oom.part("output").size_bytes == 5
    assert oom.part("scoped") is None
