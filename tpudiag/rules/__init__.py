"""Detection only: rules read an `Analysis` (and optional compiler dumps) and return findings.

Never imports render, cli or tui. `run_rules` is the entry point; `RULES` the registry.
"""

from tpudiag.rules.config import RulesConfig, load_config
from tpudiag.rules.engine import run_rules
from tpudiag.rules.registry import RULES, get_rule

__all__ = ["RULES", "RulesConfig", "get_rule", "load_config", "run_rules"]
