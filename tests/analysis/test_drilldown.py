"""Ops filters and sorts (n/a last), padding from layouts, and one op's detail."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.conftest import small_design
from tpudiag.analysis.drilldown import (SORT_COLUMNS, CoreCount, Facets, OpFilter, facets, filter_ops, find_op,
                                        findings_citing, op_detail, op_padding, padding_fraction, sort_column,
                                        sort_ops, spills)
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.model.findings import Finding, Saving, Severity
from tpudiag.model.report import OpRow
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


# ---------------------------------------------------------------------------------------------
# On hand-made op rows: values worked by hand from the rows (padded minus logical over padded,
# stores plus fills), without a capture


def _row(name: str, **kw) -> OpRow:
    fields = dict(host="h0", program_id=1, program="jit_step", name=name, category="loop fusion", occurrences=1,
                  total_time_ps=100, self_time_ps=100, time_share=0.1, flops=0.0, bytes_accessed=0.0,
                  hbm_bytes=0.0, flop_rate=None, hbm_bw=None, operational_intensity=None, flop_utilization=None,
                  hbm_utilization=None, bound_by="HBM", family="", shape_with_layout="f32[8]{0}", source="",
                  tf_op="")
    return OpRow(**{**fields, **kw})


def test_padding_fraction_of_tiled_layouts_by_hand():
    # f32[3,1000] in T(4,128): 4 x 1024 x 4 bytes padded, 3 x 1000 x 4 logical
    assert padding_fraction("f32[3,1000]{1,0:T(4,128)}") == pytest.approx((16384 - 12000) / 16384)
    assert padding_fraction("f32[3,1000]{1,0}") is None  # a layout without tiles
    assert padding_fraction("f32[3,1000]{1,0:T(4,128)") is None  # cut off: the parser refuses it
    assert padding_fraction("q99[3,1000]{1,0:T(4,128)}") is None  # an unknown dtype
    assert padding_fraction("f32[0,128]{1,0:T(8,128)}") is None  # an empty array: no bytes, nothing padded


def test_op_padding_prefers_the_compiled_bytes():
    assert op_padding(_row("a", padded_bytes=1000, logical_bytes=750)) == 0.25
    assert op_padding(_row("a", padded_bytes=1000, logical_bytes=0)) == 1.0  # a logical size of 0 is known
    # without the compiled pair, the result's layout alone
    layout = "f32[3,1000]{1,0:T(4,128)}"
    expected = (16384 - 12000) / 16384
    assert op_padding(_row("a", shape_with_layout=layout)) == pytest.approx(expected)
    assert op_padding(_row("a", shape_with_layout=layout, padded_bytes=1000)) == pytest.approx(expected)
    assert op_padding(_row("a", shape_with_layout=layout, padded_bytes=0, logical_bytes=0)) == pytest.approx(expected)
    assert op_padding(_row("a")) is None


def test_spills_add_stores_and_fills():
    assert spills(_row("a")) is None
    assert spills(_row("a", spill_stores=3)) == 3
    assert spills(_row("a", spill_fills=4)) == 4
    assert spills(_row("a", spill_stores=3, spill_fills=4)) == 7
    assert spills(_row("a", spill_stores=0, spill_fills=0)) == 0


def test_each_sort_column_reads_its_value():
    cols = {c.key: c for c in SORT_COLUMNS}
    assert [c.key for c in SORT_COLUMNS] == ["self_time", "flop_util", "hbm_bw", "padding", "spills"]
    assert [c.label for c in SORT_COLUMNS] == ["per step", "FLOP util", "HBM BW", "padding", "spills"]
    op = _row("a", self_time_ps=500, step_self_time_ps=50.0, flop_utilization=0.4, hbm_bw=2.0e11, hbm_bytes=1.0e6,
              padded_bytes=200, logical_bytes=150, spill_stores=1, spill_fills=2)
    assert cols["self_time"].value(op) == 50.0
    assert cols["flop_util"].value(op) == 0.4
    assert cols["hbm_bw"].value(op) == 2.0e11
    assert cols["padding"].value(op) == 0.25
    assert cols["spills"].value(op) == 3.0 and isinstance(cols["spills"].value(op), float)
    # an op without HBM bytes has no bandwidth to sort by; without spill counts, n/a
    assert cols["hbm_bw"].value(dataclasses.replace(op, hbm_bytes=0.0)) is None
    assert cols["spills"].value(_row("b")) is None
    assert sort_column("padding") is cols["padding"]


def test_an_unknown_sort_column_names_the_known_ones():
    with pytest.raises(ValueError) as e:
        sort_column("nope")
    assert str(e.value) == "unknown sort column 'nope'; expected one of self_time, flop_util, hbm_bw, padding, spills"
    assert isinstance(e.value.__cause__, KeyError)


def test_sorts_put_na_last_both_ways_and_keep_ties_in_order():
    ops = (_row("a", flop_utilization=0.5), _row("b"), _row("c", flop_utilization=0.9),
           _row("d", flop_utilization=0.5), _row("e"))
    assert names(sort_ops(ops, "flop_util")) == ["c", "a", "d", "b", "e"]
    assert names(sort_ops(ops, "flop_util", descending=False)) == ["a", "d", "c", "b", "e"]
    assert names(sort_ops(ops)) == ["a", "b", "c", "d", "e"]  # equal self times: the report's order
    timed = (_row("a", self_time_ps=10), _row("b", self_time_ps=30), _row("c", self_time_ps=20))
    assert names(sort_ops(timed)) == ["b", "c", "a"]


def test_filters_each_field_and_text_in_any_of_five():
    ops = (_row("fusion.1", category="convolution fusion", source="model.py:10", host="h0", program="p1"),
           _row("copy.2", category="copy", shape_with_layout="BF16[2,4]{1,0}", host="h1", program="p1"),
           _row("fusion.3", program="jit_other", host="h0"))
    assert names(filter_ops(ops, OpFilter())) == ["fusion.1", "copy.2", "fusion.3"]
    assert names(filter_ops(ops, OpFilter(category="copy"))) == ["copy.2"]
    assert names(filter_ops(ops, OpFilter(host="h0"))) == ["fusion.1", "fusion.3"]
    assert names(filter_ops(ops, OpFilter(program="p1"))) == ["fusion.1", "copy.2"]
    assert names(filter_ops(ops, OpFilter(text="  MODEL.PY:10 "))) == ["fusion.1"]  # source, trimmed, any case
    assert names(filter_ops(ops, OpFilter(text="bf16[2,4]"))) == ["copy.2"]  # the shape
    assert names(filter_ops(ops, OpFilter(text="CONVOLUTION"))) == ["fusion.1"]  # the category
    assert names(filter_ops(ops, OpFilter(text="other"))) == ["fusion.3"]  # the program
    assert names(filter_ops(ops, OpFilter(text="fusion", host="h0", program="jit_other"))) == ["fusion.3"]
    assert filter_ops(ops, OpFilter(text="fusion", category="copy")) == ()
    # the text is not matched across two fields
    assert filter_ops(ops, OpFilter(text="fusion.1convolution")) == ()


def test_a_filter_is_active_when_any_field_is_set():
    assert not OpFilter().active
    assert all(OpFilter(**{f: "x"}).active for f in ("text", "category", "host", "program"))


def test_facets_are_sorted_and_distinct():
    ops = (_row("a", category="copy", host="h1", program="p2"), _row("b", category="add", host="h0", program="p1"),
           _row("c", category="copy", host="h1", program="p1"))
    assert facets(ops) == Facets(("add", "copy"), ("h0", "h1"), ("p1", "p2"))


def _finding(host: str, ops: tuple[str, ...]) -> Finding:
    return Finding("some-rule", "TPD999", Severity.LOW, "slow", Saving(1, "measured", "x"), "fix", host=host, ops=ops)


def test_findings_citing_an_op_on_its_host_or_every_host():
    op = _row("fusion.1", host="h0")
    mine, everywhere = _finding("h0", ("fusion.1", "copy.2")), _finding("", ("fusion.1",))
    elsewhere, other_op = _finding("h1", ("fusion.1",)), _finding("h0", ("fusion.11",))
    report = SimpleNamespace(findings=(mine, elsewhere, everywhere, other_op))
    assert findings_citing(report, op) == (mine, everywhere)


def test_find_op_takes_the_first_of_its_name_on_the_host_asked():
    rows = (_row("fusion.1", host="h1", self_time_ps=900), _row("fusion.1", host="h0", self_time_ps=500))
    report = SimpleNamespace(ops=rows)
    assert find_op(report, "fusion.1").host == "h1"  # the report's order: the most self time first
    assert find_op(report, "fusion.1", host="h0").host == "h0"
    assert find_op(report, "fusion.1", host="h9") is None and find_op(report, "copy.2") is None


def _host(name: str, meta_rows: list[tuple[int, str, str, str]]) -> SimpleNamespace:
    meta = pd.DataFrame({"program_id": [r[0] for r in meta_rows], "name": [r[1] for r in meta_rows],
                         "hlo_text": [r[2] for r in meta_rows], "tf_op": [r[3] for r in meta_rows]})
    return SimpleNamespace(host=name, op_metadata=meta)


def _cores(rows: list[tuple[int, str, str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame({"program_id": [r[0] for r in rows], "name": [r[1] for r in rows],
                         "device": pd.Categorical([r[2] for r in rows]), "n": [r[3] for r in rows],
                         "self_ps": [r[4] for r in rows]})


def test_op_detail_of_one_op_from_its_host_and_program():
    h0 = _host("h0", [(1, "fusion.1", "%fusion.1 = f32[8]{0} add(...)", "jit(f)/add"),
                      (2, "fusion.1", "%fusion.1 in another program", "other"),
                      (1, "copy.2", "", "")])  # the parser writes "" for a missing text
    h1 = _host("h1", [(1, "fusion.1", "%fusion.1 on h1", "h1 op")])
    cores = _cores([(1, "fusion.1", "/device:TPU:0", 2, 30), (1, "fusion.1", "/device:TPU:0", 1, 12),
                    (1, "fusion.1", "/device:TPU:1", 3, 40), (2, "fusion.1", "/device:TPU:0", 9, 99),
                    (1, "copy.2", "/device:TPU:1", 5, 5)])
    analysis = SimpleNamespace(profile=SimpleNamespace(hosts=[h1, h0]),
                               digests={"h0": SimpleNamespace(op_cores=cores),
                                        "h1": SimpleNamespace(op_cores=_cores([]))})
    op = _row("fusion.1", host="h0", program_id=1, padded_bytes=100, logical_bytes=75, spill_stores=2)
    cite = _finding("h0", ("fusion.1",))
    kernel = SimpleNamespace(op="fusion.1", program="jit_step")
    report = SimpleNamespace(findings=(cite, _finding("h1", ("fusion.1",))),
                             summary=SimpleNamespace(dumps=("dump_dir",)),
                             kernels=(SimpleNamespace(op="fusion.1", program="jit_other"), kernel))
    d = op_detail(analysis, report, op)
    assert (d.hlo_text, d.tf_op) == ("%fusion.1 = f32[8]{0} add(...)", "jit(f)/add")
    # per core: this program's rows only, summed per device
    assert d.per_core == (CoreCount("/device:TPU:0", 3, 42), CoreCount("/device:TPU:1", 3, 40))
    assert (d.padding, d.spills, d.findings, d.llo_available) == (0.25, 2, (cite,), True)
    assert d.kernel is kernel and d.op is op
    # no HLO text or JAX op carried: empty strings, not "None"
    bare = SimpleNamespace(findings=(), summary=SimpleNamespace(dumps=()), kernels=())
    c = op_detail(analysis, bare, _row("copy.2", host="h0", program_id=1))
    assert (c.hlo_text, c.tf_op, c.llo_available, c.kernel) == ("", "", False, None)
    assert c.per_core == (CoreCount("/device:TPU:1", 5, 5),)
    assert all(isinstance(v, int) for v in (c.per_core[0].occurrences, c.per_core[0].self_time_ps))


def test_op_detail_of_an_op_on_an_unknown_host_or_without_metadata():
    analysis = SimpleNamespace(profile=SimpleNamespace(hosts=[_host("h0", [])]),
                               digests={"h0": SimpleNamespace(op_cores=_cores([]))})
    report = SimpleNamespace(findings=(), summary=SimpleNamespace(dumps=()), kernels=())
    for host in ("h0", "h9"):
        d = op_detail(analysis, report, _row("fusion.1", host=host))
        assert (d.hlo_text, d.tf_op, d.per_core, d.padding, d.spills) == ("", "", (), None, None)
