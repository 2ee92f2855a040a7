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
from tpudiag.model.findings import Severity
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
    assert findings[0].saving.ps == 0
    assert findings[0].saving.explanation == "the dump gives spill counts but no bundle count"


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


# -- the rule called directly on hand-made LLO tables ------------------------------------------------

def _direct(rows, analysis=None, **options):
    from tpudiag.rules.base import RuleContext
    from tpudiag.rules.spill import Options, check

    return check(RuleContext(analysis=analysis, compiled=CompiledInputs(llo=(llo_table(rows),))), Options(**options))


def test_without_a_timeline_the_most_spilling_ops_come_first():
    # No saving without times: ops are ranked by spills + fills, then by name.
    rows = [("fusion.1", 5, 5, 100), ("fusion.2", 100, 0, 1000), ("fusion.3", 1, 0, 100), ("fusion.4", 0, 10, 100)]
    assert [f.ops for f in _direct(rows)] == [("fusion.2",), ("fusion.1",), ("fusion.4",), ("fusion.3",)]
    assert [f.ops for f in _direct(rows, max_findings=2)] == [("fusion.2",), ("fusion.1",)]


def test_min_spills_counts_spills_and_fills_inclusively():
    rows = [("fusion.1", 2, 1, 100), ("fusion.2", 1, 1, 100)]
    assert [f.ops for f in _direct(rows, min_spills=3)] == [("fusion.1",)]


def test_the_message_evidence_and_saving_without_a_timeline():
    (f,) = _direct([("fusion.12", 107, 523, 2100)])
    # (107 + 523) / 2100 = 30 % of its bundles.
    assert f.message == ("`fusion.12` spills 107 vector registers and fills 523 (not in the trace); "
                         "30.0% of its 2100 bundles")
    assert f.evidence[0].values == (("spills", "107"), ("fills", "523"), ("bundles", "2100"),
                                    ("self time/step", "0 ps"))
    assert f.saving.ps == 0 and f.saving.explanation == "self time per step x (spills + fills) / bundles"
    assert f.fix == "reduce live vector state: smaller block sizes or fewer values live across the loop"
    assert f.severity is Severity.LOW and f.host == "" and f.code == "TPD104"


def test_the_bundle_share_is_capped_at_the_whole_op():
    (f,) = _direct([("fusion.12", 30, 20, 10)])
    assert f.message.endswith("; 100.0% of its 10 bundles")


def test_without_bundles_the_finding_stays_low(analysis):
    (f,) = _direct([("fusion.12", 107, 523, pd.NA)], analysis)
    assert f.severity is Severity.LOW and f.saving.ps == 0
    assert "bundles" not in dict(f.evidence[0].values)


def test_severity_follows_the_step_share(analysis):
    # fusion.12 (f32 matmul at 15 % of 918 TFLOP/s) takes 1,497 µs per 10 ms step: spilling in 30 % of
    # its bundles saves 449 µs (4.5 %, medium); in all of them 1,497 µs (15 %: high, capped at medium).
    (f,) = _direct([("fusion.12", 107, 523, 2100)], analysis)
    assert f.severity is Severity.MEDIUM
    assert f.saving.ps == pytest.approx(sc.F32_MM_PS * 0.3, abs=2)
    assert f.message.startswith("`fusion.12` spills 107 vector registers and fills 523 (1.50 ms per step in the "
                                "trace); 30.0% of its 2100 bundles")
    assert dict(f.evidence[0].values)["self time/step"] == "1.50 ms"
    (f,) = _direct([("fusion.12", 107, 523, 630)], analysis)
    assert f.severity is Severity.MEDIUM and f.saving.ps == pytest.approx(sc.F32_MM_PS, abs=2)
    (f,) = _direct([("fusion.12", 107, 523, 2100)], analysis, medium_share=0.05)
    assert f.severity is Severity.LOW
    (f,) = _direct([("fusion.12", 107, 523, 2100)], analysis, medium_share=0.04, high_share=0.045)
    assert f.severity is Severity.MEDIUM


def test_timed_ops_rank_by_saving_then_time(analysis):
    # fusion.12 (1,497 µs, 30 %: 449 µs) before fusion.10 (about 1.8 ms, 10 %: 180 µs); an op the
    # trace does not time (fusion.99) saves nothing and comes last.
    rows = [("fusion.99", 500, 500, 1000), ("fusion.10", 50, 50, 1000), ("fusion.12", 107, 523, 2100)]
    findings = _direct(rows, analysis)
    assert [f.ops[0] for f in findings] == ["fusion.12", "fusion.10", "fusion.99"]
    assert "(not in the trace)" in findings[2].message
    assert [f.ops[0] for f in _direct(rows, analysis, max_findings=1)] == ["fusion.12"]
    assert findings[0].host == "host0"


def test_op_spills_goes_past_an_empty_table_and_a_dump_without_bundle_counts():
    empty = llo_table([])
    no_bundles = SimpleNamespace(ops=pd.DataFrame({"name": ["fusion.1"], "spill_stores": pd.array([2], dtype="Int64"),
                                                   "spill_fills": pd.array([3], dtype="Int64")}))
    assert [(r.op, r.spills, r.fills, r.bundles) for r in op_spills([empty, no_bundles])] == [("fusion.1", 2, 3, None)]


def test_equal_savings_rank_by_time_in_the_trace(analysis):
    # Without bundle counts nothing is saved: fusion.10 (about 1.8 ms per step) comes before fusion.12
    # (1.5 ms), though fusion.12 spills more.
    findings = _direct([("fusion.12", 100, 100, pd.NA), ("fusion.10", 1, 0, pd.NA)], analysis)
    assert [f.ops[0] for f in findings] == ["fusion.10", "fusion.12"]
