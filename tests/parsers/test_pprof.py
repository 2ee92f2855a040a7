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

from tests.memory_captures import pprof_bytes
from tpudiag.analysis.live_buffers import attribute
from tpudiag.errors import InputError
from tpudiag.parsers.pprof import parse_device_memory_profile, read_device_memory_profile

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
    assert sample.stack[0].location == "model.py:7"


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
