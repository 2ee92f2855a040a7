"""Every input gets every rule it has the inputs for: a capture, a capture with dumps, dumps alone
and partial dumps. Each rule either runs or is skipped with a reason that names what is missing,
and a visibly bad program never comes back with no findings."""

from __future__ import annotations

import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.rules.registry import RULES

MODELS = REPO / "examples" / "models"
DECODE = MODELS / "dumps" / "llm_decode_v5e"


def _hlo_file():
    return next((DECODE / "xla").glob("*.after_optimizations.txt"))


# (input, dumps, rules that must find something): the v5e decode step is visibly bad (exposed
# synchronous collectives, HBM-bound, padded tiles, spills), so each input finds what it can see.
CASES = {
    "capture": (lambda: MODELS / "captures" / "llm_decode_v5e", (), {"exposed-collective", "memory-bound"}),
    "capture with dumps": (lambda: MODELS / "captures" / "llm_decode_v5e", (DECODE,),
                           {"exposed-collective", "memory-bound", "spill"}),
    "dumps alone": (lambda: DECODE, (), {"exposed-collective", "padding-waste", "spill"}),
    "XLA dump only": (lambda: DECODE / "xla", (), {"exposed-collective", "memory-bound"}),
    "LLO dump only": (lambda: DECODE / "llo", (), {"spill"}),
    "one HLO file": (_hlo_file, (), {"exposed-collective"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rule_runs_or_says_what_it_lacks(case):
    path, dumps, expected = CASES[case]
    d = tpudiag.diagnose(path(), dumps=dumps)
    found = {f.rule for f in d.findings}
    assert expected <= found, (case, found)
    skipped = {s.rule: s.reason for s in d.skipped}
    # every rule is accounted for: it ran (and may have found nothing) or was skipped with a reason
    assert set(skipped) <= {r.name for r in RULES}
    assert not (found & set(skipped))
    assert all(reason.startswith("needs ") and len(reason) > len("needs x") for reason in skipped.values())
    if d.mode == "static":
        assert all(f.saving.basis == "compiler estimate" for f in d.findings if not f.saving.bytes)
        assert all(f.saving.basis != "measured" for f in d.findings)
        # static mode has no `--dumps`: no reason may send the user there
        assert not any("--dumps" in reason for reason in skipped.values()), skipped
