"""JAX's device memory profile (pprof) read and attributed to source lines.

The real profile is made by `jax.profiler.save_device_memory_profile` on the CPU backend, in a
child process running a script whose lines allocate known buffers; the test then checks the
bytes the tool gives each of those lines.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests.memory_captures import pprof_bytes
from tpudiag.analysis.live_buffers import attribute
from tpudiag.errors import InputError
from tpudiag.parsers.pprof import parse_device_memory_profile, read_device_memory_profile
from tpudiag.proto import PprofProfile

# Each line says what stays alive from it; line numbers are 1-based positions in this text.
ALLOCATING_SCRIPT = textwrap.dedent("""\
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    a = jnp.ones((1024, 256), jnp.float32)  # line 3: 1 MiB
    b = jnp.zeros((512,), jnp.bfloat16)  # line 4: freed below, so not live
    c = [jnp.full((256, 256), i, jnp.float32) for i in range(3)]  # line 5: 3 x 256 KiB
    def make():
        return jnp.arange(1000, dtype=jnp.int32)  # line 7: 4,000 bytes, made inside make()
    d = make()
    e = jax.jit(lambda x: x * 2)(a)  # line 9: 1 MiB, a jitted program's output
    mesh = Mesh(jax.devices(), ("x",))
    s = jax.device_put(jnp.zeros((64, 128), jnp.float32), NamedSharding(mesh, P("x")))  # line 11: 16 KiB per device
    del b
    jax.block_until_ready((a, c, d, e, s))
    jax.profiler.save_device_memory_profile(sys.argv[1])
""")
EXPECTED = {  # line -> (function, buffers, bytes, devices)
    3: ("<module>", 1, 1 << 20, 1),
    5: ("<listcomp>", 3, 3 * (256 << 10), 1),
    7: ("make", 1, 4000, 1),
    9: ("<module>", 1, 1 << 20, 1),
    11: ("<module>", 2, 2 * (32 * 128 * 4), 2),
}


@pytest.fixture(scope="module")
def real_profile(tmp_path_factory) -> tuple[Path, Path]:
    pytest.importorskip("jax", reason="making a device memory profile needs jax (the tpu extra)")
    root = tmp_path_factory.mktemp("pprof")
    script = root / "allocate.py"
    script.write_text(ALLOCATING_SCRIPT)
    out = root / "memory.prof"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, timeout=300,
                   capture_output=True)
    return script, out


def test_live_bytes_are_attributed_to_the_lines_that_made_them(real_profile):
    script, path = real_profile
    live = attribute(read_device_memory_profile(path))
    ours = live.by_line[live.by_line["file"] == str(script)]
    got = {int(r.line): (r.function, int(r.buffers), int(r.bytes), int(r.devices)) for r in ours.itertuples()}
    assert got == EXPECTED
    # Nothing else was alive, and line 4's buffer, deleted, is not there.
    assert len(live.by_line) == len(EXPECTED)
    assert live.total_bytes == sum(v[2] for v in EXPECTED.values())
    assert live.total_buffers == sum(v[1] for v in EXPECTED.values())
    # Device totals: cpu:1 holds only its shard of line 11.
    totals = {d.device: (d.buffers, d.bytes) for d in live.by_device}
    assert totals["cpu:1"] == (1, 32 * 128 * 4)
    assert sum(b for _, b in totals.values()) == live.total_bytes
    assert list(live.by_line["bytes"]) == sorted(live.by_line["bytes"], reverse=True)
    assert live.executables >= 1  # the jitted lambda and the ops' programs are loaded too


def test_a_plain_uncompressed_profile_reads_the_same(real_profile):
    _, path = real_profile
    plain = parse_device_memory_profile(gzip.decompress(path.read_bytes()), "plain.pb")
    assert plain.samples == read_device_memory_profile(path).samples


def test_a_small_built_profile_reads_back():
    prof = parse_device_memory_profile(pprof_bytes())
    (sample,) = prof.samples
    assert (sample.kind, sample.device, sample.buffers, sample.bytes) == ("buffer", "tpu:0", 1, 64)
    assert next(sample.frames()).location == "model.py:7"


def test_an_executable_of_unknown_size_is_read_as_such():
    # PJRT backends that cannot size generated code report -1 per executable (here 3 of them).
    prof = parse_device_memory_profile(pprof_bytes(values=(3, -3), kind="executable"))
    (sample,) = prof.samples
    assert (sample.kind, sample.buffers, sample.bytes, sample.size_known) == ("executable", 3, 0, False)
    live = attribute(prof)
    assert (live.executables, live.executable_bytes, live.total_bytes) == (3, 0, 0)


@pytest.mark.parametrize("data, cause", [
    (b"", "empty file"),
    (b"\x1f\x8b\x08\x00garbage", "damaged gzip"),
    (b"\xff\xff\xff", "does not parse"),
    (pprof_bytes(sample_types=(("cpu", "nanoseconds"),), values=(5,)), "without a bytes sample type"),
    (pprof_bytes(function_id=9), "names no function"),
    (pprof_bytes(location_id=4), "names no location"),
    (pprof_bytes(values=(1,)), "1 values for 2 sample types"),
    (pprof_bytes(values=(1, -5)), "negative"),
])
def test_bad_profiles_are_one_input_error_naming_the_file(data, cause):
    with pytest.raises(InputError, match=cause) as err:
        parse_device_memory_profile(data, "bad.prof")
    assert err.value.path == "bad.prof"


def test_a_trace_file_is_not_taken_for_a_profile(small_capture):
    trace = next(small_capture.rglob("*.xplane.pb"))
    with pytest.raises(InputError):
        read_device_memory_profile(trace)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_give_a_profile_or_an_input_error(data):
    try:
        parse_device_memory_profile(data)
    except InputError:
        pass


def _profile(locations: dict[int, int], samples: list[tuple[list[int], tuple[int, int], str]],
             file: str = "model.py") -> bytes:
    """A gzipped pprof profile: `locations` maps a location id to its number of lines (each a frame
    of function `f` in `file`), `samples` are (location ids, (count, bytes), device label)."""
    p = PprofProfile()
    p.string_table.extend(["", "allocations", "count", "space", "bytes", "f", file, "kind", "buffer", "device"])
    p.sample_type.add(type=1, unit=2)
    p.sample_type.add(type=3, unit=4)
    p.function.add(id=1, name=5, filename=6)
    for lid, n_lines in locations.items():
        loc = p.location.add(id=lid)
        for i in range(n_lines):
            loc.line.add(function_id=1, line=i + 1)
    for ids, values, device in samples:
        s = p.sample.add(location_id=ids, value=list(values))
        s.label.add(key=7, str=8)
        p.string_table.append(device)
        s.label.add(key=9, str=len(p.string_table) - 1)
    return gzip.compress(p.SerializeToString())


def test_a_long_location_named_over_and_over_costs_its_size_not_its_square():
    # Regression (issue 33): one location of N lines named N times by one sample made N * N frames
    # (a 332-byte file took 56 s and 2.37 GB at N = 20,000). Each location's frames are now held
    # once and shared, and attribution looks at each location once.
    n = 3000
    data = _profile({1: n}, [([1] * n, (1, 64), "tpu:0")])
    tracemalloc.start()
    try:
        prof = parse_device_memory_profile(data, "long.prof")
        live = attribute(prof)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (sample,) = prof.samples
    assert len(sample.stack) == n and len({id(loc) for loc in sample.stack}) == 1  # one shared location
    assert len(sample.stack[0].frames) == n
    assert live.by_line["line"].tolist() == [1] and live.total_bytes == 64
    inflated = len(gzip.decompress(data))
    # Linear: about 20 bytes of Python objects per byte read (its frames); the N * N stack alone
    # would be 72 MB here, 3,000 times the input.
    assert peak < 100 * inflated, (peak, inflated)


def test_byte_totals_past_int64_are_refused_naming_the_file():
    big = (1 << 63) - 1
    data = _profile({1: 1}, [([1], (1, big), "tpu:0"), ([1], (1, big), "tpu:1")])
    prof = parse_device_memory_profile(data, "huge.prof")
    with pytest.raises(InputError, match="pass int64") as err:
        attribute(prof)
    assert err.value.path == "huge.prof"


def test_a_device_label_of_unicode_digits_sorts_without_error():
    # `²`.isdigit() is True but int("²") fails: such a label sorts by its name
    data = _profile({1: 1}, [([1], (1, 10), "tpu:\u00b2"), ([1], (1, 10), "tpu:1"), ([1], (1, 10), "tpu:\u0663")])
    live = attribute(parse_device_memory_profile(data, "odd.prof"))
    assert {d.device for d in live.by_device} == {"tpu:\u00b2", "tpu:1", "tpu:\u0663"}


def test_a_gzip_bomb_is_refused_naming_the_file(monkeypatch):
    from tpudiag.parsers import input_files

    monkeypatch.setattr(input_files, "default_limits", lambda: input_files.ReadLimits(max_inflated_bytes=1 << 16))
    monkeypatch.setattr("tpudiag.parsers.pprof.default_limits", input_files.default_limits)
    with pytest.raises(InputError, match="decompression bomb") as err:
        parse_device_memory_profile(gzip.compress(bytes(1 << 20)), "bomb.prof")
    assert err.value.path == "bomb.prof"


@settings(max_examples=150, deadline=None)
@given(locations=st.dictionaries(st.integers(0, 6), st.integers(0, 5), max_size=4),
       samples=st.lists(st.tuples(st.lists(st.integers(0, 7), max_size=6),
                                  st.tuples(st.sampled_from([0, 1, -1, (1 << 63) - 1, -(1 << 63)]),
                                            st.sampled_from([0, 64, -1, -3, (1 << 63) - 1, -(1 << 63)])),
                                  st.sampled_from(["tpu:0", "tpu:\u00b2", "", "cpu:1", ":", "tpu:-1"])),
                        max_size=5))
def test_built_profiles_attribute_or_are_one_input_error(locations, samples):
    # Property: whatever the references, values and labels, a profile reads and attributes to
    # non-negative totals that fit int64, or is one InputError naming the file.
    try:
        live = attribute(parse_device_memory_profile(_profile(locations, samples), "p.prof"))
    except InputError as exc:
        assert exc.path == "p.prof"
        return
    assert 0 <= live.total_bytes < 1 << 63 and 0 <= live.total_buffers < 1 << 63
    assert all(d.bytes >= 0 for d in live.by_device)
