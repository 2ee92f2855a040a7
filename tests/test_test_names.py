"""Test modules are imported by their base name (the test folders are not packages): two files of one
name in different folders stop pytest's collection with an import-file mismatch. This catches it
before the suite does (it did, once: `analysis/` and `kernels_lab/` each gained a `test_kernels.py`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_base_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
