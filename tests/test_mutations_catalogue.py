"""The mutation check's catalogue follows the code: each bug it plants is one exact line found once
in its file, its mutant differs, and the test that must catch it exists and is not a golden
(`benchmarks/mutations.py` plants them; docs/testing.md records its results)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO


def _catalogue():
    spec = importlib.util.spec_from_file_location("benchmarks_mutations", REPO / "benchmarks" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


MUTATIONS = _catalogue()


@pytest.mark.parametrize("m", MUTATIONS.MUTATIONS, ids=lambda m: m.name)
def test_each_planted_bug_is_one_line_of_the_code_and_a_direct_test_names_it(m):
    MUTATIONS.check_line(REPO, m)
    assert m.after != m.before
    assert "golden" not in m.test and "snapshot" not in m.test


def test_a_line_that_is_gone_is_an_error_not_a_skip(tmp_path):
    m = MUTATIONS.MUTATIONS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text("nothing to mutate here\n")
    with pytest.raises(MUTATIONS.CatalogueError, match="found 0 times"):
        MUTATIONS.check_line(tmp_path, m)
