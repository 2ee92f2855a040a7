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

_XPLANE_MESSAGES = (
    Message("XSpace", (
        Field("planes", 1, "XPlane", repeated=True),
        Field("errors", 2, "string", repeated=True),
        Field("warnings", 3, "string", repeated=True),
        Field("hostnames", 4, "string", repeated=True),
    )),
    Message("XPlane", (
        Field("id", 1, "int64"),
        Field("name", 2, "string"),
        Field("lines", 3, "XLine", repeated=True),
        Field("stats", 6, "XStat", repeated=True),
    ), map_entries=(
        ("event_metadata", 4, "int64", "XEventMetadata"),
        ("stat_metadata", 5, "int64", "XStatMetadata"),
    )),
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

# The subset of xla.HloProto needed to recover instruction names, opcodes, shapes with layouts
# and metadata from the protos a capture embeds on `/host:metadata`.
_HLO_MESSAGES = (
    Message("HloProto", (
        Field("hlo_module", 1, "HloModuleProto"),
    )),
    Message("HloModuleProto", (
        Field("name", 1, "string"),
        Field("entry_computation_name", 2, "string"),
        Field("computations", 3, "HloComputationProto", repeated=True),
        Field("id", 5, "int64"),
        Field("entry_computation_id", 6, "int64"),
    )),
    Message("HloComputationProto", (
        Field("name", 1, "string"),
        Field("instructions", 2, "HloInstructionProto", repeated=True),
        Field("id", 5, "int64"),
        Field("root_id", 6, "int64"),
    )),
    Message("HloInstructionProto", (
        Field("name", 1, "string"),
        Field("opcode", 2, "string"),
        Field("shape", 3, "ShapeProto"),
        Field("metadata", 7, "OpMetadata"),
        Field("fusion_kind", 11, "string"),
        Field("id", 35, "int64"),
        Field("operand_ids", 36, "int64", repeated=True),
        Field("called_computation_ids", 38, "int64", repeated=True),
        Field("custom_call_target", 28, "string"),
        Field("backend_config", 43, "bytes"),
    )),
    Message("ShapeProto", (
        Field("element_type", 2, "int32"),
        Field("dimensions", 3, "int64", repeated=True),
        Field("tuple_shapes", 4, "ShapeProto", repeated=True),
        Field("layout", 5, "LayoutProto"),
    )),
    Message("LayoutProto", (
        Field("minor_to_major", 1, "int64", repeated=True),
        Field("tiles", 6, "TileProto", repeated=True),
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
    )),
)

_xplane = _build("tensorflow.profiler", "tpudiag/xplane.proto", _XPLANE_MESSAGES)
_payloads = _build("tensorflow.profiler.payloads", "tpudiag/profiler_payloads.proto", _PROFILER_PAYLOADS)
_hlo = _build("xla", "tpudiag/hlo_subset.proto", _HLO_MESSAGES)

XSpace = _xplane["XSpace"]
XPlane = _xplane["XPlane"]
XLine = _xplane["XLine"]
XEvent = _xplane["XEvent"]
XStat = _xplane["XStat"]
XEventMetadata = _xplane["XEventMetadata"]
XStatMetadata = _xplane["XStatMetadata"]
MemoryAccessBreakdown = _payloads["MemoryAccessBreakdown"]
CoreDetails = _payloads["CoreDetails"]
HloProto = _hlo["HloProto"]
HloModuleProto = _hlo["HloModuleProto"]
