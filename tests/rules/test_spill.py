"""spill (TPD104): skipped without LLO dumps; with a per-op spill table, spilling ops are reported.

The LLO input is the LLO parser's per-op table (`name`, `spill_stores`, `spill_fills`, `bundles`;
NA where the dump says nothing). These tests build that table by hand with counts from
`shared/reference/tpu-compiler-dumps.md` §7 (the v5e MLP fusion: 107 spills, 523 fills).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.inputs import CompiledInputs
from tpudiag.rules import RulesConfig
from tpudiag.rules.spill import op_spills


def llo_table(rows):
    df = pd.DataFrame(rows, columns=["name", "spill_stores", "spill_fills", "bundles"])
    for col in ("spill_stores", "spill_fills", "bundles"):
        df[col] = df[col].astype("Int64")
    return SimpleNamespace(ops=df)


def _run(analysis, llo, **options):
    return run_rules(analysis, RulesConfig(select=("spill",), options={"spill": options}),
                     CompiledInputs(llo=(llo,)))


@pytest.fixture
def analysis(tmp_path: Path):
    return sc.analyse(sc.low_mxu(), tmp_path)


def test_skipped_without_llo_dumps(analysis):
    findings, skipped = run_rules(analysis, RulesConfig(select=("spill",)))
    assert findings == []
    assert [(s.rule, s.reason) for s in skipped] == [("spill", "needs LLO dumps (`--dumps DIR`)")]


def test_spilling_ops_are_reported(analysis, snapshot):
    llo = llo_table([
        ("fusion.12", 107, 523, 2100),  # spills: (107 + 523) / 2100 = 30 % of its bundles
        ("fusion.13", 0, 0, 900),  # negative: no spills
        ("fusion.10", pd.NA, pd.NA, pd.NA),  # near miss: the dump says nothing about it
    ])
    findings, skipped = _run(analysis, llo)
    assert skipped == []
    assert [f.ops for f in findings] == [("fusion.12",)]
    f = findings[0]
    assert "spills 107 vector registers and fills 523" in f.message
    assert "per step in the trace" in f.message  # a measured timeline
    assert f.saving.basis == "compiler estimate"
    assert f.saving.ps == pytest.approx(sc.F32_MM_PS * 630 / 2100, abs=2)
    snapshot("spill", render_findings(findings))


def test_without_bundle_counts_the_saving_is_not_estimated(analysis):
    findings, _ = _run(analysis, llo_table([("fusion.12", 5, 5, pd.NA)]))
    assert findings[0].saving.ps == 0 and "no bundle count" in findings[0].saving.explanation


def test_min_spills_near_miss(analysis):
    llo = llo_table([("fusion.12", 2, 1, 1000)])
    assert _run(analysis, llo, min_spills=4) == ([], [])
    assert len(_run(analysis, llo, min_spills=3)[0]) == 1


def test_op_spills_reads_every_dumps_table():
    first = llo_table([("fusion.1", 3, 4, 100)])
    second = llo_table([("fusion.2", 1, 0, pd.NA)])
    assert [(r.op, r.spills, r.fills, r.bundles) for r in op_spills([first, second])] == [
        ("fusion.1", 3, 4, 100), ("fusion.2", 1, 0, None)]


def test_llo_dump_without_a_trace_still_reports_spills():
    """No analysis (an LLO dump of unknown generation): spills are counted, the saving is 0."""
    llo = llo_table([("fusion.12", 107, 523, 2100), ("fusion.13", 0, 0, 900)])
    findings, skipped = run_rules(None, RulesConfig(select=("spill", "padding-waste")), CompiledInputs(llo=(llo,)),
                                  static=True)
    assert [f.ops for f in findings] == [("fusion.12",)]
    assert findings[0].saving.ps == 0 and findings[0].saving.basis == "compiler estimate"
    assert "not in the trace" in findings[0].message
    assert [s.rule for s in skipped] == ["padding-waste"]


def test_a_modelled_timeline_says_modelled_not_in_the_trace(analysis):
    """Static mode and `simulate` captures lay ops on a modelled timeline: their times are estimates."""
    from dataclasses import replace

    modelled = replace(analysis, profile=replace(analysis.profile, modelled=True))
    findings, _ = _run(modelled, llo_table([("fusion.12", 107, 523, 2100)]))
    assert "per step modelled)" in findings[0].message and "in the trace" not in findings[0].message
