"""Buffer assignments, live ranges and memory reports whose numbers are impossible (issue 33).

Counts, positions and sizes read from a side file are checked against the file's size and
physical limits before they size anything: a damaged side file is a warning naming it, and the
rest of the dump still reads. Each case was seen: a `MemoryError` from `HloLiveRange (max
99999999999999)`, 801 MB and 31 s for `max 30000000`, an `OverflowError` in `units.fmt_bytes`
for a 401-digit allocation size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.memory_dumps import PREFIX, write_adam_dump
from tpudiag.parsers.hlo_text import parse_buffer_assignment, parse_live_ranges, parse_memory_usage

LIVE = f"{PREFIX}.after_optimizations-live-range.txt"
BUFFERS = f"{PREFIX}.after_optimizations-buffer-assignment.txt"
USAGE = f"{PREFIX}.after_optimizations-memory-usage-report.txt"


def tpudiag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "140"})


def memory(*args: str) -> subprocess.CompletedProcess:
    return tpudiag("memory", *args)


def _damaged(root: Path, name: str, pattern: str, replacement: str) -> Path:
    dump = write_adam_dump(root, 2)
    path = dump / name
    text, n = re.subn(pattern, replacement, path.read_text(), count=1)
    assert n == 1
    path.write_text(text)
    return dump


@pytest.mark.parametrize("name, pattern, replacement, cause, fmt", [
    (LIVE, r"max \d+", "max 99999999999999", "positions in a file of", "terminal"),
    (LIVE, r"max \d+", "max 30000000", "positions in a file of", "json"),
    (BUFFERS, r"size \d+", "size " + "9" * 401, "negative or past 1 PiB", "terminal"),
    (BUFFERS, r"size=\d+", "size=" + "9" * 30, "negative or past 1 PiB", "json"),
    (USAGE, r"Total bytes: \d+", "Total bytes: " + "9" * 401, "past 1 PiB", "terminal"),
])
def test_an_impossible_side_file_is_a_warning_naming_it(tmp_path, name, pattern, replacement, cause, fmt):
    dump = _damaged(tmp_path / "dump", name, pattern, replacement)
    out = memory(str(dump), "--format", fmt)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    text = "".join((out.stdout + out.stderr).split())  # the terminal wraps long paths anywhere
    assert "".join(cause.split()) in text and name in text
    if fmt == "json":
        programs = json.loads(out.stdout)["programs"]  # none when the buffer assignment was refused
        assert len(programs) == (name != BUFFERS)
        assert all(0 <= s["peak_bytes"] < 1 << 60 for p in programs for s in p["spaces"])


@pytest.mark.parametrize("fmt", ["md", "json"])
def test_the_report_of_a_dump_with_an_impossible_live_range_max_finishes(tmp_path, fmt):
    # `max 30000000` made a 30-million-entry timeline: 801 MB and 31 s with json, markdown unfinished
    dump = _damaged(tmp_path / "dump", LIVE, r"max \d+", "max 30000000")
    out = tpudiag("report", str(dump), "--format", fmt)
    assert out.returncode in (0, 1), out.stderr  # 1: findings at --fail-on
    assert "Traceback" not in out.stderr
    assert "positions in a file of" in out.stdout + out.stderr


def test_a_live_range_file_as_long_as_its_max_still_reads(tmp_path):
    text = "HloLiveRange (max 3):\n  InstructionSequence:\n    0:a\n    1:b\n    2:c\n  BufferLiveRange:\n    a{}:0-3\n"
    assert parse_live_ranges(text) == ({"a{}": (0, 3)}, 3)


# --- bounded fuzzing of the side-file readers: a result or a ValueError, never anything else ---

TOKENS = st.sampled_from(["allocation ", "0", "1", "7", "9" * 25, "-1", ": ", "size ", ", ", "parameter ",
                          "maybe-live-out", "preallocated-temp", "\n", " value: <", " @0> (size=", ",offset=",
                          "): f32[2]{0}", "HloLiveRange (max ", "):", "  BufferLiveRange:\n", "    a{}:", "-",
                          "Memory Space: hbm (color=", ")\n", "Total bytes: ", "\u00b2", " "])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TOKENS, max_size=40).map("".join))
def test_side_file_text_parses_or_is_a_value_error(text):
    for parse in (parse_buffer_assignment, parse_live_ranges, parse_memory_usage):
        try:
            result = parse(text)
        except ValueError:
            continue
        if parse is parse_buffer_assignment:
            assert all(0 <= a.size_bytes <= 1 << 50 for a in result)
        elif parse is parse_live_ranges:
            assert 0 <= result[1] <= text.count("\n") + 1


@pytest.mark.parametrize("text", ["bf16[" + "9" * 401 + ",8]{1,0}", "f32[" + "9" * 5000 + "]", "f32[8]{" + "9" * 5000 + "}"])
def test_a_shape_with_an_absurd_dimension_is_a_shape_error(text):
    # Found by the fuzzing below: the refusal formatted the size as a float (OverflowError), and a
    # 5,000-digit dimension passed int()'s digit limit (ValueError)
    from tpudiag.parsers.layout import ShapeSyntaxError, parse_shape

    with pytest.raises(ShapeSyntaxError):
        parse_shape(text)


# --- `tpudiag memory --pprof` and a capture's allocator events, as a user runs them ---

def _pprof_cases(tmp_path: Path) -> dict[str, bytes]:
    import gzip

    from tests.parsers.test_pprof import _profile

    big = (1 << 63) - 1
    return {
        "totals past int64": _profile({1: 1}, [([1], (1, big), "tpu:0"), ([1], (1, big), "tpu:1")]),
        "a gzip bomb": gzip.compress(bytes((64 << 20) + 1)),
    }


@pytest.mark.parametrize("case, cause", [("totals past int64", "pass int64"), ("a gzip bomb", "decompression bomb")])
def test_a_hostile_pprof_is_one_line_naming_it(tmp_path, case, cause):
    prof = tmp_path / "m.prof"
    prof.write_bytes(_pprof_cases(tmp_path)[case])
    out = memory("--pprof", str(prof))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    first = out.stderr.strip().splitlines()[0]
    assert first.startswith("error:") and str(prof) in first and cause in first


def test_a_unicode_digit_device_and_a_long_location_read_from_the_command_line(tmp_path):
    from tests.parsers.test_pprof import _profile

    prof = tmp_path / "m.prof"
    n = 2000  # one location of n lines named n times: n * n frames before the fix
    prof.write_bytes(_profile({1: n}, [([1] * n, (1, 64), "tpu:\u00b2"), ([1], (2, 128), "tpu:1")]))
    out = memory("--pprof", str(prof), "--format", "json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    live = json.loads(out.stdout)["live_buffers"]
    assert live["total_bytes"] == 192 and {d["device"] for d in live["devices"]} == {"tpu:\u00b2", "tpu:1"}


def test_allocator_figures_past_any_memory_are_dropped_not_printed_wrapped(tmp_path):
    from tests.parsers.test_allocator_events import _one_stat_events

    run = tmp_path / "logdir" / "plugins" / "profile" / "r"
    run.mkdir(parents=True)
    _one_stat_events(run / "h.xplane.pb", [4096, (1 << 63) - 1, -5, 8192])
    out = memory(str(tmp_path / "logdir"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    text = out.stdout + out.stderr
    assert "2 allocator events dropped" in " ".join(text.split())
    assert not re.search(r"-\d[\d.]* ?(B|KiB|MiB|GiB)\b|-\d[\d.]* ?%", text)  # no negative figure anywhere
