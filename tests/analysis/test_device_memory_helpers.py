"""`analysis.device_memory`'s small readers and helpers on literal cases, each expectation from the
text it reads (an HLO `sharding=` attribute, a backend_config's `used_scoped_memory_configs`, a
layout's tile) or from the definition in its docstring."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tpudiag.analysis.device_memory import (EFFORT, _argument_root, _compiler_peak, _dims, _dtype, _kind, _op_group,
                                            _padded_dims_of, _padding_fix, _shards, _tile_of, _who, error_levers,
                                            first_lever, join_warnings, oom_analysis, used_scoped_vmem_bytes)
from tpudiag.model.memory import MemoryLever, OomAllocation, OomError, OomPart


@pytest.mark.parametrize(("config", "vmem"), [
    ('{"used_scoped_memory_configs":[{"memory_space":"1","size":"4096"},{"memory_space":"1","size":"100"}]}', 4196),
    ('{"used_scoped_memory_configs":[{"memory_space":1,"size":"4096"},{"memory_space":"0","size":"99"}]}', 4096),
    ('{"used_scoped_memory_configs":[{"memory_space":"1"}]}', 0),  # a config without a size holds none
    ('{"used_scoped_memory_configs":[{"memory_space":"2","size":"8"}]}', 0),  # VMEM only
    ('{"used_scoped_memory_configs":[]}', None),  # not stated yet (before the backend ran)
    ('{"used_scoped_memory_configs":null}', None),
    ('{"other":1}', None), ("", None),
    ("used_scoped_memory_configs but not json", None),
    ('{"used_scoped_memory_configs":[{"memory_space":"1","size":"x"}]}', None),
    ('["used_scoped_memory_configs"]', None),
])
def test_used_scoped_vmem_bytes(config, vmem):
    assert used_scoped_vmem_bytes(config) == vmem


@pytest.mark.parametrize(("sharding", "ways"), [
    ("{replicated}", 1), ("{maximal device=0}", 1), ("", None), ("   ", None),
    ("{devices=[4,1]0,1,2,3}", 4), ("{devices=[2,4]<=[8]}", 8),
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 2),  # the last dim's 4 replicate, not shard
    ("{devices=[1,2,4]<=[8] last_tile_dim_replicate}", 2),  # only the last dim is dropped
    ("{devices=[1000000,2]<=[2000000]}", 2),  # a count of 7 digits is no mesh: left out
    ("{devices=[999999,1]<=[999999]}", 999999),
    ("{devices=[1,1]0}", 1), ("{manual}", None),
    ("{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dims={replicated}}", 8),  # 'replicated' after devices: not replicated
])
def test_shards(sharding, ways):
    assert _shards(sharding) == ways


# 120 -> 128: a tile of 8 would not have padded 120 (a multiple of 8), so 128; 17 -> 32: a tile of 8 gives 24
@pytest.mark.parametrize(("size", "padded", "tile"), [(18, 128, 128), (100, 104, 8), (5, 8, 8), (120, 128, 128),
                                                      (17, 32, 16), (3, 4, 4), (1, 2, 2), (7, 9, 9), (128, 128, 128),
                                                      # a padding of exactly one tile is the next tile's
                                                      (40, 64, 32), (300, 512, 256), (600, 1024, 512), (128, 256, 256),
                                                      (32, 64, 64)])
def test_tile_of(size, padded, tile):
    assert _tile_of(size, padded) == tile


def test_padded_dims_and_the_fix():
    # f32[18,1000] in (8,128) tiles: 18 -> 24 (a multiple of 8), 1000 -> 1024 (of 128)
    assert _padded_dims_of("f32[18,1000]{1,0:T(8,128)}") == [(0, 18, 24), (1, 1000, 1024)]
    assert _padded_dims_of("not a shape") == [] and _padded_dims_of("(f32[2]{0}, f32[2]{0})") == []
    assert _padding_fix("f32[18,1000]{1,0:T(8,128)}", [(0, 18, 24), (1, 1000, 1024)]) == (
        "dim 0 (18 → 24): make it a multiple of 8; dim 1 (1000 → 1024): make it a multiple of 128")
    # a dim already a multiple of 128 (the largest of them) could be laid out minor-most instead
    assert _padding_fix("f32[256,512,3]{2,1,0:T(8,128)}", [(2, 3, 128)]) == (
        "dim 2 (3 → 128): make it a multiple of 128; or lay out dim 1 (512, a multiple of 128) minor-most "
        "(transpose it last, or fold the padded dims into it with a reshape)")
    assert _padding_fix("f32[100,3]{1,0:T(8,128)}", [(1, 3, 128)]) == "dim 1 (3 → 128): make it a multiple of 128"
    # 128 itself is a multiple of 128; of two such dims the larger is named, wherever it is
    assert _padding_fix("f32[128,3]{1,0:T(8,128)}", [(1, 3, 128)]).endswith("or lay out dim 0 (128, a multiple of "
                                                                            "128) minor-most (transpose it last, or "
                                                                            "fold the padded dims into it with a reshape)")
    assert "or lay out dim 0 (512, a multiple of 128)" in _padding_fix("f32[512,256,3]{2,1,0:T(8,128)}", [(2, 3, 128)])
    # a dim of 0 is a multiple of 128 but no dim to lay out minor-most
    assert _padding_fix("f32[0,3]{1,0:T(8,128)}", [(1, 3, 128)]) == "dim 1 (3 → 128): make it a multiple of 128"
    assert _padding_fix("bad", [(0, 3, 8)]) == "dim 0 (3 → 8): make it a multiple of 8"
    assert _padding_fix("f32[3]", []) == ("choose dims that are multiples of the layout's tile, or a layout that "
                                          "puts a large dim last")


@pytest.mark.parametrize(("op_name", "fallback", "root"), [
    ("params[0]", "p.1", "params"), ("opt.mu[2]", "p.1", "opt"), ("x", "p.1", "x"), ("", "p.1", "p"),
    ("[0]", "p.1", "[0]")])
def test_argument_root(op_name, fallback, root):
    assert _argument_root(op_name, fallback) == root


def test_shape_parts():
    # dims alone, whatever the dtype and layout (Adam's m and v beside the params they mirror)
    assert _dims("bf16[4,1024]{1,0:T(4,128)}") == _dims("f32[4,1024]{1,0}") == _dims("f32[4,1024]")
    assert _dims("f32[4,1024]{1,0}") != _dims("f32[4,512]{1,0}") and _dims("f32[]") != _dims("f32[1]")
    assert _dtype("bf16[4,1024]{1,0}") == "bf16"


def _lever(key: str, saving: int) -> MemoryLever:
    return MemoryLever(key, key, saving, "", "")


def test_first_lever_is_the_cheapest_that_is_enough_alone():
    levers = (_lever("fsdp", 100), _lever("remat", 50), _lever("donation", 10), _lever("padding", 49))
    assert first_lever(levers, 50).key == "remat"  # padding and donation are cheaper, not enough
    assert first_lever(levers, 10).key == "padding"
    assert first_lever(levers, 49).key == "padding"
    assert first_lever(levers, 101) is None and first_lever((), 1) is None
    assert EFFORT.index("padding") < EFFORT.index("donation") < EFFORT.index("remat") < EFFORT.index("fsdp")


def test_compiler_peak():
    assert _compiler_peak({"peak_memory_in_bytes": 1024}) == 1024
    assert _compiler_peak({"peak_memory_in_bytes": 0}) == 0
    assert _compiler_peak({"peak_memory_in_bytes": -1}) is None
    assert _compiler_peak({"peak_memory_in_bytes": "1024"}) is None and _compiler_peak({}) is None


def _alloc(**kw) -> SimpleNamespace:
    base = dict(parameter_number=None, is_constant=False, is_output=False, maybe_live_out=False, op_name="",
                instruction="", rank=3)
    return SimpleNamespace(**(base | kw))


def test_allocation_kinds_and_names():
    assert _kind(_alloc(parameter_number=0, is_output=True)) == "argument"
    assert _kind(_alloc(parameter_number=None, is_constant=True, is_output=True)) == "constant"
    assert _kind(_alloc(is_output=True)) == "output" and _kind(_alloc(maybe_live_out=True)) == "output"
    assert _kind(_alloc()) == "temporary"
    assert _who(_alloc(op_name="jit(f)/dot", instruction="dot.1")) == "`jit(f)/dot`"
    assert _who(_alloc(instruction="dot.1")) == "`dot.1`" and _who(_alloc()) == "allocation 3"
    assert _op_group(_alloc(op_name="resnet152/MaxPool_11")) == "resnet152/MaxPool"
    assert _op_group(_alloc(instruction="fusion.32")) == "fusion" and _op_group(_alloc()) == "allocation 3"


def _error(**kw) -> OomError:
    return OomError(**(dict(space="hbm", kind="hbm-temporaries", required_bytes=17 << 30, available_bytes=16 << 30,
                            message="m") | kw))


def test_join_warnings_say_why_each_error_joined_nothing():
    program = SimpleNamespace(error=None, hbm_peak_bytes=8 << 30)
    vmem = _error(space="vmem", hlo="fusion.9")
    named = _error(programs=("jit_step", "jit_eval"))
    sized = _error()
    assert join_warnings([vmem, named, sized], (program,)) == [
        "--error: the text names op `fusion.9`, which no program of the input has: not joined",
        "--error: the text names `jit_step`, `jit_eval`, which is not a program of the input: not joined",
        "--error: its size (17 GiB) matches no program of the input (the largest peaks at 8 GiB): not joined"]
    joined = SimpleNamespace(error=sized, hbm_peak_bytes=1)
    assert join_warnings([sized], (joined,)) == []
    assert join_warnings([sized], ()) == []
    assert join_warnings([sized], (), joinable=False) == [
        "--error: analysed on its own: the bundled example is not the program that ran out of memory"]
    assert join_warnings([_error(space="vmem")], (program,))[0].startswith("--error: its size")


MIB = 1 << 20


def _allocation(rank, size, shape="f32[4096,4096]{1,0}", **kw) -> OomAllocation:
    return OomAllocation(rank, size, shape, **kw)


# An OOM text's list, as `parsers.oom_error` reads it: sizes, layouts and padding as the compiler prints them.
LISTED = (
    # f32[18,1000] in (8,128) tiles: 24 x 1024 x 4 = 98,304 B for 72,000 B of data (1.37x)
    _allocation(1, 98_304, "f32[18,1000]{1,0:T(8,128)}", unpadded_bytes=72_000, padding_bytes=26_304,
                op_name="jit(step)/jvp()/dot_general", instruction="fusion.1", allocation_type="HLO temp"),
    _allocation(2, 64 * MIB, op_name="jit(step)/transpose(jvp())/dot_general", instruction="fusion.2",
                allocation_type="HLO temp"),  # no padding printed
    # the compiler's own expansion (12.6x) is shown, not recomputed; no op or instruction: its rank names it
    _allocation(3, 5 * MIB, "s32[5,3]{1,0:T(8,128)}", unpadded_bytes=60, padding_bytes=5 * MIB - 60, expansion=12.6,
                allocation_type="output"),
    # 40 MiB for 39 MiB of data: under 1.25x, no padding lever; two allocations of one op (`add_3`, `add_7`)
    _allocation(4, 40 * MIB, unpadded_bytes=39 * MIB, padding_bytes=MIB, op_name="jit(step)/add_3", allocation_type=""),
    _allocation(5, 40 * MIB, op_name="jit(step)/add_7", instruction="add.7", allocation_type=""),
    # exactly 1.25x (125 B for 100 B): padded enough; a layout without tiles names no dim
    _allocation(6, 125, "f32[31]{0}", unpadded_bytes=100, padding_bytes=25, instruction="copy.6",
                allocation_type="scoped"),
    # an unpadded size without the padding line: no padding lever (nothing printed to free)
    _allocation(7, 200, "f32[50]{0}", unpadded_bytes=100, instruction="copy.7", allocation_type="scoped"),
    # a 1-byte scalar in a 512-byte tile: 512x
    _allocation(8, 512, "pred[]{:T(512)}", unpadded_bytes=1, padding_bytes=511, instruction="compare.8",
                allocation_type="scoped"),
)


def test_the_levers_an_oom_text_supports_on_its_own():
    error = _error(allocations=LISTED, output_bytes=3 << 30, output_shared_bytes=1 << 30,
                   requirement=(OomPart("arguments", 6 << 30),))
    levers = error_levers(error)
    assert [(lv.key, lv.saving_bytes) for lv in levers] == [
        ("padding", 26_304), ("padding", 5 * MIB - 60), ("padding", 25), ("padding", 511), ("temporaries", 80 * MIB),
        ("donation", 2 << 30), ("remat", 98_304)]
    tiled, printed, untiled, scalar, temps, donation, remat = levers
    assert scalar.title == "`compare.8` `pred[]` is padded 512.0x by its layout"
    assert tiled.title == ("`jit(step)/jvp()/dot_general` `f32[18,1000]` is padded 1.4x by its layout "
                           "(dim 0: 18 → 24, dim 1: 1000 → 1024)")
    assert tiled.explanation == "the padding the compiler printed for this allocation (96 KiB for 70.3 KiB of data)"
    assert tiled.fix == "dim 0 (18 → 24): make it a multiple of 8; dim 1 (1000 → 1024): make it a multiple of 128"
    assert tiled.buffers == ("fusion.1",) and tiled.precondition == "the error lists it at 96 KiB with 25.7 KiB of padding"
    assert printed.title == "allocation 3 `s32[5,3]` is padded 12.6x by its layout (dim 0: 5 → 8, dim 1: 3 → 128)"
    assert printed.buffers == ("allocation 3",)
    assert untiled.title == "`copy.6` `f32[31]` is padded 1.2x by its layout"  # 1.25 shown at one decimal
    assert untiled.fix.startswith("choose dims that are multiples of the layout's tile")
    # the HLO temporaries (and those of no type) by op: add_3 and add_7 are one op, 80 MiB over fusion.2's 64
    assert temps.title == ("the largest temporaries by op: `jit(step)/add` holds 80 MiB in 2 of the listed "
                           "allocations")
    assert temps.buffers == ("add.7",) and temps.precondition == "2 HLO temporaries of `jit(step)/add` in the error's list"
    assert temps.explanation == "the listed temporaries of that op: the most that splitting or fusing it could free"
    assert temps.fix == "compute it in chunks (jax.lax.map or a scan over the batch), or in a narrower dtype"
    # outputs of 3 GiB, 1 GiB of them in argument buffers: 2 GiB could reuse the 6 GiB of arguments
    assert donation.precondition == "outputs of 3 GiB share 1 GiB with 6 GiB of arguments"
    assert donation.title == "donate the arguments whose updated value the program returns"
    assert donation.explanation == ("the outputs not sharing an argument's buffer, at most the arguments' size; only "
                                    "outputs with an argument's shape can reuse it")
    assert donation.fix == "jax.jit(step, donate_argnums=...) for the state the step returns"
    # the list names a backward pass (fusion.2) and one forward activation (fusion.1)
    assert remat.title == "rematerialise the 1 listed forward activations kept for the backward pass"
    assert remat.buffers == ("fusion.1",)
    assert remat.explanation == ("the listed forward activations (the list holds only the largest); recomputing "
                                 "them costs their FLOPs again")
    assert remat.fix == ("wrap the layer in jax.checkpoint (policy=jax.checkpoint_policies.dots_saveable, or "
                         "nothing_saveable for the most memory)")
    assert remat.precondition == "the list names a backward pass (`transpose(jvp(...))`) and forward activations"


def test_donation_from_an_oom_text_is_at_most_the_arguments_and_needs_unshared_outputs():
    def donation(**kw):
        return [lv.saving_bytes for lv in error_levers(_error(**kw)) if lv.key == "donation"]

    args = (OomPart("arguments", 1 << 30),)
    assert donation(output_bytes=3 << 30, requirement=args) == [1 << 30]  # nothing shared; 1 GiB of arguments
    # nothing said shared: all 3 GiB of outputs could reuse the 6 GiB of arguments
    [lever] = [lv for lv in error_levers(_error(output_bytes=3 << 30, requirement=(OomPart("arguments", 6 << 30),)))
               if lv.key == "donation"]
    assert lever.saving_bytes == 3 << 30 and lever.precondition == "outputs of 3 GiB share 0 B with 6 GiB of arguments"
    assert donation(output_bytes=3 << 30, output_shared_bytes=3 << 30, requirement=args) == []  # all shared
    assert donation(output_bytes=3 << 30, requirement=(OomPart("arguments", None),)) == []  # size unknown
    assert donation(output_bytes=3 << 30) == [] and donation(requirement=args) == []


def test_temporaries_of_equal_size_take_the_later_op_name_and_remat_needs_both_passes():
    tie = (_allocation(1, MIB, op_name="b"), _allocation(2, MIB, op_name="a"))
    [lever] = error_levers(_error(allocations=tie))
    assert lever.title.startswith("the largest temporaries by op: `b` holds 1 MiB in 1 ")
    [hlo_temp] = error_levers(_error(allocations=(_allocation(1, MIB, op_name="x", allocation_type="HLO temp"),)))
    assert (hlo_temp.key, hlo_temp.saving_bytes) == ("temporaries", MIB)
    assert hlo_temp.precondition == "1 HLO temporary of `x` in the error's list"  # one: singular
    forward_only = (_allocation(1, MIB, op_name="jit(f)/jvp()/dot", allocation_type="output"),)
    assert error_levers(_error(allocations=forward_only)) == []  # no backward pass, no temporary


def test_an_oom_text_alone_gets_its_cheapest_sufficient_lever():
    error = _error(allocations=LISTED, required_bytes=17 << 30, available_bytes=(17 << 30) - 30 * MIB)
    analysis = oom_analysis(error)
    assert analysis.error is error and [lv.key for lv in analysis.levers][:4] == ["padding"] * 4
    assert analysis.first == "temporaries"  # 30 MiB over: the padding levers free at most 5 MiB each
    exact = oom_analysis(replace(error, exceeded_by_bytes=80 * MIB - 1))
    assert exact.first == "temporaries"  # 80 MiB frees 80 MiB - 1 B, and one more byte
    assert oom_analysis(replace(error, exceeded_by_bytes=80 * MIB)).first == ""  # none frees 80 MiB + 1 B alone
    assert oom_analysis(replace(error, space="vmem")).levers == ()  # VMEM texts: no HBM levers
    assert oom_analysis(_error()).levers == () and oom_analysis(_error()).first == ""


def test_profile_memory_timelines_keep_the_hosts_order_and_add_the_unread_files():
    from tpudiag.analysis.memory_timeline import profile_memory_timelines
    from tpudiag.model.allocator import HostMemoryTimeline
    from tpudiag.model.profile import HostFailure

    a, b = (HostMemoryTimeline(host=h, path=h, allocators=(), warnings=()) for h in ("a", "b"))
    bad, unread = HostFailure("c", "damaged"), HostFailure("d", "unreadable")
    hosts = [SimpleNamespace(memory_timeline=t) for t in (b, bad, a)]
    assert profile_memory_timelines(SimpleNamespace(hosts=hosts, failures=[unread])) == ([b, a], [bad, unread])
    assert profile_memory_timelines(SimpleNamespace(hosts=[], failures=[unread])) is None  # not asked to
    assert profile_memory_timelines(SimpleNamespace(hosts=hosts + [SimpleNamespace(memory_timeline=None)],
                                                    failures=[])) is None


def _compiled(module, hbm_bytes, ops=(), vmem_bytes=0):
    """A program with one HBM allocation of `hbm_bytes` (and a VMEM one, which joins nothing)."""
    allocations = (SimpleNamespace(color=0, size_bytes=hbm_bytes), SimpleNamespace(color=1, size_bytes=vmem_bytes))
    found = {op: SimpleNamespace(op_name=f"jit(f)/{op}", custom_call_target="") for op in ops}
    return SimpleNamespace(module=module, allocations=allocations, find=found.get)


def test_an_error_joins_the_program_it_names_else_the_one_its_size_matches():
    from tpudiag.analysis.device_memory import joined_program

    small, large = _compiled("jit_a", 100 * MIB, ops=("fusion.9",)), _compiled("jit_b", 1000 * MIB, vmem_bytes=1 << 40)
    twin = _compiled("jit_a", 200 * MIB)  # a recompile of jit_a, larger: the one named
    programs = [small, large, twin]
    assert joined_program(_error(programs=("jit_a",)), programs) is twin
    assert joined_program(_error(programs=("jit_c",), required_bytes=1000 * MIB), programs) is None  # named, absent
    # VMEM: the program holding the op the text names, whatever its size
    assert joined_program(_error(space="vmem", kind="scoped", hlo="fusion.9"), programs) is small
    assert joined_program(_error(space="vmem", kind="scoped", hlo="fusion.1"), programs) is None
    assert joined_program(_error(space="vmem", kind="scoped", required_bytes=100 * MIB), programs) is None
    assert joined_program(_error(hlo="fusion.9", required_bytes=1000 * MIB), programs) is large  # HBM: by size
    # by HBM size, within 2 % of the text's required bytes, the closest
    assert joined_program(_error(required_bytes=1020 * MIB), programs) is large  # 1000 is 1.96 % under
    assert joined_program(_error(required_bytes=97 * MIB), programs) is None  # 100 MiB is 3.1 % over 97
    # exactly 2 % (2 MiB of 100 MiB, exact in binary) still joins
    assert joined_program(_error(required_bytes=100 * MIB), [_compiled("jit_z", 102 * MIB)]) is not None
    assert joined_program(_error(required_bytes=1030 * MIB), programs) is None  # 2.9 % off
    near = [_compiled("jit_x", 196 * MIB), twin, _compiled("jit_y", 203 * MIB)]
    assert joined_program(_error(required_bytes=200 * MIB), near) is twin  # exact beats 2 % and 1.5 % off
    assert joined_program(_error(required_bytes=200 * MIB), near[::2]) is near[2]  # 3 MiB off beats 4 MiB off
    # a runtime allocation failure's size is one buffer's, not a program's
    assert joined_program(_error(kind="hbm-allocation", required_bytes=100 * MIB), programs) is None


def test_scoped_vmem_per_op_is_its_largest_block_over_the_dumps():
    from tpudiag.analysis.device_memory import vmem_from_llo
    from tpudiag.model.llo import VMEM_ALLOCATIONS

    def dump(rows):
        return SimpleNamespace(vmem_allocations=VMEM_ALLOCATIONS.frame({
            "hlo": [r[0] for r in rows], "block": [0] * len(rows), "block_type": ["SCOPED"] * len(rows),
            "block_bytes": [r[1] for r in rows], "size_bytes": [r[1] for r in rows], "padding_bytes": [0] * len(rows),
            "shape": [""] * len(rows), "tag": [""] * len(rows), "is_spill": [False] * len(rows)}))

    program = _compiled("jit_f", 0, ops=("fusion.7",))
    uses = vmem_from_llo(program, [dump([("fusion.7", 3 * MIB), ("empty", 0)]), dump([("fusion.7", 2 * MIB)])])
    assert [(u.op, u.scoped_bytes, u.source, u.op_name, u.kernel) for u in uses] == [
        ("fusion.7", 3 * MIB, "LLO VMEM report", "jit(f)/fusion.7", False)]  # 0 bytes: not listed
    [one] = vmem_from_llo(program, [dump([("other.1", 1)])])  # one byte is listed
    # an op the program does not hold: no JAX name, not a kernel
    assert (one.op, one.scoped_bytes, one.op_name, one.kernel) == ("other.1", 1, "", False)
