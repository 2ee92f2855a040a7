"""Serialized `xla.HloProto` / `xla.HloModuleProto` bytes -> CompiledProgram.

A capture embeds one HloProto per program on `/host:metadata` (collected by
`tpudiag.parsers.device_trace` into `HostTrace.hlo_protos`); `compiled.runtime_executable()
.hlo_modules()[0].as_serialized_hlo_module_proto()` gives the bare HloModuleProto. Both start with
field 1 as a length-delimited value (HloProto.hlo_module vs HloModuleProto.name), so the bytes
are tried as HloProto first and read as a module when that yields no computations.

The result matches `tpudiag.parsers.hlo_text` field for field, except what only the text dump
has (`entry_layout`, memory-usage report, live ranges, target); the schedule comes from
`HloModuleProto.schedule` rather than from instruction order. The buffer assignment is read when
the HloProto carries one (real captures do: it is what XProf's memory viewer shows).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from tpudiag.errors import InputError
from tpudiag.model.compiled import (BufferAllocation, BufferValue, CompiledProgram, ConvDims, DotDims,
                                    Instruction, Layout, Shape, TupleShape, window_factors, window_padding)
from tpudiag.model.inputs import CAPTURE_ORIGIN, HloInput
from tpudiag.parsers.hlo_program import check_allocation_sizes, computation_from, finish_program
from tpudiag.parsers.layout import ShapeSyntaxError, array_shape, shape_text
from tpudiag.proto import HloModuleProto, HloProto
from tpudiag.proto.schema import PRIMITIVE_TYPE_NAMES

_TUPLE = 13
_EMPTY_LAYOUT = Layout(minor_to_major=())


def parse_hlo_proto(data: bytes, path: str = "<proto>", program_id: int | None = None) -> CompiledProgram:
    """Parse HloProto or HloModuleProto bytes; raise InputError naming `path` on damage."""
    if not data:
        raise InputError("empty HLO proto", path=path)
    module = None
    assignment = None
    try:
        wrapper = HloProto()
        wrapper.ParseFromString(data)
        if wrapper.hlo_module.computations:
            module = wrapper.hlo_module
            assignment = wrapper.buffer_assignment if wrapper.HasField("buffer_assignment") else None
    except (DecodeError, ValueError, RuntimeError, TypeError):
        module = None  # not an HloProto; maybe a bare module
    if module is None:
        module = HloModuleProto()
        try:
            module.ParseFromString(data)
        except DecodeError as exc:
            raise InputError("corrupt or truncated HLO proto", path=path) from exc
        except (ValueError, RuntimeError, TypeError) as exc:
            raise InputError(f"corrupt HLO proto ({exc})", path=path) from exc
    if not module.computations:
        raise InputError("HLO proto has no computations", path=path)
    try:
        program = _program(module, path, program_id)
        if assignment is not None and assignment.buffer_allocations:
            try:
                program.allocations = check_allocation_sizes(_allocations(assignment, module, program))
            except ValueError as exc:
                program.warnings.append(f"`{path}`: unreadable buffer assignment ({exc}); ignored")
            else:
                program.live_ranges, program.live_range_positions = _heap_live_ranges(assignment, program)
        return finish_program(program)
    except RecursionError as exc:
        raise InputError("HLO proto nested too deep to parse (damaged)", path=path) from exc
    except OverflowError as exc:
        raise InputError("a number beyond int64 in the HLO proto (damaged)", path=path) from exc


def tuple_elements(data: bytes) -> dict[str, tuple[str, int]]:
    """Every `get-tuple-element` of the program, by name: (the tuple's producer, the index). A
    capture's trace records the producer but never the element; `analysis.op_bytes` follows a VMEM
    operand through it. Damaged bytes give {} (the program is parsed, with its warning, elsewhere)."""
    wrapper = HloProto()
    try:
        wrapper.ParseFromString(data)
        module = wrapper.hlo_module if wrapper.hlo_module.computations else HloModuleProto.FromString(data)
    except (DecodeError, ValueError, RuntimeError, TypeError):
        return {}
    out: dict[str, tuple[str, int]] = {}
    for comp in module.computations:
        names = {inst.id: inst.name for inst in comp.instructions}
        for inst in comp.instructions:
            if inst.opcode == "get-tuple-element" and inst.operand_ids and inst.operand_ids[0] in names:
                out[inst.name] = (names[inst.operand_ids[0]], int(inst.tuple_index))
    return out


def capture_hlo_inputs(profile) -> tuple[HloInput, ...]:
    """Every program the capture's hosts embed, parsed once per program id: the hosts of one SPMD
    run carry the same programs, and parsing is the costly part. A damaged copy is left out with a
    warning on its host (the trace itself still counts) and the next host's copy is tried."""
    programs: dict[int, CompiledProgram] = {}
    for host in profile.hosts:
        for pid, data in host.hlo_protos.items():
            if pid in programs:
                continue
            try:
                programs[pid] = parse_hlo_proto(data, f"{host.path} program {pid}", pid)
            except InputError as exc:
                host.warnings.append(f"embedded HLO not used: {exc.one_line()}")
                continue
            host.warnings.extend(programs[pid].warnings)  # what was set aside (a bad layout), as for dumps
    return tuple(HloInput(program, CAPTURE_ORIGIN) for program in programs.values())


def _program(module, path: str, program_id: int | None) -> CompiledProgram:
    warnings: list[str] = []
    comp_names = {c.id: c.name for c in module.computations}
    schedule = {entry.key: list(entry.value.instruction_ids) for entry in module.schedule.sequences}
    frames = module.stack_frame_index
    computations = {}
    instructions = {}
    entry = module.entry_computation_name or comp_names.get(module.entry_computation_id, "")
    for comp in module.computations:
        by_id = {inst.id: inst for inst in comp.instructions}
        order = [by_id[i] for i in schedule.get(comp.id, []) if i in by_id]
        if len(order) != len(by_id):  # unscheduled (fusion bodies): the proto's dependency order
            order = list(comp.instructions)
        names = {inst.id: inst.name for inst in comp.instructions}
        insts: list[Instruction] = []
        for position, proto in enumerate(order):
            try:
                shape = _shape(proto.shape)
                text = shape_text(shape)
            except ShapeSyntaxError as exc:
                warnings.append(f"`{path}`: `{proto.name}` in `{comp.name}`: {exc}")
                shape, text = None, ""
            source_file, source_line = proto.metadata.source_file, proto.metadata.source_line
            if not source_file and proto.metadata.stack_frame_id:
                source_file, source_line = _frame_location(frames, proto.metadata.stack_frame_id)
            missing = [i for i in proto.operand_ids if i not in names]
            if missing:
                warnings.append(f"`{path}`: `{proto.name}` refers to {len(missing)} unknown operand ids")
            insts.append(Instruction(
                computation=comp.name, name=proto.name, opcode=proto.opcode, shape_text=text, shape=shape,
                operands=tuple(names[i] for i in proto.operand_ids if i in names),
                called_computations=tuple(comp_names.get(i, f"<computation {i}>")
                                          for i in proto.called_computation_ids),
                fusion_kind=proto.fusion_kind if proto.opcode == "fusion" else "",
                custom_call_target=proto.custom_call_target, op_name=proto.metadata.op_name,
                source_file=source_file, source_line=source_line,
                backend_config=proto.backend_config.decode("utf-8", errors="replace"),
                async_execution_thread=proto.async_execution_thread,
                frontend_attributes=tuple((e.key, e.value) for e in proto.frontend_attributes.map),
                is_root=proto.id == comp.root_id, position=position,
                parameter_number=proto.parameter_number if proto.opcode == "parameter" else None,
                contraction=_contraction(proto)))
        if not insts:
            continue
        computations[comp.name] = computation_from(comp.name, comp.name == entry, insts)
        for inst in insts:
            instructions[(comp.name, inst.name)] = inst
    if entry not in computations:
        raise InputError(f"HLO proto names entry computation `{entry}` but does not hold it", path=path)
    return CompiledProgram(
        module=module.name, path=path, source="hlo_proto", entry=entry, is_scheduled=bool(schedule),
        computations=computations, instructions=instructions, program_id=program_id, warnings=warnings)


def _contraction(proto) -> DotDims | ConvDims | None:
    """The dot or convolution dimension numbers, as `hlo_text` reads them from the printed attributes."""
    if proto.opcode == "dot":
        d = proto.dot_dimension_numbers
        return DotDims(tuple(d.lhs_contracting_dimensions), tuple(d.rhs_contracting_dimensions),
                       tuple(d.lhs_batch_dimensions), tuple(d.rhs_batch_dimensions))
    # cuDNN/MIOpen convolution custom calls keep the convolution's dimension numbers and window
    if proto.opcode not in ("convolution", "custom-call") or not proto.HasField("convolution_dimension_numbers"):
        return None
    c = proto.convolution_dimension_numbers
    return ConvDims(
        input_batch=c.input_batch_dimension, input_feature=c.input_feature_dimension,
        input_spatial=tuple(c.input_spatial_dimensions), kernel_input_feature=c.kernel_input_feature_dimension,
        kernel_output_feature=c.kernel_output_feature_dimension, kernel_spatial=tuple(c.kernel_spatial_dimensions),
        output_batch=c.output_batch_dimension, output_feature=c.output_feature_dimension,
        output_spatial=tuple(c.output_spatial_dimensions),
        window=tuple(w.size for w in proto.window.dimensions),
        feature_group_count=proto.feature_group_count or 1, batch_group_count=proto.batch_group_count or 1,
        lhs_dilation=window_factors(tuple(w.base_dilation or 1 for w in proto.window.dimensions)),
        stride=window_factors(tuple(w.stride or 1 for w in proto.window.dimensions)),
        padding=window_padding(tuple((w.padding_low, w.padding_high) for w in proto.window.dimensions)),
        rhs_dilation=window_factors(tuple(w.window_dilation or 1 for w in proto.window.dimensions)))


def _allocations(assignment, module, program: CompiledProgram) -> tuple[BufferAllocation, ...]:
    """The buffer assignment as `*-buffer-assignment.txt` gives it: each allocation with its
    values, named `instruction` or `instruction{i}` (a tuple element) as the text dump names them."""
    names = {inst.id: inst.name for comp in module.computations for inst in comp.instructions}
    shapes = {inst.name: inst.shape for inst in program.instructions.values()}
    buffers = {b.id: b for b in assignment.logical_buffers}
    out = []
    for alloc in assignment.buffer_allocations:
        values = []
        for assigned in alloc.assigned:
            buf = buffers.get(assigned.logical_buffer_id)
            if buf is None:
                continue
            where = buf.defined_at
            name = names.get(where.instruction_id, where.instruction_name)
            index = tuple(where.shape_index)
            values.append(BufferValue(
                value_id=buf.id, name=name + ("{" + ",".join(map(str, index)) + "}" if index else ""),
                size_bytes=assigned.size, offset_bytes=assigned.offset,
                shape_text=_element_text(shapes.get(name), index)))
        param = alloc.is_entry_computation_parameter
        out.append(BufferAllocation(
            index=alloc.index, size_bytes=alloc.size, color=alloc.color,
            parameter_number=alloc.parameter_number if param else None, is_output=False,
            maybe_live_out=alloc.maybe_live_out, is_thread_local=alloc.is_thread_local,
            is_temp=not (param or alloc.maybe_live_out or alloc.is_constant or alloc.is_thread_local),
            is_constant=alloc.is_constant, values=tuple(values)))
    return tuple(out)


_ALLOC, _FREE = 0, 1  # HeapSimulatorTrace.Event.Kind; SHARE_WITH (2) reuses memory already counted


def _heap_live_ranges(assignment, program: CompiledProgram) -> tuple[dict[str, tuple[int, int]], int]:
    """Live ranges of the temporaries from the heap simulator's trace of the largest allocation it
    simulated, in event order (the role `*-live-range.txt` plays for a text dump): a value lives
    from its ALLOC event to its FREE event. ({}, 0) without a trace."""
    sizes = {a.index: a.size_bytes for a in program.allocations}
    traces = [t for t in assignment.heap_simulator_traces if t.events]
    if not traces:
        return {}, 0
    trace = max(traces, key=lambda t: sizes.get(t.buffer_allocation_index, 0))
    names = {v.value_id: v.name for a in program.allocations for v in a.values}
    start: dict[str, int] = {}
    ranges: dict[str, tuple[int, int]] = {}
    for position, event in enumerate(trace.events):
        name = names.get(event.buffer_id)
        if name is None:
            continue
        key = name if name.endswith("}") else name + "{}"
        if event.kind == _ALLOC:
            start[key] = position
        elif event.kind == _FREE and key in start:
            ranges[key] = (start.pop(key), position)
    last = len(trace.events) - 1
    ranges.update({key: (first, last) for key, first in start.items()})  # never freed: live to the end
    return ranges, last


def _element_text(shape: Shape | None, index: tuple[int, ...]) -> str:
    """The text of the array at `index` in `shape` ('' when the index does not hold one)."""
    for i in index:
        if not isinstance(shape, TupleShape) or not 0 <= i < len(shape.elements):
            return ""
        shape = shape.elements[i]
    return shape_text(shape) if shape is not None else ""


def _shape(proto) -> Shape:
    if proto.element_type == _TUPLE:
        return TupleShape(tuple(_shape(s) for s in proto.tuple_shapes))
    dtype = PRIMITIVE_TYPE_NAMES.get(proto.element_type)
    if dtype is None:
        raise ShapeSyntaxError(f"unknown element type number {proto.element_type}")
    layout = None
    if proto.HasField("layout"):
        lay = proto.layout
        layout = Layout(minor_to_major=tuple(lay.minor_to_major),
                        tiles=tuple(tuple(t.dimensions) for t in lay.tiles),
                        element_size_bits=lay.element_size_in_bits, memory_space=lay.memory_space)
        if layout == _EMPTY_LAYOUT:  # a scalar's default layout: text prints none, so neither do we
            layout = None
    return array_shape(dtype, tuple(proto.dimensions), layout)


def _frame_location(frames, frame_id: int) -> tuple[str, int]:
    """File and line of a 1-based stack frame id; ('', 0) when the index does not hold it."""
    if not 0 < frame_id <= len(frames.stack_frames):
        return "", 0
    loc_id = frames.stack_frames[frame_id - 1].file_location_id
    if not 0 < loc_id <= len(frames.file_locations):
        return "", 0
    loc = frames.file_locations[loc_id - 1]
    if not 0 < loc.file_name_id <= len(frames.file_names):
        return "", 0
    return frames.file_names[loc.file_name_id - 1], loc.line
