"""The one registry of rules, sorted by code. Adding a rule means adding its module here."""

from __future__ import annotations

from tpudiag.rules import (device_idle, exposed_collective, hbm_pressure, host_transfer_bound, low_mxu_utilization,
                           memory_bound,
                           padding_waste, spill, step_time_variance, straggler_core, straggler_host,
                           vmem_pressure)
from tpudiag.rules.base import Rule

RULES: tuple[Rule, ...] = tuple(sorted(
    (device_idle.RULE, exposed_collective.RULE, hbm_pressure.RULE, host_transfer_bound.RULE, low_mxu_utilization.RULE, memory_bound.RULE, padding_waste.RULE,
     spill.RULE, straggler_core.RULE, straggler_host.RULE, step_time_variance.RULE, vmem_pressure.RULE),
    key=lambda r: r.code))

_BY_KEY = {**{r.name: r for r in RULES}, **{r.code.lower(): r for r in RULES}}


def get_rule(name_or_code: str) -> Rule | None:
    """The rule with this kebab-case name or code (case-insensitive), else None."""
    return _BY_KEY.get(name_or_code.strip().lower())
