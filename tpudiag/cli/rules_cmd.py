"""`tpudiag rules` and `tpudiag rule NAME`: the rule catalogue and each rule's documentation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import TerminalOrJson
from tpudiag.errors import UsageError


def rules(output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
          = TerminalOrJson.terminal,
          output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the list to this file (`-` "
                                                                          "for stdout)")] = None) -> None:
    """List every rule: code, name, severity, the inputs it needs."""
    from tpudiag.cli.outputs import RuleCatalog, emit
    from tpudiag.rules.registry import RULES
    from tpudiag.writers.files import resolve_output

    emit(RuleCatalog(RULES), output_format.value, resolve_output(output, []))


def rule(name: Annotated[str, typer.Argument(help="Rule name (e.g. exposed-collective) or code (TPD101)")]) -> None:
    """Print a rule's documentation."""
    from tpudiag.rules.registry import get_rule

    found = get_rule(name)
    if found is None:
        raise UsageError(f"unknown rule `{name}`", hint="`tpudiag rules` lists the rules")
    sys.stdout.write(found.page())


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
