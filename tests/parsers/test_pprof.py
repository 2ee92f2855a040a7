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
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

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


def _profile_bytes(sample_types=(("allocations", "count"), ("space", "bytes")), values=(1, 64),
                   function_id=1, location_id=1) -> bytes:
    p = PprofProfile()
    strings = [""]

    def s(text: str) -> int:
        strings.append(text)
        return len(strings) - 1

    for t, u in sample_types:
        p.sample_type.add(type=s(t), unit=s(u))
    p.function.add(id=1, name=s("f"), filename=s("model.py"))
    p.location.add(id=1).line.add(function_id=function_id, line=7)
    sample = p.sample.add(location_id=[location_id], value=list(values))
    sample.label.add(key=s("kind"), str=s("buffer"))
    sample.label.add(key=s("device"), str=s("tpu:0"))
    p.string_table.extend(strings)
    return gzip.compress(p.SerializeToString())


def test_a_small_built_profile_reads_back():
    prof = parse_device_memory_profile(_profile_bytes())
    (sample,) = prof.samples
    assert (sample.kind, sample.device, sample.buffers, sample.bytes) == ("buffer", "tpu:0", 1, 64)
    assert sample.stack[0].location == "model.py:7"


@pytest.mark.parametrize("data, cause", [
    (b"", "empty file"),
    (b"\x1f\x8b\x08\x00garbage", "damaged gzip"),
    (b"\xff\xff\xff", "does not parse"),
    (_profile_bytes(sample_types=(("cpu", "nanoseconds"),), values=(5,)), "without a bytes sample type"),
    (_profile_bytes(function_id=9), "names no function"),
    (_profile_bytes(location_id=4), "names no location"),
    (_profile_bytes(values=(1,)), "1 values for 2 sample types"),
    (_profile_bytes(values=(1, -5)), "negative"),
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
