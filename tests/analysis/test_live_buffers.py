"""`analysis.live_buffers` on profiles built here: stacks whose frames are JAX's own or the user's,
as `jax.profiler.save_device_memory_profile` records them (innermost location first), and the
totals each table and device should get, added up by hand."""

from __future__ import annotations

import pytest

from tpudiag.analysis.live_buffers import attribute, attributed_frame, is_jax_frame
from tpudiag.errors import InputError
from tpudiag.model.live_buffers import BufferSample, DeviceMemoryProfile, SourceFrame, StackLocation

JAX = SourceFrame("dispatch", "/venv/lib/python3.11/site-packages/jax/_src/dispatch.py", 90)
JAXLIB = SourceFrame("call", "/venv/lib/python3.11/site-packages/jaxlib/xla_client.py", 12)
TRAIN = SourceFrame("step", "/home/me/train.py", 40)
MODEL = SourceFrame("layer", "/home/me/model.py", 7)


def _sample(stack, device="tpu:0", buffers=1, nbytes=64, kind="buffer"):
    return BufferSample(kind, device, buffers, nbytes, stack)


@pytest.mark.parametrize(("path", "jax"), [
    ("/venv/lib/python3.11/site-packages/jax/_src/api.py", True),
    ("/usr/lib/python3/dist-packages/jaxlib/xla.py", True),
    ("C:\\venv\\Lib\\site-packages\\jax\\numpy.py", True),
    ("/src/jax/jax/_src/core.py", True),  # a source checkout of jax
    ("/opt/build/jaxlib/init.py", True),
    ("/home/me/jax_models/train.py", False), ("/home/me/site-packages-notes/jax.py", False),
    ("/home/me/train.py", False),
])
def test_jax_frames_are_told_by_their_file(path, jax):
    assert is_jax_frame(SourceFrame("f", path, 1)) is jax


def test_a_sample_is_attributed_to_its_innermost_frame_outside_jax():
    inner = StackLocation((JAX, JAXLIB))
    user = StackLocation((JAX, MODEL, TRAIN))  # an inlined JAX frame before the user's line
    assert attributed_frame((inner, user)) == (MODEL, False)
    assert attributed_frame((StackLocation(()), StackLocation((JAX,)), StackLocation((JAXLIB,)))) == (JAX, True)
    assert attributed_frame(()) == (None, True)
    memo = {}
    assert attributed_frame((inner, user), memo) == (MODEL, False)
    assert memo == {id(inner): None, id(user): MODEL}  # each location's first frame outside JAX, remembered


def test_live_bytes_by_line_largest_first_with_totals_per_device():
    model, train, jax_only = StackLocation((JAX, MODEL)), StackLocation((TRAIN,)), StackLocation((JAX, JAXLIB))
    profile = DeviceMemoryProfile("mem.prof", (
        _sample((model,), "tpu:0", 2, 1000),
        _sample((model, train), "tpu:10", 1, 500),  # the same line on another device
        _sample((train,), "tpu:9", 3, 1500),
        _sample((jax_only,), "tpu:0", 1, 100),
        _sample((), "tpu:2", 4, 100),  # no stack at all
        _sample((train,), "", 2, 4096, kind="executable"),  # loaded programs: counted apart
        _sample((train,), "", 1, 0, kind="executable"),
    ))
    live = attribute(profile)
    rows = [tuple(r) for r in live.by_line[["file", "line", "function", "buffers", "bytes", "devices",
                                             "internal"]].itertuples(index=False)]
    assert rows == [
        ("/home/me/model.py", 7, "layer", 3, 1500, 2, False),  # 1000 + 500 on tpu:0 and tpu:10
        ("/home/me/train.py", 40, "step", 3, 1500, 1, False),  # equal bytes: by file name
        # equal bytes again: by file (`/` sorts before `<`)
        (JAX.file, 90, "dispatch", 1, 100, 1, True),
        ("<no stack>", 0, "", 4, 100, 1, True),
    ]
    # devices by platform, then ordinal as a number: tpu:9 before tpu:10
    assert [(d.device, d.buffers, d.bytes) for d in live.by_device] == [
        ("tpu:0", 3, 1100), ("tpu:2", 4, 100), ("tpu:9", 3, 1500), ("tpu:10", 1, 500)]
    assert (live.total_bytes, live.total_buffers) == (3200, 11)
    assert (live.executables, live.executable_bytes, live.path) == (3, 4096, "mem.prof")


def test_lines_of_equal_bytes_sort_by_file_then_line_and_odd_devices_by_name():
    def at(file, line):
        return (StackLocation((SourceFrame("f", file, line),)),)

    profile = DeviceMemoryProfile("p", (
        _sample(at("/b.py", 1), "gpu", 1, 8),  # no ordinal
        _sample(at("/a.py", 9), "cpu:x", 2, 8),  # an ordinal that is no number
        _sample(at("/a.py", 3), "cpu:1", 3, 8),
        _sample(at("/z.py", 1), "cpu:1", 1, 9),  # the most bytes: first, whatever its name
    ))
    live = attribute(profile)
    assert list(zip(live.by_line["file"], live.by_line["line"])) == [("/z.py", 1), ("/a.py", 3), ("/a.py", 9),
                                                                     ("/b.py", 1)]
    # `cpu:1` as ("cpu", 1); the others by their whole name, with -1: ("cpu:x", -1), ("gpu", -1)
    assert [d.device for d in live.by_device] == ["cpu:1", "cpu:x", "gpu"]
    # the ordinal is after the last colon
    labels = ("host:tpu:10", "host:tpu:9")
    live = attribute(DeviceMemoryProfile("p", tuple(_sample((), d) for d in labels)))
    assert [d.device for d in live.by_device] == ["host:tpu:9", "host:tpu:10"]
    # a label without an ordinal sorts before the numbered ones of its name
    live = attribute(DeviceMemoryProfile("p", (_sample((), "cpu:0"), _sample((), "cpu"))))
    assert [d.device for d in live.by_device] == ["cpu", "cpu:0"]


def test_an_empty_profile_has_no_rows_and_a_total_just_within_int64_is_kept():
    live = attribute(DeviceMemoryProfile("p", ()))
    assert live.by_line.empty and live.by_device == () and live.total_bytes == 0
    big = (1 << 63) - 1
    kept = attribute(DeviceMemoryProfile("p", (_sample((), "tpu:0", 1, big),)))
    assert kept.total_bytes == big
    with pytest.raises(InputError) as err:
        attribute(DeviceMemoryProfile("p", (_sample((), "tpu:0", 1, big), _sample((), "tpu:0", 1, 1))))
    assert err.value.path == "p" and err.value.one_line() == (
        "`p`: damaged pprof profile (its buffer or byte totals pass int64: more than any device holds)")
    with pytest.raises(InputError, match="pass int64"):  # executables' bytes count too
        attribute(DeviceMemoryProfile("p", (_sample((), "", 1, big + 1, kind="executable"),)))


def test_a_profile_file_is_read_and_attributed_to_its_lines(tmp_path):
    from tests.memory_captures import pprof_bytes
    from tpudiag.analysis.live_buffers import live_bytes_of

    path = tmp_path / "memory.prof"
    path.write_bytes(pprof_bytes(values=(2, 128)))  # two buffers of 128 bytes in all, made at model.py:7 on tpu:0
    live = live_bytes_of(path)
    assert (live.path, live.total_buffers, live.total_bytes) == (str(path), 2, 128)
    assert live.by_line[["file", "line", "buffers", "bytes"]].values.tolist() == [["model.py", 7, 2, 128]]
