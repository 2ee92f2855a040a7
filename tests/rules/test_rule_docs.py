"""`docs/rules/` is generated from the rules' own docstrings: one page per rule, exactly what
`tpudiag rule NAME` prints (`Rule.page`), and an index. Regenerate with UPDATE_SNAPSHOTS=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.snapshot_util import check_snapshot
from tpudiag.rules.registry import RULES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules"


def index() -> str:
    rows = "\n".join(f"| {r.code} | [`{r.name}`]({r.name}.md) | {r.severity.label()} | {', '.join(r.inputs)} | "
                     f"{r.summary} |" for r in RULES)
    return ("# Rules\n\nGenerated from each rule's docstring (`tests/rules/test_rule_docs.py`; regenerate with "
            "`UPDATE_SNAPSHOTS=1`). `tpudiag rule NAME` prints the same page.\n\n"
            "| Code | Rule | Severity up to | Needs | What it finds |\n|---|---|---|---|---|\n" + rows + "\n")


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_each_rule_page_is_current(rule):
    check_snapshot(DOCS / f"{rule.name}.md", rule.page())


def test_the_index_is_current():
    check_snapshot(DOCS / "README.md", index())


def test_no_page_for_a_rule_that_is_gone():
    pages = {p.stem for p in DOCS.glob("*.md")} - {"README"}
    assert pages == {r.name for r in RULES}
