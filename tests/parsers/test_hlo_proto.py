"""Serialized HloModuleProto / HloProto -> CompiledProgram, checked against the same module's text.

`module.pb` in the fixtures is `runtime_executable().hlo_modules()[0]
.as_serialized_hlo_module_proto()` and `compiled_as_text.hlo.txt` is `c.as_text()` of the same
executable (see `tests/fixtures/dumps/make_fixtures.py`): decoding the proto with the project's
own schema and getting the text's program back, field for field, is what verifies the field
numbers in `tpudiag/proto/schema.py`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpudiag.errors import InputError
from tpudiag.model.inputs import CAPTURE_ORIGIN
from tpudiag.parsers.hlo_proto import capture_hlo_inputs, parse_hlo_proto
from tpudiag.parsers.hlo_text import load_hlo_dump, load_hlo_text, parse_hlo_text
from tpudiag.proto import HloModuleProto, HloProto
from tpudiag.proto.schema import PRIMITIVE_TYPE_NAMES

DUMPS = Path(__file__).resolve().parents[1] / "fixtures" / "dumps"
WITH_PROTO = ("v5e_mlp_train", "v6e_mlp_train", "v5e_dot_profiled")


def _proto_bytes(name: str) -> bytes:
    return (DUMPS / name / "module.pb").read_bytes()


@pytest.mark.parametrize("name", WITH_PROTO)
def test_proto_gives_the_same_program_as_the_text_of_the_same_executable(name):
    text = load_hlo_text(DUMPS / name / "compiled_as_text.hlo.txt")
    proto = parse_hlo_proto(_proto_bytes(name), program_id=7)
    assert proto.source == "hlo_proto" and proto.program_id == 7
    _assert_same_program(text, proto)


def _assert_same_program(text, proto) -> None:
    """Field for field, except what sugared text leaves out.

    `c.as_text()` prints an async op whose wrapped computation is one instruction as
    `call-start`/`slice-start` with the wrapped op's own attributes (`to_apply=` of the call) and
    omits the wrapped computation; the proto keeps it. So the proto may hold extra computations,
    each wrapped by an async-start that the text printed sugared.
    """
    assert proto.warnings == []
    assert (proto.module, proto.entry, proto.is_scheduled) == (text.module, text.entry, text.is_scheduled)
    sugared = {key for key, inst in text.instructions.items()
               if inst.opcode == "async-start" and inst.wrapped_opcode
               and not set(proto.instructions[key].called_computations) <= set(text.computations)}
    wrapped = {c for key in sugared for c in proto.instructions[key].called_computations}
    assert set(proto.computations) - set(text.computations) == wrapped
    for key in sugared:  # the text names what the wrapped op calls
        (comp,) = proto.instructions[key].called_computations
        root = proto.instruction(proto.computations[comp].root, comp)
        assert text.instructions[key].called_computations == root.called_computations
    assert set(proto.instructions) == set(text.instructions) | {
        k for k in proto.instructions if k[0] in wrapped}
    for key, expected in text.instructions.items():
        got = proto.instructions[key]
        for f in dataclasses.fields(expected):
            if f.name == "called_computations" and key in sugared:
                continue
            if f.name == "attributes":  # printed attributes exist in text only (see Instruction)
                continue
            assert getattr(got, f.name) == getattr(expected, f.name), (key, f.name)
    assert proto.schedule == text.schedule  # from HloModuleProto.schedule, not instruction order
    assert proto.async_pairs == text.async_pairs


def test_proto_carries_cycle_estimates_the_xla_dump_file_lacks():
    """The runtime proto is the final module: backend configs include the cost annotations."""
    proto = parse_hlo_proto(_proto_bytes("v5e_dot_profiled"))
    assert (proto.instruction("fusion").estimated_cycles, proto.instruction("fusion").cycles_source) == (
        138_056, "bundle_analysis_data")
    dumped = load_hlo_dump(DUMPS / "v5e_dot_profiled").programs[0]
    assert dumped.instruction("fusion").estimated_cycles is None


def test_proto_metadata_resolves_stack_frames():
    proto = parse_hlo_proto(_proto_bytes("v5e_mlp_train"))
    located = [i for i in proto.instructions.values() if i.source_file]
    assert located and all(i.source_file.endswith("make_fixtures.py") and i.source_line > 0 for i in located)


def test_hlo_proto_wrapper_reads_like_the_bare_module():
    """A capture embeds `xla.HloProto` (module in field 1); compile gives the bare HloModuleProto."""
    module = HloModuleProto()
    module.ParseFromString(_proto_bytes("v6e_mlp_train"))
    wrapped = HloProto(hlo_module=module).SerializeToString()
    a = parse_hlo_proto(wrapped)
    b = parse_hlo_proto(_proto_bytes("v6e_mlp_train"))
    assert a.instructions == b.instructions and a.schedule == b.schedule


def test_capture_protos_by_program_id_parsed_once_across_hosts():
    # Two hosts of one SPMD run embed program 11 alike; the second also embeds program 12.
    hosts = [SimpleNamespace(path="a.xplane.pb", warnings=[], hlo_protos={11: _proto_bytes("v5e_mlp_train")}),
             SimpleNamespace(path="b.xplane.pb", warnings=[], hlo_protos={11: _proto_bytes("v5e_mlp_train"),
                                                                          12: _proto_bytes("v6e_mlp_train")})]
    inputs = capture_hlo_inputs(SimpleNamespace(hosts=hosts))
    programs = {i.program.program_id: i.program for i in inputs}
    assert sorted(programs) == [11, 12] and len(inputs) == 2
    assert programs[11].path == "a.xplane.pb program 11" and programs[12].path == "b.xplane.pb program 12"
    assert {i.origin for i in inputs} == {CAPTURE_ORIGIN}


def test_schema_field_numbers_match_openxla():
    """Regression guard: numbers as in openxla/xla hlo.proto and xla_data.proto."""
    expected = {
        "HloModuleProto": {"name": 1, "entry_computation_name": 2, "computations": 3, "id": 5,
                           "entry_computation_id": 6, "schedule": 7, "stack_frame_index": 17},
        "HloComputationProto": {"name": 1, "instructions": 2, "id": 5, "root_id": 6, "execution_thread": 8},
        "HloInstructionProto": {"name": 1, "opcode": 2, "shape": 3, "metadata": 7, "parameter_number": 9,
                                "fusion_kind": 11, "custom_call_target": 28, "id": 35, "operand_ids": 36,
                                "called_computation_ids": 38, "backend_config": 43, "frontend_attributes": 68,
                                "async_execution_thread": 79},
        "ShapeProto": {"element_type": 2, "dimensions": 3, "tuple_shapes": 4, "layout": 5},
        "LayoutProto": {"minor_to_major": 1, "tiles": 6, "element_size_in_bits": 7, "memory_space": 8},
        "OpMetadata": {"op_name": 2, "source_file": 3, "source_line": 4, "stack_frame_id": 15},
    }
    pool = HloModuleProto.DESCRIPTOR.file.pool
    for message, fields in expected.items():
        descriptor = pool.FindMessageTypeByName(f"xla.{message}")
        for field, number in fields.items():
            assert descriptor.fields_by_name[field].number == number, (message, field)
    assert (PRIMITIVE_TYPE_NAMES[16], PRIMITIVE_TYPE_NAMES[11], PRIMITIVE_TYPE_NAMES[20]) == ("bf16", "f32", "f8e4m3fn")


@pytest.mark.parametrize(("data", "match"), [
    (b"", "empty"),
    (b"\x0a\x03abc", "no computations"),  # a module with a name and nothing else
    (b"\xff\xff\xff\xff", "corrupt"),
])
def test_bad_protos_raise_input_error(data, match):
    with pytest.raises(InputError, match=match) as info:
        parse_hlo_proto(data, "capture.xplane.pb program 3")
    assert info.value.path == "capture.xplane.pb program 3"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=47_000))
def test_truncated_proto_gives_a_program_or_input_error(cut):
    data = _proto_bytes("v6e_mlp_train")
    try:
        program = parse_hlo_proto(data[: cut % len(data)])
    except InputError:
        return
    assert program.instructions


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_give_a_program_or_input_error(data):
    try:
        parse_hlo_proto(data)
    except InputError:
        pass


@pytest.mark.libtpu
@pytest.mark.parametrize("topology", ("v5e:2x2", "v6e:2x2", "TPU7x:2x2x1"))
def test_live_proto_matches_the_text_of_the_same_executable(topology):
    """Recompile the MLP step with the installed libtpu: the schema still decodes what it emits.

    Fails (never skips) without jax and libtpu, which CI installs with the `tpu` extra.
    """
    try:
        import jax  # noqa: F401
        import libtpu  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"this test needs jax with libtpu (pip install -e '.[tpu]'): {exc}")
    proc = subprocess.run([sys.executable, str(DUMPS / "make_fixtures.py"), "--probe", topology, "mlp_train"],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"probe for {topology} failed:\n{proc.stderr[-3000:]}"
    facts = json.loads(proc.stdout)
    text = parse_hlo_text(facts["as_text"], f"{topology} as_text")
    proto = parse_hlo_proto(base64.b64decode(facts["module_pb_b64"]), f"{topology} proto")
    _assert_same_program(text, proto)
    params = proto.entry_parameters()
    assert sum(p.padded_bytes for p in params) == facts["memory_analysis"]["argument_size_in_bytes"]
