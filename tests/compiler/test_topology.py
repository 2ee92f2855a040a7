"""Topology names: what libtpu accepts, what tpudiag knows about each generation."""

from __future__ import annotations

import pytest

from tpudiag.compiler.topology import TOPOLOGY_RULE, default_mesh_shape, parse_topology
from tpudiag.errors import UsageError


@pytest.mark.parametrize(("name", "generation", "dims", "devices"), [
    ("v5e:2x2", "v5e", (2, 2), 4),
    ("v6e:4x4", "v6e", (4, 4), 16),
    ("v5p:2x2x1", "v5p", (2, 2, 1), 4),
    ("v4:2x2x1", "v4", (2, 2, 1), 8),  # one device per TensorCore on v4
    ("TPU7x:2x2x1", "TPU7x", (2, 2, 1), 8),  # two devices per chip
    ("tpu7x:2x2x2", "TPU7x", (2, 2, 2), 16),
    ("v5e_2x2", "v5e", (2, 2), 4),  # libtpu's rule also allows `_` and `=`
    ("v5p=4x4x4_twisted", "v5p", (4, 4, 4), 64),
])
def test_valid_names(name, generation, dims, devices):
    topo = parse_topology(name)
    assert (topo.generation, topo.dims, topo.expected_devices) == (generation, dims, devices)


@pytest.mark.parametrize("name", ["v5e-8", "v5litepod-16", "v5e", "v5e:2y2", ":2x2", "v5e:2x2_twist"])
def test_names_failing_the_rule_quote_it(name):
    with pytest.raises(UsageError) as info:
        parse_topology(name)
    assert TOPOLOGY_RULE in info.value.one_line()
    assert info.value.hint


def test_unknown_generation_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown TPU generation 'v7x'") as info:
        parse_topology("v7x:2x2x1")  # libtpu rejects it too: `Invalid TPU external name: TPU v7x`
    assert "TPU7x" in info.value.hint


def test_zero_dimension_and_empty_dimension_are_rejected():
    with pytest.raises(UsageError, match="zero dimension"):
        parse_topology("v5e:0x2")
    with pytest.raises(UsageError, match="bad chip grid"):
        parse_topology("v5e:2xx2")


def test_static_profile_support_and_clock_follow_the_measurements():
    assert [parse_topology(n).static_profile_supported for n in ("v5e:2x2", "v5p:2x2x1", "v6e:2x2")] == [True] * 3
    assert not parse_topology("v4:2x2x1").static_profile_supported  # aborts: DMA latency model
    assert not parse_topology("TPU7x:2x2x1").static_profile_supported  # aborts on real programs
    assert parse_topology("v5e:2x2").clock_hz == 1.5e9
    assert parse_topology("v5p:2x2x1").clock_hz == 1.75e9
    assert parse_topology("v6e:2x2").clock_hz is None  # not public
    assert parse_topology("v6e:1x1").single_chip


@pytest.mark.parametrize(("n", "shape"), [(4, {"data": 2, "model": 2}), (8, {"data": 4, "model": 2}),
                                          (1, {"data": 1, "model": 1}), (3, {"data": 3, "model": 1})])
def test_default_mesh_uses_every_device(n, shape):
    assert default_mesh_shape(n) == shape


@pytest.mark.parametrize(("name", "spelled", "dims"), [
    ("v5e:1", "v5e:1x1", (1, 1)), ("v6e:1", "v6e:1x1", (1, 1)), ("v5p:1", "v5p:1x1x1", (1, 1, 1)),
    ("tpu7x:1", "tpu7x:1x1x1", (1, 1, 1)),
])
def test_one_chip_is_spelled_as_the_grid_libtpu_accepts(name, spelled, dims):
    # libtpu 0.10.2 rejects `v5e:1` ("Invalid topology layout for a single slice: 1") and accepts
    # `v5e:1x1` (checked with jax.experimental.topologies.get_topology_desc).
    topo = parse_topology(name)
    assert (topo.name, topo.dims, topo.single_chip) == (spelled, dims, True)


def test_a_bare_count_of_several_chips_asks_for_a_grid():
    with pytest.raises(UsageError, match="a chip count, not a grid") as info:
        parse_topology("v5e:4")
    assert "v5e:2x2" in info.value.hint
