"""The CI gate's verdict (`tpudiag.gate.Verdict`, `tpudiag check`) for the terminal and as JSON."""

from __future__ import annotations

import json

from rich.console import Console
from rich.text import Text

from tpudiag.render.diff_json import change_to_dict
from tpudiag.render.json_format import finding_to_dict


def verdict_to_dict(verdict) -> dict:
    """One object for machines: `result` (pass or fail), `exit_code`, `checks`, `step_time`,
    `findings`, `warnings`."""
    return {
        "result": "pass" if verdict.passed else "fail", "exit_code": verdict.exit_code, "input": verdict.input_path,
        "baseline": verdict.baseline,
        "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail} for c in verdict.checks],
        "step_time": change_to_dict(verdict.step_time),
        "findings": [finding_to_dict(f) for f in verdict.findings],
        "warnings": list(verdict.warnings),
    }


def render_verdict_json(verdict) -> str:
    return json.dumps(verdict_to_dict(verdict), indent=2)


def render_verdict_terminal(verdict, console: Console) -> None:
    """One line per check, then the verdict."""
    for c in verdict.checks:
        console.print(Text.assemble(("pass" if c.passed else "FAIL", "green" if c.passed else "bold red"),
                                    f"  {c.name}: {c.detail}"))
    console.print(Text("check passed" if verdict.passed else "check failed", style="bold"))
