"""Every registered rule is complete: code, name, docs, documented options, fixtures and a snapshot."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from tpudiag.rules import RULES
from tpudiag.rules.base import DOC_SECTIONS, INPUTS, TABLES, RuleInput, Table, doc_sections

HERE = Path(__file__).parent


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_is_complete(rule):
    assert re.fullmatch(r"TPD\d{3}", rule.code)
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name)
    # A rule needs something observed: a trace, or compiler dumps (rules on dumps alone).
    # The enums, not strings that compare equal to them: the catalogue is the one spelling.
    assert all(isinstance(i, RuleInput) for i in (*rule.inputs, *rule.uses))
    assert all(isinstance(t, Table) for t in rule.tables)
    assert set(rule.inputs) & {RuleInput.TRACE, RuleInput.LLO, RuleInput.HLO}
    assert not set(rule.uses) & set(rule.inputs)
    assert rule.tables
    sections = doc_sections(rule.doc)
    assert list(sections) == list(DOC_SECTIONS), f"{rule.name}: sections {list(sections)}"
    assert all(body.strip() for body in sections.values())
    assert rule.summary and not rule.summary.endswith(".")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_every_option_is_frozen_and_documented_with_its_default(rule):
    assert dataclasses.is_dataclass(rule.options_type)
    assert rule.options_type.__dataclass_params__.frozen
    documented = dict(re.findall(r"^- `(\w+)` \(([^)]*)\):", doc_sections(rule.doc)["Options"], re.MULTILINE))
    defaults = rule.default_options()
    fields = [f.name for f in dataclasses.fields(rule.options_type)]
    assert set(documented) == set(fields), f"{rule.name}: documented {sorted(documented)} vs fields {fields}"
    for name in fields:
        assert ast.literal_eval(documented[name]) == getattr(defaults, name), f"{rule.name}.{name}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_every_rule_has_fixtures_and_a_snapshot(rule):
    module = rule.check.__module__.rsplit(".", 1)[1]
    tests = HERE / f"test_{module}.py"
    assert tests.exists(), f"missing {tests.name}"
    text = tests.read_text()
    assert "snapshot(" in text and f'"{rule.name}"' in text
    snap = HERE / "snapshots" / f"{rule.name}.txt"
    assert snap.exists() and rule.code in snap.read_text()


def test_every_input_has_a_skip_reason_and_every_table_a_check():
    assert set(INPUTS) == set(RuleInput) and all(INPUTS.values())
    assert set(TABLES) == set(Table)
