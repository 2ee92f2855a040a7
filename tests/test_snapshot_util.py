"""The one snapshot mechanism: a missing snapshot fails without being written; UPDATE_SNAPSHOTS=1 writes."""

from __future__ import annotations

import pytest

from tests.snapshot_util import UPDATE_VARIABLE, check_snapshot


def test_a_missing_snapshot_fails_and_is_not_written(tmp_path, monkeypatch):
    monkeypatch.delenv(UPDATE_VARIABLE, raising=False)
    path = tmp_path / "missing.txt"
    with pytest.raises(AssertionError, match="missing"):
        check_snapshot(path, "text")
    assert not path.exists()


def test_a_different_text_fails_with_its_diff(tmp_path, monkeypatch):
    monkeypatch.delenv(UPDATE_VARIABLE, raising=False)
    path = tmp_path / "s.txt"
    path.write_text("old line\n", encoding="utf-8")
    with pytest.raises(AssertionError, match=r"(?s)-old line.*\+new line"):
        check_snapshot(path, "new line\n")
    assert path.read_text(encoding="utf-8") == "old line\n"


def test_the_update_variable_rewrites(tmp_path, monkeypatch):
    monkeypatch.setenv(UPDATE_VARIABLE, "1")
    path = tmp_path / "sub" / "s.txt"
    check_snapshot(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"
