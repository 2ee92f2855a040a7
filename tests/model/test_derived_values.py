"""The values `model/` derives in properties and cached functions, on small hand-built records.

mutmut 3.8.1 does not mutate a function under a decorator; these tests were written when
`tests/mutmut_undecorate.py` let it (docs/testing.md, lane mut-deco), for what `tests/model` did
not check. Every expectation is worked by hand from the fields given.
"""

from __future__ import annotations

import dataclasses

import pytest

from tpudiag.model.allocator import ActiveAllocation
from tpudiag.model.compiled import ArrayShape, AsyncPair, Layout, TupleShape
from tpudiag.model.hardware import GPU_GENERATIONS, ChipSpec, GpuDevice
from tpudiag.model.hlo_names import category_family, collective_family, name_family
from tpudiag.model.hlo_shapes import Shape
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.llo import BundleUtilization, DumpFile, LloDump, UtilizationColumn
from tpudiag.model.memory import (MemoryBuffer, MemoryLever, OomAnalysis, OomError, ProgramMemory, SpaceMemory)
from tpudiag.model.profile import DeviceInfo, PeaksSource, Platform
from tpudiag.parsers.hlo_text import parse_hlo_text

GIB = 1 << 30


# --- allocator, compiled shapes and async pairs ---

def test_an_active_allocation_totals_its_occurrences_and_names_its_type():
    alloc = ActiveAllocation(allocation_bytes=256, requested_bytes=200, occurrences=3, op="dot", region_type="output",
                             data_type=14, shape="[8,16]")
    assert alloc.total_bytes == 768  # 3 x 256: what the allocator holds, not what was requested
    assert alloc.data_type_name == "bfloat16"  # tensorflow/core/framework/types.proto: DT_BFLOAT16 = 14
    assert dataclasses.replace(alloc, data_type=99).data_type_name == "type 99"


def test_shapes_sum_their_elements_and_read_their_memory_space():
    host = ArrayShape("f32", (8,), Layout((0,), memory_space=5), logical_bytes=32, padded_bytes=512)
    plain = ArrayShape("bf16", (4,), None, logical_bytes=8, padded_bytes=16)
    assert (host.memory_space, plain.memory_space) == (5, 0)  # no layout printed: HBM
    pair = TupleShape((host, plain))
    assert (pair.logical_bytes, pair.padded_bytes) == (40, 528)


def test_an_instruction_without_a_shape_has_no_bytes():
    program = parse_hlo_text("HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n"
                             "  ROOT %p = f32[8]{0:T(256)} parameter(0)\n}\n", "m.txt")
    inst = program.find("p")
    assert (inst.logical_bytes, inst.padded_bytes) == (32, 1024)  # 8 x 4 bytes; one 256-element tile
    shapeless = dataclasses.replace(inst, shape=None)
    assert (shapeless.logical_bytes, shapeless.padded_bytes) == (0, 0)


def test_an_async_pair_knows_where_its_done_is_and_whether_anything_runs_between():
    pair = AsyncPair("main", "cp-start", "cp-done", "copy", "", 3, 4, ())
    assert pair.adjacent and pair.done_in == "main"
    crossing = dataclasses.replace(pair, scheduled_between=("fusion.1",), done_computation="body")
    assert not crossing.adjacent and crossing.done_in == "body"


CONTROL_FLOW_HLO = """\
HloModule m

%deep (d: f32[8]) -> f32[8] {
  %d = f32[8]{0} parameter(0)
  ROOT %twice = f32[8]{0} add(%d, %d)
}

%other (o: f32[8]) -> f32[8] {
  ROOT %o = f32[8]{0} parameter(0)
}

%body (s: (s32[], f32[8])) -> (s32[], f32[8]) {
  %s = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %w = f32[8]{0} get-tuple-element(%s), index=1
  %v = f32[8]{0} call(%w), to_apply=%other
  %inner = f32[8]{0} call(%v), to_apply=%deep
  %inner2 = f32[8]{0} call(%inner), to_apply=%deep
  ROOT %next = (s32[], f32[8]{0}) tuple(%i, %inner2)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]{0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%n, %limit), direction=LT
}

%fused (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %neg = f32[8]{0} negate(%x)
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %p)
  %loop = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
  %out = f32[8]{0} get-tuple-element(%loop), index=1
  %again = f32[8]{0} call(%out), to_apply=%deep
  ROOT %f = f32[8]{0} fusion(%again), kind=kLoop, calls=%fused
}
"""


def test_each_instruction_is_timed_as_the_entry_op_that_runs_it():
    program = parse_hlo_text(CONTROL_FLOW_HLO, "m.txt")
    entry = ("p", "zero", "init", "loop", "out", "again", "f")
    assert program.schedule == entry  # the entry computation in its written order
    # The loop's body and condition, and `other` and `deep`, which the body calls, run inside `loop`;
    # `again` calls `deep` too, but `loop` claimed it first. A fusion's computation is compiled with it.
    expected = {name: name for name in entry}
    expected.update(dict.fromkeys(("s", "i", "w", "v", "inner", "inner2", "next", "o", "c", "n", "limit", "lt",
                                   "d", "twice"), "loop"))
    assert program.entry_op_of == expected


def test_a_control_flow_op_calling_a_computation_the_program_lacks_times_nothing_else():
    program = parse_hlo_text(CONTROL_FLOW_HLO, "m.txt")
    computations = {k: v for k, v in program.computations.items() if k != "cond"}
    instructions = {k: v for k, v in program.instructions.items() if k[0] != "cond"}
    torn = dataclasses.replace(program, computations=computations, instructions=instructions)
    assert set(torn.entry_op_of) == {"p", "zero", "init", "loop", "out", "again", "f",
                                     "s", "i", "w", "v", "inner", "inner2", "next", "o", "d", "twice"}


# --- hardware and device peaks ---

def _chip(**fields) -> ChipSpec:
    base = dict(generation="v9x", peak_bf16_flops_per_s=200e12, hbm_bytes_per_s=800e9, hbm_capacity_bytes=16 * GIB,
                tensorcores_per_chip=1, mxu_per_core=4, mxu_dim=128, vmem_bytes=128 << 20, clock_hz=1.5e9,
                ici_bytes_per_s_per_link=45e9, ici_links=4, trace_names=("v9x",))
    return ChipSpec(**{**base, **fields})


def test_a_chip_ridge_and_ici_peak():
    chip = _chip()
    assert chip.ridge_flops_per_byte == pytest.approx(250.0)  # 200e12 / 800e9
    assert chip.ici_bytes_per_s == pytest.approx(180e9)  # 4 links x 45 GB/s


def test_a_gpu_matrix_peak_needs_its_generation_cores_and_clock():
    a100 = next(g for g in GPU_GENERATIONS if g.model == "A100")
    gpu = GpuDevice("NVIDIA", (8, 0), cores=108, clock_hz=1.41e9, hbm_bytes_per_s=2.0e12, memory_bytes=80 * GIB,
                    generation=a100)
    assert gpu.peak_flops_per_s == pytest.approx(312e12, rel=0.01)  # the A100 datasheet: 312 TF/s dense bf16
    assert dataclasses.replace(gpu, generation=None).peak_flops_per_s is None  # cores and clock known
    assert dataclasses.replace(gpu, cores=0).peak_flops_per_s is None
    assert dataclasses.replace(gpu, clock_hz=0.0).peak_flops_per_s is None


def test_a_device_ridge_needs_both_peaks():
    device = DeviceInfo(Platform.TPU, "TPU v6 Lite", None, peak_flops_per_s=918e12, hbm_bytes_per_s=1640e9,
                        peaks_source=PeaksSource.TRACE, n_cores=1, n_chips=1)
    assert device.ridge_flops_per_byte == pytest.approx(559.76, rel=1e-4)  # 918e12 / 1640e9
    assert dataclasses.replace(device, peak_flops_per_s=None).ridge_flops_per_byte is None
    assert dataclasses.replace(device, hbm_bytes_per_s=0.0).ridge_flops_per_byte is None


@pytest.mark.parametrize("platform, cores, core", [
    (Platform.TPU, "TensorCores", "core"),
    (Platform.GPU, "GPUs", "GPU"),  # a GPU is a GPU
    (Platform.CPU, "XLA CPU threads", "core"),
])
def test_what_findings_call_the_units_that_run_ops(platform, cores, core):
    assert (platform.cores_word, platform.core_word) == (cores, core)


# --- hlo_names: what the name alone says, and the category's seven families ---

def test_a_continuation_in_either_spelling_is_compute_whatever_its_category():
    assert name_family("async_collective_fusion.75") == ""  # v5e spelling, with underscores
    assert collective_family("async_collective_fusion.75", "all-gather fusion") == ""
    assert collective_family("async-collective-fusion.3", "all-reduce") == ""


@pytest.mark.parametrize("kernel, family", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all-reduce"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all-gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce-scatter"),
    ("void rcclDevKernel_Generic(ncclDevComm*)", "collective"),  # RCCL's generic kernel: some collective
])
def test_a_collective_library_kernel_names_its_family(kernel, family):
    assert name_family(kernel) == family


def test_a_category_names_only_the_seven_families():
    # `async-collective` is a name pattern (an unknown async collective), not a category's family
    assert category_family("async-collective-start") == ""
    assert category_family("all-gather fusion") == "all-gather"


# --- shapes, compiled inputs, LLO dumps ---

def test_an_hlo_shape_counts_its_elements_and_reads_its_space():
    assert Shape("f32", (2, 3, 4)).numel == 24 and Shape("f32", ()).numel == 1  # a scalar is one element
    assert Shape("f32", (8,), (0,), "f32[8]{0:S(1)}").memory_space == 1
    assert Shape("f32", (8,), (0,), "f32[8]{0}").memory_space == 0


def test_compiled_inputs_read_the_dumps_programs_before_the_captures():
    dumped, embedded = HloInput("dumped", "/dumps"), HloInput("embedded", "capture")
    assert CompiledInputs(hlo=(dumped,), embedded=(embedded,)).programs == ("dumped",)
    assert CompiledInputs(embedded=(embedded,)).programs == ("embedded",)
    assert CompiledInputs().empty
    assert not CompiledInputs(llo=("llo",)).empty
    assert not CompiledInputs(hlo=(dumped,)).empty
    assert not CompiledInputs(embedded=(embedded,)).empty


def _util(bundles: int, *columns: UtilizationColumn) -> BundleUtilization:
    return BundleUtilization("fusion.1", bundles, columns)


def test_bundle_utilization_totals_and_the_mxu_busy_fraction():
    util = _util(10, UtilizationColumn("MXU", 4, 12), UtilizationColumn("VLOAD:FILL", 1, 7),
                 UtilizationColumn("VSTORE:SPILL", 1, 3))
    assert util.mxu_busy_fraction == pytest.approx(0.3)  # 12 busy MXU slots of 10 bundles x 4 MXUs
    assert (util.vload_fill, util.vstore_spill) == (7, 3)
    assert _util(10, UtilizationColumn("MXU", 1, 5)).mxu_busy_fraction == pytest.approx(0.5)  # one MXU
    nothing = _util(10, UtilizationColumn("VALU", 4, 8))
    assert (nothing.mxu_busy_fraction, nothing.vload_fill, nothing.vstore_spill) == (None, None, None)
    assert _util(0, UtilizationColumn("MXU", 4, 0)).mxu_busy_fraction is None  # no bundles
    assert _util(10, UtilizationColumn("MXU", 0, 0)).mxu_busy_fraction is None  # no capacity header


def test_an_llo_dump_lists_its_programs_once_in_order():
    files = tuple(DumpFile(f"{i}", i, program, i, "final_bundles")
                  for i, program in enumerate(("fusion.2", "TLP", "fusion.2", "_lambda_.1")))
    dump = LloDump("/d", files, *([None] * 7))
    assert dump.programs == ("TLP", "_lambda_.1", "fusion.2")


# --- memory ---

def _space(name: str = "hbm", peak: int = 10 * GIB) -> SpaceMemory:
    return SpaceMemory(name, 0 if name == "hbm" else 1, peak_bytes=peak, argument_bytes=1 * GIB,
                       output_bytes=2 * GIB, temp_bytes=6 * GIB, constant_bytes=4 << 20, alias_bytes=0,
                       reported_total_bytes=None, live_at_peak=(), peak_position=None)


def _program(**fields) -> ProgramMemory:
    base = dict(module="jit_step", path="m.txt", generation="v5e", hbm_capacity_bytes=16 * GIB,
                hbm_usable_bytes=None, usable_source="", spaces=(_space("vmem", 1 << 20), _space()),
                oom_recorded=False)
    return ProgramMemory(**{**base, **fields})


def _error(space: str = "hbm", kind: str = "hbm-temporaries", required: int = 20 * GIB) -> OomError:
    return OomError(space, kind, required_bytes=required, available_bytes=15 * GIB, message="RESOURCE_EXHAUSTED")


def test_a_space_reserves_its_arguments_outputs_and_constants_for_the_whole_run():
    assert _space().whole_program_bytes == 3 * GIB + (4 << 20)  # 1 + 2 GiB + 4 MiB; not the 6 GiB of temporaries


def test_a_buffer_padding_is_never_negative():
    buffer = MemoryBuffer("b", "b", "temporary", size_bytes=100, logical_bytes=60, shape="", op_name="",
                          source_file="", source_line=0)
    assert buffer.padding_bytes == 40
    assert dataclasses.replace(buffer, logical_bytes=120).padding_bytes == 0
    assert dataclasses.replace(buffer, logical_bytes=None).padding_bytes is None


def test_an_oom_error_names_its_form_and_its_overrun():
    error = _error()
    assert error.over_by_bytes == 5 * GIB  # 20 GiB required of 15 GiB available
    assert dataclasses.replace(error, exceeded_by_bytes=123).over_by_bytes == 123  # the text's own figure
    assert dataclasses.replace(error, form="vmem-scoped").form_text.startswith("libtpu's scoped VMEM check")
    assert dataclasses.replace(error, form="some-new-form").form_text == "some-new-form"


def test_the_peak_is_the_buffer_assignments_unless_the_compiler_failed_in_hbm():
    assert _program().hbm_peak_bytes == 10 * GIB
    assert _program(spaces=(_space("vmem"),)).hbm_peak_bytes is None  # no HBM space
    assert _program(error=_error()).hbm_peak_bytes == 20 * GIB  # the error's figure, above the 10
    assert _program(error=_error(required=8 * GIB)).hbm_peak_bytes == 10 * GIB  # never below the assignment's
    assert _program(spaces=(), error=_error()).hbm_peak_bytes == 20 * GIB
    assert _program(error=_error(kind="hbm-allocation")).hbm_peak_bytes == 10 * GIB  # at run time: not a compile peak
    assert _program(error=_error("vmem", "scoped")).hbm_peak_bytes == 10 * GIB


def test_the_limit_is_the_usable_hbm_else_the_capacity_and_is_named_so():
    assert _program().hbm_limit_bytes == 16 * GIB
    usable = _program(hbm_usable_bytes=15 * GIB, usable_source="compiler error")
    assert usable.hbm_limit_bytes == 15 * GIB and usable.limit_words == "usable (compiler error)"
    assert _program(hbm_usable_bytes=0).hbm_limit_bytes == 16 * GIB
    assert _program(hbm_capacity_bytes=None).hbm_limit_bytes is None
    assert _program(capacity_source="public v5e figure").limit_words == "of HBM (public v5e figure)"
    assert _program().limit_words == "of HBM"
    program = _program()
    assert program.hbm is program.spaces[1]  # the HBM space, not the VMEM one listed first


def test_headroom_fit_and_levers():
    assert _program().headroom_bytes == 6 * GIB  # 16 - 10
    assert _program(hbm_capacity_bytes=None).headroom_bytes is None
    assert _program(spaces=()).headroom_bytes is None
    fits = _program()
    assert not fits.does_not_fit and not fits.needs_levers  # 10 of 16 GiB: under 80 %
    assert _program(oom_recorded=True).does_not_fit
    assert _program(error=_error(required=1 * GIB)).does_not_fit  # an HBM error says so, whatever the peak
    assert not _program(error=_error("vmem", "scoped")).does_not_fit
    assert _program(spaces=(_space(peak=17 * GIB),)).does_not_fit  # 17 > 16
    assert not _program(spaces=(_space(peak=16 * GIB),)).does_not_fit  # exactly the limit fits
    assert not _program(hbm_capacity_bytes=None, spaces=(_space(peak=17 * GIB),)).does_not_fit  # no limit known
    assert not _program(spaces=()).does_not_fit
    near = _program(hbm_capacity_bytes=100, spaces=(_space(peak=80),))
    assert near.needs_levers and not near.does_not_fit  # 80 % of the limit: levers offered
    assert not _program(hbm_capacity_bytes=100, spaces=(_space(peak=79),)).needs_levers
    assert _program(oom_recorded=True, hbm_capacity_bytes=None).needs_levers
    assert not _program(hbm_capacity_bytes=None).needs_levers
    assert not _program(spaces=()).needs_levers


def test_the_first_lever_is_the_one_named_first():
    levers = tuple(MemoryLever(key, key, 1, "", "") for key in ("padding", "donation"))
    assert _program(levers=levers, first="donation").first_lever is levers[1]
    assert _program(levers=levers).first_lever is None
    assert OomAnalysis(_error(), levers, first="padding").first_lever is levers[0]
    assert OomAnalysis(_error(), levers).first_lever is None
