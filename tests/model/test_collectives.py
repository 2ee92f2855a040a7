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


def test_latency_bound_needs_both_conditions_and_each_is_strict():
    from tpudiag.model.collectives import ICI_LATENCY_PS, latency_bound
    assert ICI_LATENCY_PS == 2_000_000  # 2 µs
    # 12 KiB at 180 GB/s takes 68,267 ps at peak (under 2 µs) but it took 100 ns: it reached 68 % of
    # the peak, above a tenth, so it is not latency-bound (both conditions, not either).
    assert not latency_bound(12 * 1024, 100_000, 180e9)
    # 2 MB at 1 TB/s takes exactly 2 µs at peak: not *less* than the latency, however slow it was.
    assert not latency_bound(2_000_000, 1_000_000_000, 1e12)
    # 1 MB at 1 TB/s takes 1 µs at peak; over 10 µs it reached exactly a tenth: not *under* a tenth.
    assert not latency_bound(1_000_000, 10_000_000, 1e12)
    assert latency_bound(1_000_000, 10_000_001, 1e12)


# Each expectation worked by hand: bytes per device = ring factor x payload, the payload the larger
# of result and operand (f32[1024] is 4096 B), ring factors 2(n-1)/n (all-reduce), (n-1)/n (ring).
@pytest.mark.parametrize(("family", "text", "result_text", "default_group", "expected"), [
    # v5e's generic async collective takes the family its shapes show: equal sizes are an all-reduce
    ("collective", "%c = f32[1024]{0} fusion(f32[1024]{0} %x)", "", 4,
     ("all-reduce", 4, GroupSource.ASSUMED, 4096, 6144)),
    # a smaller result is a reduce-scatter, its group the 4:1 ratio of the shapes
    ("collective", "%c = f32[256]{0} fusion(f32[1024]{0} %x)", "", 8,
     ("reduce-scatter", 4, GroupSource.SHAPES, 4096, 3072)),
    # an all-gather to 3x its operand gathers from 3 devices
    ("all-gather", "%g = f32[3072]{0} all-gather(f32[1024]{0} %x)", "", 8,
     ("all-gather", 3, GroupSource.SHAPES, 12288, 8192)),
    # ratios 1.5 and 1 tell no group: every chip of the host is assumed
    ("all-gather", "%g = f32[1536]{0} all-gather(f32[1024]{0} %x)", "", 8,
     ("all-gather", 8, GroupSource.ASSUMED, 6144, 5376)),
    ("all-gather", "%g = f32[1024]{0} all-gather(f32[1024]{0} %x)", "", 8,
     ("all-gather", 8, GroupSource.ASSUMED, 4096, 3584)),
    # a one-chip host sends nothing
    ("all-reduce", "%r = f32[1024]{0} all-reduce(f32[1024]{0} %x)", "", 0,
     ("all-reduce", 1, GroupSource.ASSUMED, 4096, 0)),
    # stated groups win over the shapes' ratio, and the payload stays the larger array
    ("reduce-scatter", "%s = f32[256]{0} reduce-scatter(f32[1024]{0} %x), replica_groups={{0,1}}", "", 8,
     ("reduce-scatter", 2, GroupSource.REPLICA_GROUPS, 4096, 2048)),
    ("all-gather", "%g = f32[4096]{0} all-gather(f32[1024]{0} %x), replica_groups={{0,1}}", "", 8,
     ("all-gather", 2, GroupSource.REPLICA_GROUPS, 16384, 8192)),
    # a named family keeps its algorithm whatever its shapes
    ("all-to-all", "%a = f32[1024]{0} all-to-all(f32[1024]{0} %x), replica_groups={{0,1,2,3}}", "", 8,
     ("all-to-all", 4, GroupSource.REPLICA_GROUPS, 4096, 3072)),
    # only a result shape (the trace's): an all-gather's result is its whole payload
    ("all-gather", "", "f32[1024]{0}", 4, ("all-gather", 4, GroupSource.ASSUMED, 4096, 3072)),
])
def test_traffic_table(family, text, result_text, default_group, expected):
    t = traffic(family, text, result_text, default_group=default_group)
    assert (t.family, t.group_size, t.group_source, t.payload_bytes, t.bytes_per_device) == expected


@pytest.mark.parametrize(("text", "size"), [
    ("replica_groups=mesh['x'=2,'y'=4] {'y'}", 4),
    ("replica_groups=mesh['x'=2,'y'=4] {'x','y'}", 8),
    ("replica_groups=mesh['x'=2,'y'=4] {}", 8),         # no axis named: the whole mesh
    ("replica_groups=mesh['x'=2,'y'=4] {'z'}", 1),      # an axis the mesh lacks adds no devices
    ("replica_groups=mesh[ 'data' = 3 ] {'data'}", 3),  # spaces around the names
    ("replica_groups=[2,4]<=[8]", 4),                   # iota: 2 groups of 4
    ("replica_groups=[8]<=[8]", 8),
    ("replica_groups={{0,1,2,3},{4,5,6,7}}", 4),
    ("replica_groups={{ 0, 1 }}", 2),
    ("replica_groups={{}}", None),
    ("channel_id=1", None),
])
def test_replica_group_size_in_each_printed_form(text, size):
    from tpudiag.model.collectives import replica_group_size
    assert replica_group_size(f"%x = f32[8]{{0}} all-reduce(f32[8]{{0}} %y), {text}") == size


def test_a_one_device_group_sends_nothing_whatever_the_family():
    assert ring_factor("collective-permute", 1) == 0.0
    assert ring_factor("all-gather", 1) == 0.0
