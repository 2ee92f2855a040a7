"""`analysis.device_memory`'s small readers and helpers on literal cases, each expectation from the
text it reads (an HLO `sharding=` attribute, a backend_config's `used_scoped_memory_configs`, a
layout's tile) or from the definition in its docstring."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpudiag.analysis.device_memory import (EFFORT, _argument_root, _compiler_peak, _dims, _dtype, _kind, _op_group,
                                            _padded_dims_of, _padding_fix, _shards, _tile_of, _who, first_lever,
                                            join_warnings, used_scoped_vmem_bytes)
from tpudiag.model.memory import MemoryLever, OomError


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
    ("{devices=[1,1]0}", 1), ("{manual}", None),
    ("{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dims={replicated}}", 8),  # 'replicated' after devices: not replicated
])
def test_shards(sharding, ways):
    assert _shards(sharding) == ways


# 120 -> 128: a tile of 8 would not have padded 120 (a multiple of 8), so 128; 17 -> 32: a tile of 8 gives 24
@pytest.mark.parametrize(("size", "padded", "tile"), [(18, 128, 128), (100, 104, 8), (5, 8, 8), (120, 128, 128),
                                                      (17, 32, 16), (3, 4, 4), (1, 2, 2), (7, 9, 9), (128, 128, 128)])
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
