"""Bounded fuzzing of the memory inputs (issue 33, item 8): JAX's pprof device memory profile,
the allocator's events in a capture, and an XLA dump's buffer assignment, live ranges and memory
usage report.

Each starts from a valid input built in code and mutates it (bytes for the binary formats, lines
and numbers for the text ones). Whatever comes out must be a result whose figures are possible
byte counts (never negative, never past int64) or one `InputError` naming the file; for a dump's
side files, a warning and the rest of the dump. The default run is bounded (`FUZZ_EXAMPLES`
each); `TPUDIAG_FUZZ_EXAMPLES=5000` runs a longer campaign with the same tests. OOM texts are
fuzzed with the memory lane's `--error` tests.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.memory_captures import played_capture, pprof_bytes
from tests.memory_dumps import PREFIX, write_adam_dump
from tpudiag.analysis.device_memory import memory_report
from tpudiag.analysis.live_buffers import attribute
from tpudiag.analysis.memory_timeline import host_memory_timeline
from tpudiag.errors import InputError
from tpudiag.parsers.allocator_events import read_allocator_events
from tpudiag.parsers.dump_dir import load_dumps
from tpudiag.parsers.pprof import parse_device_memory_profile

FUZZ_EXAMPLES = int(os.environ.get("TPUDIAG_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
INT64_MAX = (1 << 63) - 1


@st.composite
def mutated(draw, data: bytes, max_edits: int = 4) -> bytes:
    """`data` with a few bytes overwritten, inserted or deleted, or cut short."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, max_edits))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        how = draw(st.sampled_from(["set", "insert", "delete", "cut"]))
        if how == "set":
            out[at] = draw(st.integers(0, 255))
        elif how == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=10))
        elif how == "delete":
            del out[at:at + draw(st.integers(1, 8))]
        else:
            del out[at:]
    return bytes(out)


# --- pprof ---

PROFILE = gzip.decompress(pprof_bytes(values=(3, 3 << 20)))


@FUZZ
@given(data=mutated(PROFILE), compress=st.booleans())
def test_mutated_pprof_profiles_attribute_or_are_one_input_error(data, compress):
    try:
        live = attribute(parse_device_memory_profile(gzip.compress(data) if compress else data, "m.prof"))
    except InputError as exc:
        assert exc.path == "m.prof"
        return
    assert 0 <= live.total_bytes <= INT64_MAX and 0 <= live.total_buffers <= INT64_MAX
    assert all(0 <= d.bytes <= INT64_MAX for d in live.by_device)
    assert (live.by_line["bytes"] >= 0).all()


# --- allocator events ---

@pytest.fixture(scope="module")
def capture_bytes(tmp_path_factory) -> bytes:
    return played_capture(tmp_path_factory.mktemp("alloc") / "h.xplane.pb").read_bytes()


@FUZZ
@given(seed=st.randoms(use_true_random=False), edits=st.integers(1, 6))
def test_mutated_allocator_captures_give_possible_figures_or_one_input_error(tmp_path, capture_bytes, seed, edits):
    data = bytearray(capture_bytes)
    for _ in range(edits):  # overwrite bytes at random (the capture is too large to draw byte by byte)
        data[seed.randrange(len(data))] = seed.randrange(256)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(bytes(data))
    try:
        host = read_allocator_events(path)
    except InputError as exc:
        assert exc.path == str(path)
        return
    for t in host_memory_timeline(host).allocators:
        assert 0 <= t.peak_bytes <= t.capacity_bytes <= INT64_MAX
        assert t.peak_heap_bytes >= 0 and t.peak_stack_bytes >= 0 and t.lifetime_peak_bytes >= 0
        assert all(a.allocation_bytes >= 0 and a.occurrences >= 1 for a in t.at_peak)
        assert (t.timeline["in_use_bytes"] >= 0).all()


# --- buffer assignment, live ranges, memory usage report ---

SIDE_FILES = ("-buffer-assignment.txt", "-live-range.txt", "-memory-usage-report.txt")
NUMBERS = st.sampled_from(["0", "-1", "1", "99999999999999", "9" * 30, "9" * 401, "9" * 5000, "\u00b2", "", "18446744073709551615"])


@pytest.fixture(scope="module")
def dump_texts(tmp_path_factory) -> dict[str, str]:
    root = write_adam_dump(tmp_path_factory.mktemp("dump") / "d", 2)
    return {p.name: p.read_text() for p in root.iterdir()}


@st.composite
def mutated_side_file(draw, text: str) -> str:
    """`text` with numbers replaced by hostile ones, and lines dropped or repeated."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["number", "number", "drop", "repeat"]))
        if how == "number":
            spans = [m.span() for m in re.finditer(r"\d+", lines[i])]
            if spans:
                a, b = draw(st.sampled_from(spans))
                lines[i] = lines[i][:a] + draw(NUMBERS) + lines[i][b:]
        elif how == "drop":
            del lines[i]
        else:
            lines.insert(i, lines[i])
        if not lines:
            break
    return "\n".join(lines) + "\n"


@FUZZ
@given(data=st.data(), which=st.sampled_from(SIDE_FILES))
def test_mutated_side_files_give_possible_memory_or_a_warning(tmp_path, dump_texts, data, which):
    root = tmp_path / "dump"
    root.mkdir(exist_ok=True)
    for name, text in dump_texts.items():
        if name.endswith(which):
            text = data.draw(mutated_side_file(text))
        (root / name).write_text(text)
    report = memory_report(str(root), load_dumps([root]))
    for program in report.programs:
        for space in program.spaces:
            assert 0 <= space.peak_bytes <= INT64_MAX
            assert len(space.timeline_bytes) <= len(dump_texts[f"{PREFIX}.after_optimizations-live-range.txt"]) + 10
            assert all(b.size_bytes >= 0 for b in space.live_at_peak)
