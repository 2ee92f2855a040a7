"""Field tables for the protobuf messages tpudiag reads, turned into message classes.

Field numbers follow openxla/xla `xla/tsl/profiler/protobuf/xplane.proto` (XSpace),
openxla/xprof `plugin/xprof/protobuf/op_metrics.proto` and `op_stats.proto` (the payloads
embedded in stats) and openxla/xla `xla/service/hlo.proto` (the subset of HloProto needed for
layouts); see `shared/reference/xprof-trace-format.md`.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: str  # a scalar type name, or a message name declared in the same file
    repeated: bool = False
    oneof: str | None = None


@dataclass(frozen=True)
class Message:
    name: str
    fields: tuple[Field, ...]
    map_entries: tuple[tuple[str, int, str, str], ...] = ()  # (field, number, key kind, value message)


_SCALARS = {
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32,
    "uint32": _F.TYPE_UINT32,
    "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "bool": _F.TYPE_BOOL,
}


def _field_proto(package: str, f: Field, oneofs: list[str]) -> descriptor_pb2.FieldDescriptorProto:
    fp = _F(name=f.name, number=f.number)
    fp.label = _F.LABEL_REPEATED if f.repeated else _F.LABEL_OPTIONAL
    if f.kind in _SCALARS:
        fp.type = _SCALARS[f.kind]
    else:
        fp.type = _F.TYPE_MESSAGE
        fp.type_name = f".{package}.{f.kind}"
    if f.oneof is not None:
        if f.oneof not in oneofs:
            oneofs.append(f.oneof)
        fp.oneof_index = oneofs.index(f.oneof)
    return fp


def _build(package: str, filename: str, messages: tuple[Message, ...]) -> dict[str, type]:
    fdp = descriptor_pb2.FileDescriptorProto(name=filename, package=package, syntax="proto3")
    for msg in messages:
        mp = fdp.message_type.add(name=msg.name)
        oneofs: list[str] = []
        for f in msg.fields:
            mp.field.append(_field_proto(package, f, oneofs))
        for name in oneofs:
            mp.oneof_decl.add(name=name)
        for field_name, number, key_kind, value_msg in msg.map_entries:
            entry_name = "".join(p.capitalize() for p in field_name.split("_")) + "Entry"
            entry = mp.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            entry.field.append(_F(name="key", number=1, type=_SCALARS[key_kind], label=_F.LABEL_OPTIONAL))
            entry.field.append(
                _F(name="value", number=2, type=_F.TYPE_MESSAGE, type_name=f".{package}.{value_msg}",
                   label=_F.LABEL_OPTIONAL)
            )
            mp.field.append(
                _F(name=field_name, number=number, type=_F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
                   type_name=f".{package}.{msg.name}.{entry_name}")
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{m.name}"))
            for m in messages}


_STAT_VALUE = "value"

def _xplane_message(name: str, lines: str) -> Message:
    """XPlane, its lines of message type or kind `lines`."""
    return Message(name, (
        Field("id", 1, "int64"),
        Field("name", 2, "string"),
        Field("lines", 3, lines, repeated=True),
        Field("stats", 6, "XStat", repeated=True),
    ), map_entries=(
        ("event_metadata", 4, "int64", "XEventMetadata"),
        ("stat_metadata", 5, "int64", "XStatMetadata"),
    ))


_XPLANE_MESSAGES = (
    Message("XSpace", (
        Field("planes", 1, "XPlane", repeated=True),
        Field("errors", 2, "string", repeated=True),
        Field("warnings", 3, "string", repeated=True),
        Field("hostnames", 4, "string", repeated=True),
    )),
    _xplane_message("XPlane", "XLine"),
    # An XPlane whose lines stay serialized (`parsers.event_wire.RawLine`), so their events can be
    # decoded from the wire (`parsers.event_wire`) instead of as one object each.
    _xplane_message("XPlaneRawLines", "bytes"),
    Message("XLine", (
        Field("id", 1, "int64"),
        Field("display_id", 10, "int64"),
        Field("name", 2, "string"),
        Field("display_name", 11, "string"),
        Field("timestamp_ns", 3, "int64"),
        Field("duration_ps", 9, "int64"),
        Field("events", 4, "XEvent", repeated=True),
    )),
    Message("XEvent", (
        Field("metadata_id", 1, "int64"),
        Field("offset_ps", 2, "int64", oneof="data"),
        Field("num_occurrences", 5, "int64", oneof="data"),
        Field("duration_ps", 3, "int64"),
        Field("stats", 4, "XStat", repeated=True),
    )),
    Message("XStat", (
        Field("metadata_id", 1, "int64"),
        Field("double_value", 2, "double", oneof=_STAT_VALUE),
        Field("uint64_value", 3, "uint64", oneof=_STAT_VALUE),
        Field("int64_value", 4, "int64", oneof=_STAT_VALUE),
        Field("str_value", 5, "string", oneof=_STAT_VALUE),
        Field("bytes_value", 6, "bytes", oneof=_STAT_VALUE),
        Field("ref_value", 7, "uint64", oneof=_STAT_VALUE),
        Field("compressed_str_value", 8, "bytes", oneof=_STAT_VALUE),
    )),
    Message("XEventMetadata", (
        Field("id", 1, "int64"),
        Field("name", 2, "string"),
        Field("display_name", 4, "string"),
        Field("metadata", 3, "bytes"),
        Field("stats", 5, "XStat", repeated=True),
        Field("child_id", 6, "int64", repeated=True),
    )),
    Message("XStatMetadata", (
        Field("id", 1, "int64"),
        Field("name", 2, "string"),
        Field("description", 3, "string"),
    )),
)

_PROFILER_PAYLOADS = (
    Message("MemoryAccessed", (
        Field("operation_type", 1, "int32"),  # 0 unknown, 1 read, 2 write
        Field("memory_space", 2, "uint64"),  # 1 HBM, 2 CMEM, 3 VMEM (0 unknown)
        Field("bytes_accessed", 3, "uint64"),
    )),
    Message("MemoryAccessBreakdown", (
        Field("memory_accessed", 1, "MemoryAccessed", repeated=True),
    )),
    Message("CoreDetails", (
        Field("hostname", 1, "string"),
        Field("device_ordinal", 2, "uint32"),
        Field("core_num", 3, "uint32"),
        Field("local_chip_id", 4, "uint32"),
        Field("global_chip_id", 5, "uint32"),
        Field("global_core_id", 6, "uint32"),
        Field("is_sparse_core", 7, "bool"),
    )),
)

# The subset of xla.HloProto needed to recover instruction names, opcodes, shapes with layouts,
# metadata, the schedule and the buffer assignment from the protos a capture embeds on `/host:metadata`. Field numbers
# checked against openxla/xla `xla/service/hlo.proto` and `xla/xla_data.proto` and by decoding a
# real optimised module (`tests/fixtures/dumps/*/module.pb`). Proto maps are declared as their
# wire form, a repeated entry message with key = 1 and value = 2. Enums are read as int32.
_HLO_MESSAGES = (
    Message("HloProto", (
        Field("hlo_module", 1, "HloModuleProto"),
        Field("buffer_assignment", 3, "BufferAssignmentProto"),
    )),
    # The buffer assignment a capture embeds beside the module (what XProf's memory viewer reads).
    Message("BufferAssignmentProto", (
        Field("logical_buffers", 1, "LogicalBufferProto", repeated=True),
        Field("buffer_allocations", 3, "BufferAllocationProto", repeated=True),
        Field("heap_simulator_traces", 4, "HeapSimulatorTrace", repeated=True),
    )),
    Message("HeapSimulatorTrace", (
        Field("events", 1, "HeapSimulatorEvent", repeated=True),
        Field("whole_module_simulation", 2, "bool"),
        Field("buffer_allocation_index", 3, "int64"),
    )),
    Message("HeapSimulatorEvent", (
        Field("kind", 1, "int32"),  # 0 ALLOC, 1 FREE, 2 SHARE_WITH
        Field("buffer_id", 2, "int64"),
        Field("computation_name", 3, "string"),
        Field("instruction_name", 4, "string"),
        Field("share_with_canonical_id", 5, "int64"),
    )),
    Message("LogicalBufferProto", (
        Field("id", 1, "int64"),
        Field("size", 2, "int64"),
        Field("defined_at", 3, "LogicalBufferLocation"),
        Field("color", 4, "int64"),
    )),
    Message("LogicalBufferLocation", (
        Field("instruction_name", 2, "string"),  # deprecated upstream; instruction_id is the key
        Field("shape_index", 3, "int64", repeated=True),
        Field("instruction_id", 4, "int64"),
    )),
    Message("BufferAllocationProto", (
        Field("index", 1, "int64"),
        Field("size", 2, "int64"),
        Field("is_thread_local", 3, "bool"),
        Field("is_entry_computation_parameter", 5, "bool"),
        Field("parameter_number", 6, "int64"),
        Field("maybe_live_out", 7, "bool"),
        Field("color", 8, "int64"),
        Field("assigned", 9, "BufferAllocationAssigned", repeated=True),
        Field("is_tuple", 11, "bool"),
        Field("is_constant", 12, "bool"),
    )),
    Message("BufferAllocationAssigned", (
        Field("logical_buffer_id", 1, "int64"),
        Field("offset", 2, "int64"),
        Field("size", 3, "int64"),
    )),
    Message("HloModuleProto", (
        Field("name", 1, "string"),
        Field("entry_computation_name", 2, "string"),
        Field("computations", 3, "HloComputationProto", repeated=True),
        Field("id", 5, "int64"),
        Field("entry_computation_id", 6, "int64"),
        Field("schedule", 7, "HloScheduleProto"),
        Field("stack_frame_index", 17, "StackFrameIndexProto"),
    )),
    Message("HloScheduleProto", (
        Field("sequences", 1, "HloScheduleSequencesEntry", repeated=True),  # map<int64, InstructionSequence>
    )),
    Message("HloScheduleSequencesEntry", (
        Field("key", 1, "int64"),  # computation id
        Field("value", 2, "HloInstructionSequence"),
    )),
    Message("HloInstructionSequence", (
        Field("instruction_ids", 1, "int64", repeated=True),
    )),
    Message("StackFrameIndexProto", (
        Field("file_names", 1, "string", repeated=True),
        Field("function_names", 2, "string", repeated=True),
        Field("file_locations", 3, "StackFrameFileLocation", repeated=True),
        Field("stack_frames", 4, "StackFrameFrame", repeated=True),
    )),
    Message("StackFrameFileLocation", (  # ids are 1-based positions in the flat arrays above
        Field("file_name_id", 1, "int32"),
        Field("function_name_id", 2, "int32"),
        Field("line", 3, "int32"),
        Field("column", 4, "int32"),
    )),
    Message("StackFrameFrame", (
        Field("file_location_id", 1, "int32"),
        Field("parent_frame_id", 2, "int32"),
    )),
    Message("HloComputationProto", (
        Field("name", 1, "string"),
        Field("instructions", 2, "HloInstructionProto", repeated=True),
        Field("id", 5, "int64"),
        Field("root_id", 6, "int64"),
        Field("is_fusion_computation", 7, "bool"),
        Field("execution_thread", 8, "string"),
    )),
    Message("HloInstructionProto", (
        Field("name", 1, "string"),
        Field("opcode", 2, "string"),
        Field("shape", 3, "ShapeProto"),
        Field("metadata", 7, "OpMetadata"),
        Field("parameter_number", 9, "int64"),
        Field("fusion_kind", 11, "string"),
        Field("tuple_index", 13, "int64"),
        Field("window", 15, "Window"),
        Field("convolution_dimension_numbers", 16, "ConvolutionDimensionNumbers"),
        Field("channel_id", 26, "int64"),
        Field("dot_dimension_numbers", 30, "DotDimensionNumbers"),
        Field("custom_call_target", 28, "string"),
        Field("id", 35, "int64"),
        Field("operand_ids", 36, "int64", repeated=True),
        Field("called_computation_ids", 38, "int64", repeated=True),
        Field("backend_config", 43, "bytes"),
        Field("frontend_attributes", 68, "FrontendAttributes"),
        Field("feature_group_count", 50, "int64"),
        Field("batch_group_count", 58, "int64"),
        Field("async_execution_thread", 79, "string"),
    )),
    # xla/xla_data.proto: what a matmul's dims are (tpudiag.model.matmuls reads them).
    Message("Window", (
        Field("dimensions", 1, "WindowDimension", repeated=True),
    )),
    Message("WindowDimension", (
        Field("size", 1, "int64"),
        Field("stride", 2, "int64"),
        Field("padding_low", 3, "int64"),
        Field("padding_high", 4, "int64"),
        Field("window_dilation", 5, "int64"),
        Field("base_dilation", 6, "int64"),
    )),
    Message("ConvolutionDimensionNumbers", (
        Field("kernel_input_feature_dimension", 3, "int64"),
        Field("kernel_output_feature_dimension", 4, "int64"),
        Field("kernel_spatial_dimensions", 6, "int64", repeated=True),
        Field("input_batch_dimension", 7, "int64"),
        Field("input_feature_dimension", 8, "int64"),
        Field("output_batch_dimension", 9, "int64"),
        Field("output_feature_dimension", 10, "int64"),
        Field("input_spatial_dimensions", 11, "int64", repeated=True),
        Field("output_spatial_dimensions", 12, "int64", repeated=True),
    )),
    Message("DotDimensionNumbers", (
        Field("lhs_contracting_dimensions", 1, "int64", repeated=True),
        Field("rhs_contracting_dimensions", 2, "int64", repeated=True),
        Field("lhs_batch_dimensions", 3, "int64", repeated=True),
        Field("rhs_batch_dimensions", 4, "int64", repeated=True),
    )),
    Message("FrontendAttributes", (
        Field("map", 1, "FrontendAttributesMapEntry", repeated=True),  # map<string, string>
    )),
    Message("FrontendAttributesMapEntry", (
        Field("key", 1, "string"),
        Field("value", 2, "string"),
    )),
    Message("ShapeProto", (
        Field("element_type", 2, "int32"),  # xla.PrimitiveType, see PRIMITIVE_TYPE_NAMES
        Field("dimensions", 3, "int64", repeated=True),
        Field("tuple_shapes", 4, "ShapeProto", repeated=True),
        Field("layout", 5, "LayoutProto"),
        Field("is_dynamic_dimension", 6, "bool", repeated=True),
    )),
    Message("LayoutProto", (
        Field("minor_to_major", 1, "int64", repeated=True),
        Field("tiles", 6, "TileProto", repeated=True),
        Field("element_size_in_bits", 7, "int64"),
        Field("memory_space", 8, "int64"),
    )),
    Message("TileProto", (
        Field("dimensions", 1, "int64", repeated=True),
    )),
    Message("OpMetadata", (
        Field("op_type", 1, "string"),
        Field("op_name", 2, "string"),
        Field("source_file", 3, "string"),
        Field("source_line", 4, "int32"),
        Field("deduplicated_name", 12, "string"),
        Field("stack_frame_id", 15, "int32"),  # 1-based into HloModuleProto.stack_frame_index
        Field("scheduling_name", 16, "string"),
    )),
)

# pprof's profile format (google/pprof `proto/profile.proto`, package perftools.profiles), as
# `jax.profiler.save_device_memory_profile` writes it: samples of live device buffers, each with
# the Python stack that made it. Strings are indices into `string_table`; the leaf frame is
# `location_id[0]`. No maintained, light PyPI package ships these bindings (google-cloud-profiler
# carries them inside a cloud agent with a C++ build), so the schema is declared here like the
# others and read by the protobuf runtime.
_PPROF_MESSAGES = (
    Message("Profile", (
        Field("sample_type", 1, "ValueType", repeated=True),
        Field("sample", 2, "Sample", repeated=True),
        Field("mapping", 3, "Mapping", repeated=True),
        Field("location", 4, "Location", repeated=True),
        Field("function", 5, "Function", repeated=True),
        Field("string_table", 6, "string", repeated=True),
        Field("drop_frames", 7, "int64"),
        Field("keep_frames", 8, "int64"),
        Field("time_nanos", 9, "int64"),
        Field("duration_nanos", 10, "int64"),
        Field("period_type", 11, "ValueType"),
        Field("period", 12, "int64"),
        Field("comment", 13, "int64", repeated=True),
        Field("default_sample_type", 14, "int64"),
    )),
    Message("ValueType", (
        Field("type", 1, "int64"),
        Field("unit", 2, "int64"),
    )),
    Message("Sample", (
        Field("location_id", 1, "uint64", repeated=True),
        Field("value", 2, "int64", repeated=True),
        Field("label", 3, "Label", repeated=True),
    )),
    Message("Label", (
        Field("key", 1, "int64"),
        Field("str", 2, "int64"),
        Field("num", 3, "int64"),
        Field("num_unit", 4, "int64"),
    )),
    Message("Mapping", (
        Field("id", 1, "uint64"),
        Field("memory_start", 2, "uint64"),
        Field("memory_limit", 3, "uint64"),
        Field("file_offset", 4, "uint64"),
        Field("filename", 5, "int64"),
        Field("build_id", 6, "int64"),
    )),
    Message("Location", (
        Field("id", 1, "uint64"),
        Field("mapping_id", 2, "uint64"),
        Field("address", 3, "uint64"),
        Field("line", 4, "Line", repeated=True),  # inlined callees first, the caller last
        Field("is_folded", 5, "bool"),
    )),
    Message("Line", (
        Field("function_id", 1, "uint64"),
        Field("line", 2, "int64"),
    )),
    Message("Function", (
        Field("id", 1, "uint64"),
        Field("name", 2, "int64"),
        Field("system_name", 3, "int64"),
        Field("filename", 4, "int64"),
        Field("start_line", 5, "int64"),
    )),
)

# xla.PrimitiveType (xla/xla_data.proto) -> the element-type spelling HLO text uses.
PRIMITIVE_TYPE_NAMES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16", 17: "token",
    18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4", 23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2", 28: "f8e4m3", 29: "f8e3m4", 30: "s1",
    31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu", 34: "buffer",
}

_xplane = _build("tensorflow.profiler", "tpudiag/xplane.proto", _XPLANE_MESSAGES)
_payloads = _build("tensorflow.profiler.payloads", "tpudiag/profiler_payloads.proto", _PROFILER_PAYLOADS)
_hlo = _build("xla", "tpudiag/hlo_subset.proto", _HLO_MESSAGES)
_pprof = _build("perftools.profiles", "tpudiag/pprof_profile.proto", _PPROF_MESSAGES)

XSpace = _xplane["XSpace"]
XPlane = _xplane["XPlane"]
XLine = _xplane["XLine"]
XPlaneRawLines = _xplane["XPlaneRawLines"]
XEvent = _xplane["XEvent"]
XStat = _xplane["XStat"]
XEventMetadata = _xplane["XEventMetadata"]
XStatMetadata = _xplane["XStatMetadata"]
MemoryAccessBreakdown = _payloads["MemoryAccessBreakdown"]
CoreDetails = _payloads["CoreDetails"]
HloProto = _hlo["HloProto"]
HloModuleProto = _hlo["HloModuleProto"]
PprofProfile = _pprof["Profile"]

# Shadow schemas, wire-compatible with XSpace, for reading a big host file plane by plane: the
# planes stay raw bytes (handed whole to worker processes), and a plane's header can be read
# without expanding its events (they are kept as unknown fields, i.e. as bytes).
_SHADOW_MESSAGES = (
    Message("XSpaceRawPlanes", (
        Field("planes", 1, "bytes", repeated=True),
        Field("errors", 2, "string", repeated=True),  # declared so that their UTF-8 is checked as in XSpace
        Field("warnings", 3, "string", repeated=True),
        Field("hostnames", 4, "string", repeated=True),
    )),
    Message("XPlaneHead", (
        Field("id", 1, "int64"),
        Field("name", 2, "string"),
        Field("lines", 3, "XLineHead", repeated=True),
    )),
    Message("XLineHead", (  # an XLine without its events (4), which stay unknown bytes
        Field("id", 1, "int64"),
        Field("display_id", 10, "int64"),
        Field("name", 2, "string"),
        Field("display_name", 11, "string"),
        Field("timestamp_ns", 3, "int64"),
        Field("duration_ps", 9, "int64"),
    )),
)
_shadow = _build("tpudiag.shadow", "tpudiag/xplane_shadow.proto", _SHADOW_MESSAGES)
XSpaceRawPlanes = _shadow["XSpaceRawPlanes"]
XPlaneHead = _shadow["XPlaneHead"]
XLineHead = _shadow["XLineHead"]
