"""`analysis.device_memory` on whole programs: the Adam step dumps of `tests/memory_dumps.py`, read
here and analysed in the test (no fixture, so a mutation tester sees which test reaches which
function). Every figure is worked by hand from the dump's design: per layer a bf16 [8192, 8192]
weight (128 MiB) with f32 m and v (256 MiB each), a bf16 [16384, 8192] batch `x` and forward
activations (256 MiB each); the v5e compiler's usable HBM is 15.75 GiB."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.memory_dumps import ACT_BYTES, STATE_BYTES, W_BYTES, write_adam_dump
from tpudiag.analysis.device_memory import (GPU_MEMORY_SOURCE, error_report, memory_report, program_memories,
                                            with_allocator_capacity, with_gpu_memory)
from tpudiag.model.memory import OomError
from tpudiag.parsers.dump_dir import load_dumps

MIB = 1 << 20
USABLE_V5E = int(15.75 * 2**30)  # the v5e compiler's figure (model.hardware.COMPILER_USABLE_HBM_BYTES)


def _program(tmp_path, name="dump", **kw):
    [p] = program_memories(load_dumps([write_adam_dump(tmp_path / name, **kw)]))
    return p


def test_ten_layers_split_into_arguments_outputs_and_the_temporaries_at_their_peak(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2)
    hbm = p.hbm
    # arguments: 10 x (W + m + v) + x = 10 x 640 MiB + 256 MiB; outputs: the 30 updated arrays, 6400 MiB;
    # temporaries: one heap of 2 activations (2 x 256 MiB)
    assert (hbm.argument_bytes, hbm.output_bytes, hbm.temp_bytes, hbm.constant_bytes, hbm.alias_bytes) == (
        6656 * MIB, 6400 * MIB, 512 * MIB, 0, 0)
    assert hbm.peak_bytes == p.hbm_peak_bytes == hbm.reported_total_bytes == 13568 * MIB
    assert (hbm.space, hbm.color) == ("hbm", 0)
    # 31 parameters at positions 0..30; activation i lives at 31+i and 32+i; positions 0..51
    assert len(hbm.timeline_bytes) == 52 and hbm.peak_position == 32  # the first position with two alive
    assert hbm.timeline_bytes[30:34] == (0, ACT_BYTES, 2 * ACT_BYTES, 2 * ACT_BYTES)
    assert hbm.timeline_bytes[40:43] == (2 * ACT_BYTES, ACT_BYTES, 0)  # act.9 alone at 41 (40..41)
    # live at the peak: every whole-program buffer, and the two activations alive at position 32
    temps = [b for b in hbm.live_at_peak if b.kind == "temporary"]
    assert [(b.name, b.live_from, b.live_to) for b in temps] == [("act.0", 31, 32), ("act.1", 32, 33)]
    assert len(hbm.live_at_peak) == 31 + 30 + 2
    assert hbm.live_at_peak[0].size_bytes == STATE_BYTES  # largest first
    x = next(b for b in hbm.live_at_peak if b.name == "x.1")
    assert (x.kind, x.parameter_number, x.aliased, x.op_name, x.logical_bytes) == ("argument", 30, False, "x",
                                                                                     ACT_BYTES)
    act = temps[0]
    assert (act.instruction, act.source_file, act.source_line, act.shape) == (
        "act.0", "train.py", 12, "bf16[16384,8192]{1,0:T(8,128)(2,1)}")
    # grouped by jit argument (params, m, v, x) or by JAX op, largest first, each with its first source line
    assert [(g.label, g.kind, g.count, g.size_bytes, g.source) for g in hbm.groups] == [
        ("jit(step)/transpose(jvp())/dot_general", "output", 30, 6400 * MIB, "train.py:20"),
        ("m", "argument", 10, 2560 * MIB, ""), ("v", "argument", 10, 2560 * MIB, ""),
        ("params", "argument", 10, 1280 * MIB, ""),
        ("jit(step)/jvp()/dot_general", "temporary", 2, 512 * MIB, "train.py:12"),
        ("x", "argument", 1, 256 * MIB, "")]


def test_the_chip_the_workload_and_the_vmem_of_a_v5e_training_step(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2)
    assert (p.module, p.generation, p.hbm_capacity_bytes, p.hbm_usable_bytes) == ("jit_step", "v5e", 16 << 30,
                                                                                 USABLE_V5E)
    assert (p.usable_source, p.capacity_source) == ("the v5e compiler's figure", "public v5e figure")
    assert p.mesh_devices == 1 and p.error is None and not p.oom_recorded and not p.does_not_fit
    assert p.workload == "training"
    assert p.workload_evidence == ("a backward pass (10 ops named `transpose(jvp(...))`); optimiser state (m, v)")
    # v5e's scoped VMEM default (16 MiB, measured) and its 128 MiB of VMEM; no kernel, no scoped use
    assert (p.vmem_scoped_limit_bytes, p.vmem_limit_source, p.vmem_capacity_bytes) == (
        16 * MIB, "default for v5e, measured", 128 * MIB)
    assert p.vmem_ops == () and p.warnings == () and p.compiler_peak_bytes is None


def test_the_levers_of_a_step_at_84_percent_each_worked_by_hand(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2)  # 13568 MiB of 15.75 GiB: 84 %, levers from 80 %
    levers = {lv.key: lv for lv in p.levers}
    # largest saving first; the same saving ordered by key
    assert [lv.key for lv in p.levers] == ["host-offload", "donation", "dtype", "remat", "microbatch"]
    donation = levers["donation"]
    # 30 outputs each with the shape of an argument not donated: all 6400 MiB of outputs could reuse one
    assert donation.saving_bytes == 6400 * MIB
    assert donation.title == "donate m, params, v: 30 outputs have an argument's shape and could reuse it"
    assert donation.fix == "jax.jit(step, donate_argnums=(0, 1, 2))"  # params, m, v are parameters 0-9, 10-19, 20-29
    assert donation.explanation == "the outputs that could reuse a same-shaped argument's buffer"  # nothing borrowed
    assert donation.precondition == "30 outputs with an argument's shape, that argument not donated"
    assert len(donation.buffers) == 30 and donation.buffers[0] == "update.0{1}"
    remat = levers["remat"]  # the 2 forward activations live at the peak
    assert (remat.saving_bytes, remat.buffers) == (512 * MIB, ("act.0", "act.1"))
    assert remat.title == "rematerialise 2 forward activations kept for the backward pass"
    assert remat.precondition == "a backward pass, and 2 forward activations live at the peak"
    assert remat.explanation == ("forward activations live at the peak; recomputing them costs their FLOPs again "
                                 "in the backward pass")
    assert remat.fix == ("wrap the layer in jax.checkpoint (e.g. policy=jax.checkpoint_policies.dots_saveable, or "
                         "nothing_saveable for the most memory)")
    # the f32 moments m and v (20 x 256 MiB) and their 20 updated values
    offload = levers["host-offload"]
    assert offload.saving_bytes == 10240 * MIB and len(offload.buffers) == 20
    assert offload.title == "keep the f32 optimiser state (m, v) in host memory (20 arrays)"
    assert offload.precondition == "f32 optimiser state recognised: m, v"
    assert offload.explanation == ("the f32 optimiser state (and its new values) moved to pinned host memory; the "
                                   "update then streams over PCIe each step")
    assert offload.fix == "place the optimiser state with memory_kind='pinned_host' (jax.device_put / out_shardings)"
    dtype = levers["dtype"]
    assert dtype.saving_bytes == 5120 * MIB and dtype.buffers == offload.buffers
    assert dtype.title == "store the f32 optimiser state (m, v) in bf16"
    assert dtype.explanation == ("half of the f32 optimiser state and its new values; bf16 moments need care "
                                 "(stochastic rounding)")
    assert dtype.fix == "keep optimiser moments in bf16 (e.g. optax.adam(mu_dtype=jnp.bfloat16))"
    assert dtype.precondition == "f32 optimiser state recognised: m, v"
    assert all(type(lv.saving_bytes) is int for lv in p.levers)  # bytes, as the JSON report prints them
    # half of the batch argument x (256 MiB) and of the temporaries at the peak (512 MiB)
    micro = levers["microbatch"]
    assert micro.saving_bytes == 384 * MIB and micro.buffers == ("act.0", "act.1", "x.1")
    assert micro.title == "halve the microbatch (accumulate gradients over 2)"
    assert micro.precondition == "a training step (it has a backward pass)"
    assert micro.explanation == ("half of the temporaries live at the peak and of the batch arguments, which scale "
                                 "with the batch")
    assert micro.fix == "split the batch into microbatches and accumulate gradients (jax.lax.scan over microbatches)"
    assert "fsdp" not in levers  # one device
    # over 80 % by 13568 MiB - int(0.8 x 15.75 GiB) + 1 = 665.6 MiB: padding and temporaries are not
    # offered, donation is the cheapest lever that covers it
    assert p.first == "donation" and p.first_lever is donation


def test_a_donating_step_has_no_donation_lever_and_says_its_donated_arguments(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2, donate=True)
    hbm = p.hbm
    # the 30 donated state arrays hold the updates: no outputs of their own, their 6400 MiB aliased
    assert (hbm.argument_bytes, hbm.output_bytes, hbm.alias_bytes, hbm.peak_bytes) == (
        6656 * MIB, 0, 6400 * MIB, 7168 * MIB)
    assert sum(b.aliased for b in hbm.live_at_peak) == 30
    assert p.workload_evidence.endswith("; optimiser state (m, v); 30 donated arguments")
    assert p.levers == () and p.first == ""  # 7 GiB of 15.75: 44 %, under 80 %


def test_an_inference_step_names_its_donated_state_and_gets_donation_alone(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2, inference=True)
    assert p.workload == "inference"
    assert p.workload_evidence == "no backward pass (no op named `transpose(jvp(...))`)"
    assert [(lv.key, lv.saving_bytes) for lv in p.levers] == [("donation", 6400 * MIB)]
    donated = _program(tmp_path, "donated", layers=10, live_activations=2, inference=True, donate=True)
    assert donated.workload_evidence == ("no backward pass (no op named `transpose(jvp(...))`); 30 donated "
                                         "arguments (state updated in place, as a cache is)")


def test_a_recorded_oom_does_not_fit_and_the_first_lever_covers_the_overrun(tmp_path):
    p = _program(tmp_path, layers=13, live_activations=2, oom=True)
    # 13 x (128 + 2 x 256) x 2 + 256 + 512 MiB = 17408 MiB: 1.25 GiB over the 15.75 usable
    assert p.oom_recorded and p.does_not_fit and p.hbm_peak_bytes == 17408 * MIB
    assert [(lv.key, lv.saving_bytes) for lv in p.levers] == [
        ("host-offload", 13312 * MIB), ("donation", 8320 * MIB), ("dtype", 6656 * MIB), ("remat", 512 * MIB),
        ("microbatch", 384 * MIB)]
    assert p.first == "donation"  # 1.25 GiB + 1 B needed: remat (0.5 GiB) is not enough alone


def test_a_dump_without_a_target_has_no_chip_and_no_levers(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2, target=False)
    assert (p.generation, p.hbm_capacity_bytes, p.hbm_usable_bytes, p.usable_source, p.capacity_source) == (
        "", None, None, "", "")
    assert (p.vmem_scoped_limit_bytes, p.vmem_limit_source, p.vmem_capacity_bytes) == (None, "", None)
    assert p.levers == () and p.first == "" and not p.does_not_fit


def test_a_replicated_step_on_a_4_device_mesh_gets_fsdp(tmp_path):
    p = _program(tmp_path, layers=10, live_activations=2, mesh=4, sharding="{replicated}")
    assert p.mesh_devices == 4
    fsdp = next(lv for lv in p.levers if lv.key == "fsdp")
    # 30 arrays of rank 2, each replicated (1 way): 3/4 of 6400 MiB
    assert fsdp.saving_bytes == 4800 * MIB and len(fsdp.buffers) == 30
    assert fsdp.title == "shard 30 parameter and state arrays over all 4 devices of the mesh (FSDP)"
    assert fsdp.precondition == "30 arrays of rank 2 or more are sharded 1 ways on a 4-device mesh"
    assert fsdp.explanation == ("each array's bytes times (1 - its shards / 4), from its sharding in the program; "
                                "gathering them per layer adds collectives")
    assert fsdp.fix == "shard params and optimiser state along the data axis too (NamedSharding(mesh, P('data', ...)))"
    half = _program(tmp_path, "half", layers=10, live_activations=2, mesh=4, sharding="{devices=[2,1]<=[2]}")
    # split 2 ways of 4: half of each array is left to shard
    assert next(lv for lv in half.levers if lv.key == "fsdp").saving_bytes == 3200 * MIB
    two = _program(tmp_path, "two", layers=10, live_activations=2, mesh=2, sharding="{replicated}")
    assert next(lv for lv in two.levers if lv.key == "fsdp").saving_bytes == 3200 * MIB  # a 2-device mesh: half
    # a mesh program without sharding attributes, and an inference step: no FSDP
    unsharded = _program(tmp_path, "unsharded", layers=10, live_activations=2, mesh=4)
    assert "fsdp" not in {lv.key for lv in unsharded.levers} and unsharded.levers
    inference = _program(tmp_path, "inf", layers=10, live_activations=2, mesh=4, sharding="{replicated}",
                         inference=True)
    assert [lv.key for lv in inference.levers] == ["donation"]


def test_fsdp_counts_only_the_arrays_split_fewer_ways_than_the_mesh(tmp_path):
    root = write_adam_dump(tmp_path / "mixed", layers=10, live_activations=2, mesh=4, sharding="{devices=[4,1]<=[4]}")
    hlo = next(root.glob("*.after_optimizations.txt"))
    shardings = {"%params_": "{replicated}", "%v_": "{devices=[2,1]<=[2]}"}
    lines = []
    for line in hlo.read_text().splitlines():
        for prefix, sharding in shardings.items():
            if prefix in line:
                line = line.replace("sharding={devices=[4,1]<=[4]}", f"sharding={sharding}")
        # `x` without its op name: its jit argument is named after the parameter itself
        lines.append(line.replace(', metadata={op_name="x"}', "") if "%x.1 =" in line else line)
    hlo.write_text("\n".join(lines))
    [p] = program_memories(load_dumps([root]))
    fsdp = next(lv for lv in p.levers if lv.key == "fsdp")
    # m is split 4 ways already; the 10 replicated weights (128 MiB) could free 3/4, the 10 v (256 MiB,
    # split 2 ways) 1/2: 960 + 1280 MiB
    assert fsdp.saving_bytes == 2240 * MIB and len(fsdp.buffers) == 20
    assert fsdp.title == "shard 20 parameter and state arrays over all 4 devices of the mesh (FSDP)"
    assert fsdp.precondition == "20 arrays of rank 2 or more are sharded 1/2 ways on a 4-device mesh"
    assert next(lv for lv in p.levers if lv.key == "donation").fix == "jax.jit(step, donate_argnums=(0, 1, 2))"


def test_kernels_scoped_vmem_is_read_from_their_backend_config(tmp_path):
    p = _program(tmp_path, layers=2, kernels={"k.2": 100, "k.1": 4096, "k.3": 100})
    # largest first, then by name; each a Pallas kernel (`tpu_custom_call`) with its JAX op name
    assert [(v.op, v.scoped_bytes, v.source, v.op_name, v.kernel) for v in p.vmem_ops] == [
        ("k.1", 4096, "HLO backend_config", "jit(step)/pallas_call", True),
        ("k.2", 100, "HLO backend_config", "jit(step)/pallas_call", True),
        ("k.3", 100, "HLO backend_config", "jit(step)/pallas_call", True)]


def test_a_dump_without_live_ranges_keeps_every_temporary_and_says_so(tmp_path):
    root = write_adam_dump(tmp_path / "dump", layers=4, live_activations=2)
    next(root.glob("*live-range.txt")).unlink()
    [p] = program_memories(load_dumps([root]))
    assert p.warnings == ("`jit_step`: no live-range dump: the temporaries at the peak are not split by time",)
    hbm = p.hbm
    assert hbm.peak_position is None and hbm.timeline_bytes == ()
    assert [b.name for b in hbm.live_at_peak if b.kind == "temporary"] == ["act.0", "act.1", "act.2", "act.3"]


def test_programs_come_largest_first_and_an_error_joins_the_one_it_matches(tmp_path):
    small = write_adam_dump(tmp_path / "small", layers=2)
    large = write_adam_dump(tmp_path / "large", layers=13, live_activations=2)
    compiled = load_dumps([small, large])
    error = OomError("hbm", "hbm-temporaries", 17 * 2**30, 16 * 2**30, "m")  # 17 GiB: the 13-layer step's 17408 MiB
    out = program_memories(compiled, [error])
    assert [p.hbm_peak_bytes for p in out] == [17408 * MIB, (2 * 640 + 256 + 2 * 640 + 2 * 256) * MIB]
    assert out[0].error is error and out[1].error is None
    # joined, the error gives the usable HBM and its required size the peak
    assert (out[0].hbm_usable_bytes, out[0].usable_source) == (16 * 2**30, "compiler error")
    assert out[0].does_not_fit and out[0].first == "donation"
    # the bundled example is nobody's program: its errors join none
    assert all(p.error is None for p in program_memories(replace(compiled, oom_errors_joinable=False), [error]))


def test_the_memory_report_folds_small_programs_and_analyses_an_unjoined_error_alone(tmp_path):
    compiled = load_dumps([write_adam_dump(tmp_path / "step", layers=4)])
    small = replace(program_memories(compiled)[0], module="jit_convert", spaces=())
    large = program_memories(compiled)[0]
    error = OomError("hbm", "hbm-temporaries", 40 * 2**30, 16 * 2**30, "m")  # no program is 40 GiB
    report = error_report("in", (error,), (small, large), ("note",))
    assert [p.module for p in report.programs] == ["jit_step", "jit_convert"]  # largest first
    assert report.folded == (1,)  # the program of no HBM peak (under 1 MiB) folds into one line
    assert [a.error for a in report.standalone] == [error] and report.warnings == ("note",)
    assert error_report("in", (), (small,)).folded == ()  # nothing large: none folded
    full = memory_report("in", compiled, [error])
    assert full.warnings == ("--error: its size (40 GiB) matches no program of the input (the largest peaks at "
                             "6.25 GiB): not joined",)
    empty = memory_report("in", replace(compiled, hlo=()))
    assert empty.programs == () and empty.warnings == (
        "no compiled program with a buffer assignment: dump with XLA_FLAGS=--xla_dump_to=DIR (or `tpudiag "
        "compile`) to see device memory",)


def test_a_gpu_programs_hbm_size_comes_from_the_trace_then_the_allocator(tmp_path):
    compiled = load_dumps([write_adam_dump(tmp_path / "step", layers=4, target=False)])
    [p] = program_memories(compiled)
    assert with_gpu_memory((p,), 0) == (p,)  # no memory_size in the trace: unchanged
    [gpu] = with_gpu_memory((p,), 80 << 30)
    assert (gpu.hbm_capacity_bytes, gpu.capacity_source, gpu.hbm_usable_bytes) == (80 << 30, GPU_MEMORY_SOURCE, None)
    known = replace(p, hbm_capacity_bytes=16 << 30)
    assert with_gpu_memory((known,), 80 << 30) == (known,)  # a chip's own figure stays
    report = error_report("in", (), (gpu,))
    assert with_allocator_capacity(report, [0, -1]) is report  # no allocator measured a capacity
    [measured] = with_allocator_capacity(report, [70 << 30, 79 << 30]).programs
    assert (measured.hbm_capacity_bytes, measured.hbm_usable_bytes) == (80 << 30, 79 << 30)  # the largest measured
    assert (measured.usable_source, measured.capacity_source) == ("the allocator's measured capacity",
                                                                  GPU_MEMORY_SOURCE)
    [alone] = with_allocator_capacity(error_report("in", (), (p,)), [79 << 30]).programs
    assert (alone.hbm_capacity_bytes, alone.capacity_source) == (79 << 30, "measured by the allocator")
    usable = replace(p, hbm_usable_bytes=15 << 30)
    assert with_allocator_capacity(error_report("in", (), (usable,)), [79 << 30]).programs == (usable,)


@pytest.mark.parametrize("layers", [1, 3])
def test_the_peak_is_the_sum_of_its_parts(tmp_path, layers):
    """Arguments, outputs, temporaries and constants add up to the compiler's own `Total bytes`."""
    hbm = _program(tmp_path, layers=layers).hbm
    assert hbm.argument_bytes + hbm.output_bytes + hbm.temp_bytes + hbm.constant_bytes == hbm.reported_total_bytes
    assert hbm.peak_bytes == (layers * 640 * 2 + 256 + 256 * layers) * MIB


def _value(name, size, shape="f32[2048]{0}"):
    from tpudiag.model.compiled import BufferValue

    return BufferValue(0, name, size, 0, shape)


def _allocation(index, values, **kw):
    from tpudiag.model.compiled import BufferAllocation

    flags = dict(color=0, parameter_number=None, is_output=False, maybe_live_out=False, is_thread_local=False,
                 is_temp=False, is_constant=False) | kw
    return BufferAllocation(index, max(v.size_bytes for v in values), values=tuple(values), **flags)


def _borrowing_program(live_ranges=True, out_bytes=8192):
    """An output buffer (`out`, 8 KiB) that lends its space to a temporary `t1` (12 KiB, live at 5)
    before `out` is written, and a heap whose `b` (8 KiB, live 0-1) the compiler rematerialised
    as `b.remat` (live 6-7) to fit; `a` (8 KiB) lives 1-4. An argument `p0` of `out`'s shape."""
    from tpudiag.model.compiled import CompiledProgram, Computation

    allocations = (
        _allocation(0, [_value("p0", out_bytes)], parameter_number=0),
        _allocation(1, [_value("t1", 12288), _value("tiny", 100), _value("out", out_bytes)], maybe_live_out=True),
        _allocation(2, [_value("a", 8192), _value("b", 8192), _value("b.remat", 8192)], is_temp=True),
    )
    ranges = {"p0{}": (0, 8), "t1{}": (5, 5), "tiny{}": (5, 5), "out{}": (6, 8), "a{}": (1, 4), "b{}": (0, 1),
              "b.remat{}": (6, 7)}
    main = Computation("main", True, (), "")  # no instructions: nothing names the arguments' order
    return CompiledProgram("jit_g", "g.txt", "hlo_text", "main", True, {"main": main}, {}, allocations=allocations,
                           live_ranges=ranges if live_ranges else {}, live_range_positions=8 if live_ranges else 0)


def test_donation_is_less_what_the_temporaries_heap_grows_back():
    from tpudiag.analysis.device_memory import _grows_back, _levers, _space

    program = _borrowing_program()
    hbm = _space(program, 0, list(program.allocations), None)
    # the heap now, by position 0..8: b; b + a; a, a, a; nothing; b.remat, b.remat; nothing: peak 16 KiB at 1
    assert hbm.timeline_bytes == (8192, 16384, 8192, 8192, 8192, 0, 8192, 8192, 0) and hbm.peak_position == 1
    # donated, `t1` needs its own 12 KiB at 5, and `b` is kept from 2 to 7 instead of rematerialised:
    # the heap at 5 is 12 + 8 = 20 KiB, 4 KiB over today's peak
    assert _grows_back(program, hbm, {"out"}) == 4096
    assert _grows_back(program, hbm, {"p0"}) == 0  # not an output buffer: lends nothing
    p = SimpleNamespace(workload="inference", mesh_devices=1)
    [donation] = _levers(program, hbm, p)
    assert (donation.key, donation.saving_bytes, donation.buffers) == ("donation", 8192 - 4096, ("out",))
    assert donation.title == "donate p0: 1 output has an argument's shape and could reuse it"
    assert donation.fix == "donate the arguments p0 (`donate_argnums`)"  # no entry parameters to number them
    assert donation.explanation == (
        "the outputs that could reuse a same-shaped argument's buffer, less 4 KiB the temporaries' heap is "
        "modelled to grow: temporaries that borrow those outputs' buffers before the outputs are written need "
        "room of their own, and values the compiler rematerialised to fit (`.remat`) are kept instead")
    assert donation.precondition == "1 output with an argument's shape, that argument not donated"
    # 4 KiB of outputs that would grow the heap by 4 KiB: nothing to gain, no lever
    small = _borrowing_program(out_bytes=4096)
    assert _levers(small, _space(small, 0, list(small.allocations), None), p) == []
    # a training step on a 4-device mesh whose state `p0` the program does not name: no sharding known, no FSDP
    training = SimpleNamespace(workload="training", mesh_devices=4)
    # (and half the 16 KiB of temporaries at the peak, `a` and `b`, for a smaller microbatch)
    assert [(lv.key, lv.saving_bytes) for lv in _levers(program, hbm, training)] == [("donation", 4096),
                                                                                     ("microbatch", 8192)]


def test_without_live_ranges_every_borrowed_value_counts():
    from tpudiag.analysis.device_memory import _grows_back, _space

    program = _borrowing_program(live_ranges=False)
    hbm = _space(program, 0, list(program.allocations), None)
    assert hbm.timeline_bytes == () and hbm.peak_position is None
    assert _grows_back(program, hbm, {"out"}) == 12288  # t1; `tiny` is under 4 KiB
    # the output buffer's value at the peak is the last to be live: `out` (listed last, no ranges)
    assert [b.name for b in hbm.live_at_peak if b.kind == "output"] == ["out"]


def test_the_memory_report_joins_its_errors_and_notes_programs_without_buffers(tmp_path):
    compiled = load_dumps([write_adam_dump(tmp_path / "step", layers=13, live_activations=2)])
    error = OomError("hbm", "hbm-temporaries", 17 * 2**30, 16 * 2**30, "m")  # the step's 17408 MiB
    report = memory_report("in.pb", compiled, [error])
    assert report.input_path == "in.pb" and report.warnings == () and report.standalone == ()
    assert report.programs[0].error is error  # joined, so not analysed alone
    assert memory_report("in.pb", compiled).warnings == ()  # programs and no error: nothing to say
    # programs given are used as given; a dumped program without a buffer assignment says why
    given = (replace(report.programs[0], module="jit_given"),)
    unbuffered = SimpleNamespace(program=SimpleNamespace(allocations=(), warnings=["`x`: no buffer assignment"]))
    buffered = SimpleNamespace(program=SimpleNamespace(allocations=(1,), warnings=["kept quiet"]))
    other = replace(error, required_bytes=40 * 2**30)
    bundled = SimpleNamespace(hlo=[unbuffered, buffered], oom_errors_joinable=False)
    report = memory_report("in.pb", bundled, [other], programs=given)
    assert [p.module for p in report.programs] == ["jit_given"]
    assert report.warnings == ("`x`: no buffer assignment", "--error: analysed on its own: the bundled example is "
                                                            "not the program that ran out of memory")
    assert [a.error for a in report.standalone] == [other]


OOM_TEXT = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (17.00G) "
            "exceeds available HBM (15.75G).")


def _compile_output(tmp_path, result: dict, kernels=None):
    """A `tpudiag compile` output: the XLA dump in `xla/`, `result.json` and, with `kernels`, the compiled
    program's `compiled.hlo.txt` (the one that carries the backend configs)."""
    import json

    root = tmp_path / "out"
    write_adam_dump(root / "xla", layers=2)
    (root / "result.json").write_text(json.dumps(result))
    if kernels:
        src = write_adam_dump(tmp_path / "compiled", layers=2, kernels=kernels)
        (root / "compiled.hlo.txt").write_text(next(src.glob("*.after_optimizations.txt")).read_text())
    return root


def test_a_compile_outputs_result_gives_the_compilers_peak_and_its_error(tmp_path):
    ok = _compile_output(tmp_path / "ok", {"module": "jit_step", "status": "ok", "peak_memory_in_bytes": 12345})
    [p] = program_memories(load_dumps([ok]))
    assert p.compiler_peak_bytes == 12345 and p.error is None
    other = _compile_output(tmp_path / "other", {"module": "jit_other", "peak_memory_in_bytes": 12345})
    assert program_memories(load_dumps([other]))[0].compiler_peak_bytes is None  # another program's result
    failed = _compile_output(tmp_path / "failed", {"module": "jit_step", "status": "compile_error", "detail": OOM_TEXT})
    [p] = program_memories(load_dumps([failed]))
    assert (p.error.kind, p.error.required_bytes) == ("hbm-temporaries", 17 * 2**30)
    assert (p.hbm_usable_bytes, p.usable_source, p.does_not_fit) == (int(15.75 * 2**30), "compiler error", True)
    message = _compile_output(tmp_path / "message", {"module": "jit_step", "status": "compile_error",
                                                     "message": OOM_TEXT})
    assert program_memories(load_dumps([message]))[0].error.kind == "hbm-temporaries"  # `message` when no detail
    plain = _compile_output(tmp_path / "plain", {"module": "jit_step", "status": "compile_error", "detail": "bad"})
    assert program_memories(load_dumps([plain]))[0].error is None  # an error that is no OOM


def test_a_compile_outputs_kernels_scoped_vmem_comes_from_its_compiled_text(tmp_path):
    out = _compile_output(tmp_path, {"module": "jit_step", "status": "ok"}, kernels={"k.1": 4096})
    [p] = program_memories(load_dumps([out]))
    assert [(v.op, v.scoped_bytes, v.source, v.kernel) for v in p.vmem_ops] == [
        ("k.1", 4096, "HLO backend_config", True)]
    bare = _compile_output(tmp_path / "bare", {"module": "jit_step", "status": "ok"})
    assert program_memories(load_dumps([bare]))[0].vmem_ops == ()  # no compiled.hlo.txt beside it


def test_a_compile_output_already_read_is_not_read_again(tmp_path):
    from tpudiag.parsers.hlo_text import load_hlo_text

    out = _compile_output(tmp_path, {"module": "jit_step", "status": "ok"}, kernels={"k.1": 4096})
    compiled = load_dumps([out])
    text = load_hlo_text(out / "compiled.hlo.txt")
    (out / "compiled.hlo.txt").unlink()
    (out / "result.json").unlink()  # what was read stands in for both files
    read = SimpleNamespace(facts={"module": "jit_step", "peak_memory_in_bytes": 7}, program=text)
    [p] = program_memories(compiled, outputs={out: read})
    assert p.compiler_peak_bytes == 7 and [v.op for v in p.vmem_ops] == ["k.1"]
    # a compiled text read from elsewhere is not this output's
    elsewhere = SimpleNamespace(facts=read.facts, program=replace(text, path=str(tmp_path / "compiled.hlo.txt")))
    [p] = program_memories(compiled, outputs={out: elsewhere})
    assert p.compiler_peak_bytes == 7 and p.vmem_ops == ()


def _buffer(name, kind, size, op_name="", shape="f32[2048]{0}", number=None, aliased=False):
    from tpudiag.model.memory import MemoryBuffer

    return MemoryBuffer(name, name, kind, size, size, shape, op_name, "", 0, parameter_number=number, aliased=aliased)


def test_remat_takes_forward_activations_only_and_only_in_training():
    from tpudiag.analysis.device_memory import _levers
    from tpudiag.model.memory import SpaceMemory

    live = (_buffer("fwd", "temporary", 8192, "jit(f)/jvp(layer)/dot"),
            _buffer("bwd", "temporary", 16384, "jit(f)/transpose(jvp(layer))/dot"),
            _buffer("plain", "temporary", 4096, "jit(f)/add"))
    hbm = SpaceMemory("hbm", 0, 28672, 0, 0, 28672, 0, 0, None, live, None)
    program = _borrowing_program()
    training = {lv.key: lv for lv in _levers(program, hbm, SimpleNamespace(workload="training", mesh_devices=1))}
    assert (training["remat"].saving_bytes, training["remat"].buffers) == (8192, ("fwd",))
    assert training["microbatch"].saving_bytes == 28672 // 2
    assert _levers(program, hbm, SimpleNamespace(workload="inference", mesh_devices=1)) == []


def test_optimiser_state_is_named_so_or_mirrors_the_first_arguments_dims():
    from tpudiag.analysis.device_memory import _optimiser_state

    args = [_buffer("w.1", "argument", 256, "w[0]", "f32[8,8]{1,0}", 0, True),
            _buffer("s1.1", "argument", 256, "s1[0]", "f32[8,8]{1,0}", 1, True),  # the first root's dims
            _buffer("s2.1", "argument", 16, "s2[0]", "f32[4]{0}", 2, True),  # neither
            _buffer("nu.1", "argument", 16, "'nu'[0]", "f32[4]{0}", 3, True),  # named so, quoted
            _buffer("w.2", "argument", 16, "w[1]", "f32[2,2]{1,0}", 4, True),  # the first root's own
            _buffer("b.1", "argument", 256, "b", "f32[8,8]{1,0}", 5)]  # not returned: not state
    assert [a.name for a in _optimiser_state(args, [])] == ["s1.1", "nu.1"]
    assert _optimiser_state(args[-1:], []) == []


def test_a_scoped_vmem_error_gives_the_limit_and_an_hbm_errors_padding_joins_the_levers(tmp_path):
    from tpudiag.model.memory import OomAllocation

    compiled = load_dumps([write_adam_dump(tmp_path / "step", layers=13, live_activations=2)])
    scoped = OomError("vmem", "scoped", 40 * MIB, 32 * MIB, "m", hlo="act.0")  # names an op of the step
    [p] = program_memories(compiled, [scoped])
    assert p.error is scoped and (p.vmem_scoped_limit_bytes, p.vmem_limit_source) == (32 * MIB, "compiler error")
    capacity = replace(scoped, kind="capacity")  # not the scoped limit: the default stands
    [p] = program_memories(compiled, [capacity])
    assert (p.vmem_scoped_limit_bytes, p.vmem_limit_source) == (16 * MIB, "default for v5e, measured")
    # an HBM error's padded allocation adds its padding lever to the program's own
    padded = OomAllocation(1, 98_304, "f32[18,1000]{1,0:T(8,128)}", unpadded_bytes=72_000, padding_bytes=26_304,
                           instruction="fusion.1", allocation_type="HLO temp")
    hbm = OomError("hbm", "hbm-temporaries", 17 * 2**30, 16 * 2**30, "m", allocations=(padded,))
    [p] = program_memories(compiled, [hbm])
    assert [(lv.key, lv.saving_bytes) for lv in p.levers if lv.key in ("padding", "temporaries")] == [
        ("padding", 26_304)]  # the error's other levers (its temporaries) are the program's to give
