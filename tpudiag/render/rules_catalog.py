"""The rule catalogue (`tpudiag rules`): a table for the terminal, a JSON list.

Takes the registry's rules (`tpudiag.rules.registry.RULES`) as given: render imports no rules.
"""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console
from rich.table import Table


def rule_to_dict(rule) -> dict:
    """One rule as the JSON catalogue lists it: its code, inputs, default options and documentation."""
    return {
        "code": rule.code,
        "name": rule.name,
        "severity": rule.severity.label(),
        "inputs": list(rule.inputs),
        "uses": list(rule.uses),
        "tables": list(rule.tables),
        "summary": rule.summary,
        "options": {f.name: getattr(rule.default_options(), f.name)
                    for f in dataclasses.fields(rule.options_type)},
        "doc": rule.doc.strip(),
    }


def render_rules_json(rules) -> str:
    """The catalogue as a JSON list, without its final newline."""
    return json.dumps([rule_to_dict(r) for r in rules], indent=2)


def render_rules_terminal(rules, console: Console) -> None:
    """One row per rule: code, name, severity, the inputs it needs (and uses when present), what it finds."""
    table = Table(show_edge=False)
    for col in ("code", "name", "severity", "needs", "what it finds"):
        table.add_column(col, no_wrap=col != "what it finds")
    for r in rules:
        needs = ", ".join(r.inputs) + (f" (uses {', '.join(r.uses)})" if r.uses else "")
        table.add_row(r.code, r.name, r.severity.label(), needs, r.summary)
    console.print(table)
