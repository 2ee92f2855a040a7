"""`tpudiag rules` and `tpudiag rule NAME`: the rule catalogue and each rule's documentation."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from tpudiag.cli.options import TerminalOrJson
from tpudiag.errors import UsageError


def rule_to_dict(rule) -> dict:
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


def rules(output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
          = TerminalOrJson.terminal) -> None:
    """List every rule: code, name, severity, the inputs it needs."""
    from tpudiag.cli.console import stdout_console
    from tpudiag.rules.registry import RULES

    if output_format.value == "json":
        sys.stdout.write(json.dumps([rule_to_dict(r) for r in RULES], indent=2) + "\n")
        return
    table = Table(show_edge=False)
    for col in ("code", "name", "severity", "needs", "what it finds"):
        table.add_column(col, no_wrap=col != "what it finds")
    for r in RULES:
        needs = ", ".join(r.inputs) + (f" (uses {', '.join(r.uses)})" if r.uses else "")
        table.add_row(r.code, r.name, r.severity.label(), needs, r.summary)
    stdout_console().print(table)


def rule(name: Annotated[str, typer.Argument(help="Rule name (e.g. exposed-collective) or code (TPD101)")]) -> None:
    """Print a rule's documentation."""
    from tpudiag.rules.registry import get_rule

    found = get_rule(name)
    if found is None:
        raise UsageError(f"unknown rule `{name}`", hint="`tpudiag rules` lists the rules")
    sys.stdout.write(f"{found.name} ({found.code}) · severity up to {found.severity.label()} · needs "
                     f"{', '.join(found.inputs)}\n\n{found.doc.strip()}\n")


def check_number_option(option: str, value: float | None, positive: bool = False) -> float | None:
    """A numeric command-line threshold, or a UsageError for NaN, infinity or a negative (or zero) value."""
    from tpudiag.model.units import number_problem

    problem = None if value is None else number_problem(value, positive)
    if problem:
        raise UsageError(f"{option} {problem}")
    return value


def parse_fail_on(text: str | None):
    """`--fail-on SEVERITY` as a Severity (None when absent); a bad value is a usage error."""
    from tpudiag.model.findings import Severity

    if text is None:
        return None
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise UsageError(f"--fail-on: {exc}") from exc


def register(app: typer.Typer) -> None:
    app.command("rules")(rules)
    app.command("rule")(rule)
