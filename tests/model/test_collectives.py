"""ICI traffic of a collective, modelled from its HLO text: group, algorithm and bytes per device."""

from __future__ import annotations

import pytest

from tpudiag.model.collectives import GroupSource, ring_factor, traffic


@pytest.mark.parametrize("family, n, factor", [("all-gather", 4, 0.75), ("reduce-scatter", 2, 0.5),
                                               ("all-reduce", 4, 1.5), ("all-to-all", 8, 0.875),
                                               ("collective-permute", 2, 1.0), ("all-reduce", 1, 0.0)])
def test_ring_factors(family, n, factor):
    assert ring_factor(family, n) == factor


def test_stated_replica_groups_win():
    t = traffic("all-reduce", "%ar = f32[1024]{0} all-reduce(f32[1024]{0} %x), replica_groups={{0,1},{2,3}}",
                "", default_group=8)
    assert (t.group_size, t.group_source) == (2, GroupSource.REPLICA_GROUPS)
    assert t.bytes_per_device == 4096  # 2 x (2-1)/2 x 4 KiB


def test_an_all_gather_without_groups_shows_its_group_in_its_shapes():
    t = traffic("all-gather", "%ag = bf16[4,3072]{1,0} all-gather(bf16[4,1536]{1,0} %f)", "", default_group=4)
    assert (t.group_size, t.group_source) == (2, GroupSource.SHAPES)
    assert t.bytes_per_device == 4 * 3072 * 2 / 2


def test_a_v5e_async_collective_is_the_all_gather_its_tuple_shows():
    text = ("%async-collective-start = (bf16[1024,512]{1,0:T(8,128)(2,1)S(1)}, bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)}, "
            "s32[2]{0:S(4)}, u32[]{:S(2)}) fusion(bf16[1024,512]{1,0:T(8,128)(2,1)S(1)} %copy)")
    t = traffic("collective", text, "", default_group=4)
    assert (t.family, t.group_size, t.group_source) == ("all-gather", 2, GroupSource.SHAPES)
    assert t.bytes_per_device == 1024 * 1024  # half of the 2 MiB gathered array


def test_a_result_shape_alone_assumes_every_chip_and_says_so():
    t = traffic("reduce-scatter", "%rs = f32[1024,16384]{1,0} fusion()", "", default_group=4)
    assert (t.group_size, t.group_source) == (4, GroupSource.ASSUMED)
    assert t.payload_bytes == 4 * 1024 * 16384 * 4  # the scattered result is a quarter of the payload


def test_a_small_collective_far_below_peak_is_latency_bound():
    from tpudiag.model.collectives import latency_bound
    # 12 KiB per device at 180 GB/s would take 68 ns; it took 2.1 µs: latency-bound.
    assert latency_bound(12 * 1024, 2_100_000, 180e9)
    # 96 MiB at 162 GB/s: bandwidth, not latency.
    assert not latency_bound(96 * 2**20, 620_000_000, 360e9)
    assert not latency_bound(12 * 1024, 2_100_000, None)
