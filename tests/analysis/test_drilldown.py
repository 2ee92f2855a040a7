"""Ops filters and sorts (n/a last), padding from layouts, and one op's detail."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import small_design
from tpudiag.analysis.drilldown import (OpFilter, facets, filter_ops, find_op, op_detail, op_padding, padding_fraction,
                                        sort_ops, spills)
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.model.findings import Finding, Saving, Severity
from tpudiag.parsers.capture import load_capture


@pytest.fixture
def loaded(write_design):
    analysis = analyze(load_capture(write_design(small_design())))
    return analysis, build_report(analysis)


def names(ops):
    return [op.name for op in ops]


def test_filter_by_text_category_host_and_program(loaded):
    _, report = loaded
    assert names(filter_ops(report.ops, OpFilter(text="ALL-"))) == ["all-reduce.2", "all-gather-done.1",
                                                                   "all-gather-start.1"]
    assert names(filter_ops(report.ops, OpFilter(text="model.py:10"))) == ["fusion.1"]  # by source line
    assert set(names(filter_ops(report.ops, OpFilter(category="convolution fusion")))) == {"fusion.1", "fusion.5"}
    assert filter_ops(report.ops, OpFilter(host="elsewhere")) == ()
    assert len(filter_ops(report.ops, OpFilter(program="jit_train_step"))) == len(report.ops)
    assert not OpFilter().active and OpFilter(host="h").active


def test_sort_by_flop_utilization_puts_na_last_both_ways(loaded):
    _, report = loaded
    desc = sort_ops(report.ops, "flop_util")
    asc = sort_ops(report.ops, "flop_util", descending=False)
    # fusion.5 (1 TFLOP in 990 µs) is over the peak as designed, so its utilization is n/a (never
    # shown: issue 35) and sorts last; fusion.1 runs at 50 % of the peak, the most of any op.
    by_name = {op.name: op for op in report.ops}
    assert by_name["fusion.5"].flop_utilization is None
    assert desc[0].name == "fusion.1" and desc[-1].flop_utilization is None
    known = [op.flop_utilization for op in desc if op.flop_utilization is not None]
    assert known == sorted(known, reverse=True)
    assert asc[-1].flop_utilization is None
    no_peak = tuple(dataclasses.replace(op, flop_utilization=None) if op.name == "fusion.1" else op
                    for op in report.ops)
    assert sort_ops(no_peak, "flop_util")[-1].flop_utilization is None
    assert "fusion.1" in names(sort_ops(no_peak, "flop_util")[-2:])
    assert len(asc) == len(report.ops)
    with pytest.raises(ValueError, match="unknown sort column 'nope'"):
        sort_ops(report.ops, "nope")


def test_padding_from_tiled_layouts_and_none_without():
    assert padding_fraction("f32[3,1000]{1,0:T(4,128)}") == pytest.approx(1 - 12000 / 16384)  # 3 rows padded to 4
    assert padding_fraction("bf16[1024,4096]{1,0:T(8,128)(2,1)}") == 0.0
    assert padding_fraction("f32[3,1000]") is None  # no tiled layout
    assert padding_fraction("not a shape :T(") is None


def test_sort_by_padding_and_spills(loaded):
    _, report = loaded
    assert sort_ops(report.ops, "padding")[0].name == "fusion.3"
    assert names(sort_ops(report.ops, "spills")) == names(report.ops)  # all n/a: report order kept


def test_facets(loaded):
    _, report = loaded
    f = facets(report.ops)
    assert f.hosts == ("host0",) and f.programs == ("jit_train_step",)
    assert "all-gather" in f.categories and list(f.categories) == sorted(f.categories)


def test_op_detail_has_hlo_per_core_counts_and_citing_findings(loaded):
    analysis, report = loaded
    cite = Finding("some-rule", "TPD999", Severity.LOW, "fusion.1 is slow", Saving(1, "measured", "x"), "fix it",
                   host="host0", ops=("fusion.1",))
    other_host = dataclasses.replace(cite, host="host9")
    report = dataclasses.replace(report, findings=(cite, other_host))
    op = find_op(report, "fusion.1")
    d = op_detail(analysis, report, op)
    assert d.hlo_text.startswith("%fusion.1 = bf16[1024,4096]")
    assert [(c.device, c.occurrences) for c in d.per_core] == [("/device:TPU:0", 5), ("/device:TPU:1", 5)]
    assert d.findings == (cite,)
    assert d.spills is None and d.llo_available is False and d.padding == 0.0
    assert find_op(report, "nope") is None


def test_compiled_join_wins_over_the_result_layout_and_spills_add_stores_and_fills(loaded):
    _, report = loaded
    op = find_op(report, "fusion.3")  # result f32[3,1000] in T(4,128): 27 % padding by its layout alone
    assert op_padding(op) == pytest.approx(1 - 12000 / 16384)
    joined = dataclasses.replace(op, padded_bytes=1000, logical_bytes=750, spill_stores=3, spill_fills=None)
    assert op_padding(joined) == 0.25  # operands and result, as compiled
    assert spills(joined) == 3 and spills(op) is None
    ops = (op, dataclasses.replace(find_op(report, "fusion.1"), spill_stores=10, spill_fills=5))
    assert names(sort_ops(ops, "spills")) == ["fusion.1", "fusion.3"]  # n/a last
