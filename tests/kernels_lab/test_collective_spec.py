"""Captured collectives -> the collective family: replica groups in their three printed forms, the
ring and shard from the HLO text, async start/done, near misses that stay refused."""

from __future__ import annotations

import pytest

from tpudiag.kernels_lab.collective_spec import replica_groups
from tpudiag.kernels_lab.spec import NotReproducible, infer, parse_array


@pytest.mark.parametrize(("text", "groups"), [
    ("replica_groups={{0,2},{1,3}}, use_global_device_ids=true", [[0, 2], [1, 3]]),
    ("replica_groups=[2,2]<=[4], use_global_device_ids=true", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%add", [[0, 2], [1, 3]]),
    ("replica_groups=[1,8]<=[8], dimensions={0}", [list(range(8))]),
    # mesh form (v5e dumps): a group varies the named axis, the others are fixed
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=2] {'axis_0'}, dimensions={0}", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2], device_ids=([2,2]T(1,0)) {'axis_2'}, "
     "dimensions={2}", [[0, 1], [2, 3]]),
])
def test_replica_groups_in_every_printed_form(text, groups):
    found = replica_groups(text)
    assert found is not None and found[0] == groups
    # invariant: the groups partition the devices
    flat = sorted(d for g in found[0] for d in g)
    assert flat == list(range(len(flat)))


def test_no_replica_groups_is_none():
    assert replica_groups("%all-reduce.3 = f32[8,128] all-reduce(%x), to_apply=%add") is None


def _infer(**kw):
    args = dict(name="all-reduce.4", category="all-reduce", shape_with_layout="", hlo_text="", tf_op="", flops=0.0,
                bytes_accessed=0.0, body="", operands=[], operands_from="")
    args.update(kw)
    return infer(**args)


def test_all_gather_on_a_minor_dim_from_a_v5e_dump_line():
    line = ("%all-gather.45 = bf16[8,128,1536]{2,1,0:T(8,128)(2,1)S(1)} all-gather(%all-reduce.4), channel_id=7, "
            "replica_groups=mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2], device_ids=([2,2]T(1,0)) {'axis_2'}, "
            "dimensions={2}, use_global_device_ids=true")
    family, problem, basis = _infer(name="all-gather.45", category="all-gather",
                                    shape_with_layout="bf16[8,128,1536]{2,1,0:T(8,128)(2,1)S(1)}", hlo_text=line)
    assert family == "collective"
    assert problem == dict(kind="all-gather", devices=2, rows=1024, cols=768, dtype="bfloat16", group=[0, 1],
                           mesh_axis="axis_2")
    assert any("gathered dim 2 is not the major dim" in b for b in basis)


def test_async_collective_start_takes_the_result_and_its_kind_from_the_body():
    tuple_shape = ("(bf16[8,128,3,2,128]{4,1,3,0,2}, bf16[8,128,3,4,128]{4,1,3,0,2}, s32[2]{0:S(4)}, "
                   "u32[]{:S(2)})")
    body = ("%fused_computation.198 (param_0.598: bf16[8,128,3,2,128]) -> (...) {\n"
            "  %all-gather.27 = bf16[8,128,3,4,128]{4,1,3,0,2} all-gather(%param_0.598), channel_id=30, "
            "replica_groups={{0,1},{2,3}}, dimensions={3}\n}")
    family, problem, _ = _infer(name="async-collective-start", category="async-collective-start",
                                shape_with_layout=tuple_shape, body=body)
    assert family == "collective" and problem["kind"] == "all-gather" and problem["devices"] == 2
    assert problem["rows"] * problem["cols"] == 8 * 128 * 3 * 2 * 128  # the shard: half the result


def test_all_reduce_with_rows_not_divisible_by_the_ring_is_padded():
    _, problem, basis = _infer(shape_with_layout="f32[9,128]{1,0}", hlo_text="replica_groups={{0,1,2,3}}")
    assert (problem["devices"], problem["rows"], problem["cols"]) == (4, 3, 128)
    assert any("padded to 12 rows" in b for b in basis)


def test_group_size_from_the_operand_when_no_replica_groups():
    _, problem, basis = _infer(name="all-gather.3", category="all-gather", shape_with_layout="bf16[64,256]{1,0}",
                               operands=[parse_array("bf16[16,256]{1,0}")], operands_from="the operands")
    assert problem["devices"] == 4 and problem["rows"] == 16
    assert any("from the output / operand sizes" in b for b in basis)


@pytest.mark.parametrize(("kw", "reason"), [
    # near misses: collectives the family does not cover, or nothing to move
    (dict(name="all-to-all.1", category="all-to-all", shape_with_layout="f32[8,128]"),
     "reproduces all-gather, reduce-scatter, all-reduce only"),
    (dict(name="collective-permute.2", category="collective-permute", shape_with_layout="f32[8,128]"),
     "reproduces all-gather, reduce-scatter, all-reduce only"),
    (dict(shape_with_layout="f32[]{:T(128)}"), "is a all-reduce of a scalar"),
    (dict(shape_with_layout="s32[8,128]{1,0}"), "of dtype s32"),
    (dict(shape_with_layout="f32[8,128]{1,0}", hlo_text="replica_groups={{0},{1}}"), "a group of one device"),
])
def test_collectives_the_family_cannot_take_say_why(kw, reason):
    with pytest.raises(NotReproducible) as exc:
        _infer(**kw)
    assert reason in exc.value.one_line() and "\n" not in exc.value.one_line()
