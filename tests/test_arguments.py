"""`diagnose()` and `compare()` refuse a wrong argument with one UsageError sentence naming it.

Each bad value here used to reach the pipeline: an AttributeError (`chip=5`), a TypeError
(`jobs='4'`, `progress=5`), a ValueError from inside the static timeline (`clock_ghz=nan`), or
nothing at all (`jobs=0`, `clock_ghz=-1` accepted; `dumps="dir"` read as the directories `d`,
`i`, `r`). The near misses (None, a numpy integer, an int clock) must still be accepted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tpudiag import compare, diagnose
from tpudiag.arguments import check_clock_ghz, check_dumps, check_jobs
from tpudiag.errors import InputError, UsageError

BAD = [
    ("chip", 5, "chip must be a TPU generation name"),
    ("chip", "v9", "unknown TPU generation `v9`"),
    ("jobs", "4", "jobs must be a whole number of processes, got '4'"),
    ("jobs", 2.0, "jobs must be a whole number"),
    ("jobs", True, "jobs must be a whole number"),
    ("jobs", 0, "jobs must be at least 1, got 0"),
    ("jobs", -1, "jobs must be at least 1, got -1"),
    ("progress", 5, "progress must be a function taking one string, got 5"),
    ("clock_ghz", "1", "clock_ghz must be a number of GHz, got '1'"),
    ("clock_ghz", float("nan"), "clock_ghz must be a positive, finite number of GHz, got nan"),
    ("clock_ghz", math.inf, "positive, finite"),
    ("clock_ghz", -1, "positive, finite number of GHz, got -1.0"),
    ("clock_ghz", 0, "positive, finite number of GHz, got 0.0"),
    ("dumps", 5, "dumps must be a path or an iterable of paths, got 5"),
    ("dumps", b"dir", "dumps must be a path or an iterable of paths"),
    ("dumps", ["ok", 3], "dumps must be a path or an iterable of paths; one item is 3"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_argument_is_one_usage_error(small_capture: Path, name: str, value, message: str):
    with pytest.raises(UsageError) as caught:
        diagnose(small_capture, **{name: value})
    assert message in caught.value.message
    assert "\n" not in caught.value.one_line()


def test_a_path_of_the_wrong_type_is_a_usage_error():
    with pytest.raises(UsageError, match="path must be a path or a URL, got 5"):
        diagnose(5)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("chip", 5, "chip must be"), ("jobs", 0, "jobs must be at least 1"),
    ("clock_ghz", float("nan"), "clock_ghz must be"), ("base_dumps", 7, "base_dumps must be"),
    ("new_dumps", [None], "new_dumps must be"),
])
def test_compare_checks_its_arguments_before_reading_either_input(tmp_path: Path, name, value, message):
    # Both inputs are missing: the argument is refused first, so no InputError about them.
    with pytest.raises(UsageError, match=message):
        compare(tmp_path / "missing-a", tmp_path / "missing-b", **{name: value})
    with pytest.raises(UsageError, match="new must be a path"):
        compare(tmp_path / "missing-a", 3.5)


def test_near_misses_are_accepted():
    assert check_jobs(None) is None and check_jobs(np.int64(3)) == 3
    assert check_clock_ghz(1) == 1.0 and check_clock_ghz(np.float32(0.94)) == pytest.approx(0.94)
    assert check_dumps(None) == [] and check_dumps(()) == []
    assert check_dumps(p for p in ["a", Path("b")]) == [Path("a"), Path("b")]


def test_a_single_string_dumps_is_one_directory(tmp_path: Path, small_capture: Path):
    # Regression: `dumps="some/dir"` was iterated one character at a time, so `s`, `o`, ... and
    # `/` were each read as a dump directory.
    missing = tmp_path / "some" / "dir"
    with pytest.raises(InputError) as caught:
        diagnose(small_capture, dumps=str(missing))
    assert caught.value.path == str(missing)
    assert check_dumps(str(missing)) == [missing]
    assert check_dumps(missing) == [missing]


def test_good_arguments_still_give_the_report(small_capture: Path):
    seen: list[str] = []
    d = diagnose(str(small_capture), chip="V6E", jobs=np.int64(1), progress=seen.append, clock_ghz=1)
    assert d.mode == "trace" and d.report.ops and seen
