"""padding-waste (TPD103): padded results weighted by time, with the tile-aligned sizes to use.

The rule reads layouts through the layout parser's interface (`parse_shape(text)` returning a
`tpudiag.model.compiled.Shape`). These tests pass a table of known shapes from
`shared/reference/tpu-compiler-dumps.md` §9 through that interface, with their bytes worked out by
hand, so they do not depend on the parser's arithmetic; one test runs the real parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.compiled import ArrayShape, Layout, TupleShape
from tpudiag.model.findings import Severity
from tpudiag.parsers import layout
from tpudiag.rules import RulesConfig, engine


def _array(dtype, dims, m2m, tile, logical, padded):
    return ArrayShape(dtype=dtype, dims=dims, layout=Layout(minor_to_major=m2m, tiles=(tile,)),
                      logical_bytes=logical, padded_bytes=padded)


# Known layouts: logical and padded bytes worked out by hand (rows and lanes rounded up to the tile).
KNOWN = {
    "f32[3,50257]{1,0:T(4,128)}": _array("f32", (3, 50257), (1, 0), (4, 128), 3 * 50257 * 4, 4 * 50304 * 4),
    "f32[8,1024]{1,0:T(8,128)}": _array("f32", (8, 1024), (1, 0), (8, 128), 32768, 32768),
    "f32[8,1160]{1,0:T(8,128)}": _array("f32", (8, 1160), (1, 0), (8, 128), 8 * 1160 * 4, 8 * 1280 * 4),
    "bf16[8192,50257]{1,0:T(8,128)(2,1)}": _array("bf16", (8192, 50257), (1, 0), (8, 128), 8192 * 50257 * 2,
                                                  8192 * 50304 * 2),
}


def known_layouts(text: str):
    return KNOWN[text]


def _run(analysis, layouts=known_layouts, **options):
    return run_rules(analysis, RulesConfig(select=("padding-waste",), options={"padding-waste": options}),
                     layouts=layouts)


@pytest.fixture
def analysis(tmp_path: Path):
    return sc.analyse(sc.padding(), tmp_path)


def test_padded_result_is_flagged_with_aligned_sizes(analysis, snapshot):
    findings, skipped = _run(analysis)
    assert skipped == []
    # fusion.21 has no padding, fusion.22 is 9.4 % (near miss under 10 %), fusion.23 is 0.09 %.
    assert [f.ops for f in findings] == [("fusion.20",)]
    f = findings[0]
    assert "25.1% padding (804,864 bytes for 603,084)" in f.message
    assert f.fix == "pad to tile multiples (dim 0: 3 → 4, dim 1: 50257 → 50304) and mask or slice the extra elements"
    # 1,000 µs per step x (804,864 - 603,084) / 804,864.
    assert f.saving.ps == round(1000 * sc.US * (804_864 - 603_084) / 804_864)
    assert f.saving.basis == "modelled"
    snapshot("padding-waste", render_findings(findings))


def test_near_miss_is_reported_with_a_lower_threshold(analysis):
    # fusion.22 is under both defaults: 9.4 % padding and 3,840 padding bytes.
    assert [f.ops[0] for f in _run(analysis, min_padding_fraction=0.05)[0]] == ["fusion.20"]
    findings, _ = _run(analysis, min_padding_fraction=0.05, min_padding_bytes=1024)
    assert [f.ops[0] for f in findings] == ["fusion.20", "fusion.22"]
    assert "1160 → 1280" in findings[1].fix


def test_skipped_without_a_layout_parser(analysis, monkeypatch):
    monkeypatch.setattr(engine, "default_layout_provider", lambda: None)
    findings, skipped = run_rules(analysis, RulesConfig(select=("padding-waste",)))
    assert findings == []
    assert [(s.rule, s.reason) for s in skipped] == [
        ("padding-waste", "needs layouts (op shapes with TPU tiled layouts and the layout parser)")]


def test_skipped_when_no_op_has_a_tiled_layout(tmp_path: Path):
    findings, skipped = _run(sc.analyse(sc.exposed_collectives(), tmp_path))
    assert findings == [] and [s.rule for s in skipped] == ["padding-waste"]


def test_with_the_real_layout_parser(analysis):
    findings, _ = _run(analysis, layouts=layout.parse_shape)
    assert [f.ops[0] for f in findings] == ["fusion.20"]
    assert "50257 → 50304" in findings[0].fix


def test_a_small_minor_dim_is_relaid_out_not_padded(tmp_path: Path):
    # bf16[4096,4] in VMEM: the minor dim of 4 fills 4 of 128 lanes (96.9 % padding). Padding it to
    # 128 would be absurd; the fix is to make 4096 the minor dim. A padded scalar next to it has
    # 508 padding bytes: under `min_padding_bytes`, it costs latency, not bandwidth.
    shapes = {"bf16[4096,4]{1,0:T(8,128)(2,1)S(1)}": ArrayShape(
                  dtype="bf16", dims=(4096, 4), logical_bytes=32768, padded_bytes=1048576,
                  layout=Layout(minor_to_major=(1, 0), tiles=((8, 128), (2, 1)), memory_space=1)),
              "f32[]{:T(128)}": ArrayShape(dtype="f32", dims=(), logical_bytes=4, padded_bytes=512,
                                           layout=Layout(minor_to_major=(), tiles=((128,),))),
              }
    ops = (sc.OpDef("fusion.30", "loop fusion", bytes_accessed=1e6, shape="bf16[4096,4]{1,0:T(8,128)(2,1)S(1)}"),
           sc.OpDef("all-reduce.31", "all-reduce", bytes_accessed=4, shape="f32[]{:T(128)}"))

    def schedule(chip, step):
        return [sc.Placed("fusion.30", 0, 100 * sc.US), sc.Placed("all-reduce.31", 100 * sc.US, 100 * sc.US)]

    findings, _ = _run(sc.analyse(sc.design(ops, schedule), tmp_path), layouts=shapes.__getitem__)
    (f,) = findings
    assert f.ops == ("fusion.30",)
    assert f.fix.startswith("dim 1 (4 of a 128-wide tile) is too small to pad: make a larger dim the minor one")
    assert dict(f.evidence[0].values)["memory space"] == "vmem"


# -- thresholds, order and severity, worked by hand ------------------------------------------------
# Every op below runs once per step on both chips; the capture is 3 steps of 10 ms on 2 chips, so
# device time is 2 x 30 ms = 60 ms and an op of T µs per step takes 6 T / 60,000 of it.
EDGE = {
    # 50 µs per step: 0.5 % of device time, under `min_time_share` (1 %), though 50 % padding.
    "f32[4,32768]{1,0:T(8,128)}": _array("f32", (4, 32768), (1, 0), (8, 128), 524_288, 1_048_576),
    # A layout the parser cannot read: skipped.
    "f32[9,9]{1,0:T(8,128)Z}": None,
    # No padding at all.
    "f32[8,1024]{1,0:T(8,128)}": _array("f32", (8, 1024), (1, 0), (8, 128), 32768, 32768),
    # Exactly at both thresholds: 36 rows padded to 40 = 10.0 % of 655,360 bytes = 65,536 bytes.
    "f32[36,4096]{1,0:T(8,128)}": _array("f32", (36, 4096), (1, 0), (8, 128), 589_824, 655_360),
    # 50 %: 4 rows padded to 8.
    "f32[4,65536]{1,0:T(8,128)}": _array("f32", (4, 65536), (1, 0), (8, 128), 1_048_576, 2_097_152),
    # 10 % padding but 32,768 padding bytes: under `min_padding_bytes`.
    "f32[36,2048]{1,0:T(8,128)}": _array("f32", (36, 2048), (1, 0), (8, 128), 294_912, 327_680),
}


def _edge_layouts(text: str):
    shape = EDGE[text]
    if shape is None:
        raise ValueError(f"unknown layout {text}")
    return shape


EDGE_OPS = (  # (op, µs per step); listed (and named) in the order the rule meets them
    (sc.OpDef("fusion.39", "loop fusion", bytes_accessed=1e6, shape="f32[36,2048]{1,0:T(8,128)}"), 1000),
    (sc.OpDef("fusion.40", "loop fusion", bytes_accessed=1e6, shape="f32[4,32768]{1,0:T(8,128)}"), 50),
    (sc.OpDef("fusion.41", "loop fusion", bytes_accessed=1e6, shape="f32[9,9]{1,0:T(8,128)Z}"), 1000),
    (sc.OpDef("fusion.42", "loop fusion", bytes_accessed=1e6, shape="f32[8,1024]{1,0:T(8,128)}"), 1000),
    (sc.OpDef("fusion.43", "loop fusion", bytes_accessed=1e6, shape="f32[36,4096]{1,0:T(8,128)}"), 2000),
    (sc.OpDef("fusion.44", "loop fusion", bytes_accessed=1e6, shape="f32[4,65536]{1,0:T(8,128)}"), 1000),
)


def _edge_schedule(chip: int, step: int) -> list:
    out, t = [], 0
    for op, us in EDGE_OPS:
        out.append(sc.Placed(op.name, t, us * sc.US))
        t += us * sc.US
    return out


@pytest.fixture
def edges(tmp_path: Path):
    return sc.analyse(sc.design([op for op, _ in EDGE_OPS], _edge_schedule), tmp_path)


def test_thresholds_are_inclusive_and_skipped_ops_do_not_stop_the_search(edges):
    findings, _ = _run(edges, layouts=_edge_layouts)
    # fusion.39 (too few padding bytes), .40 (too little time), .41 (unreadable), .42 (no padding)
    # come before the two findings and are skipped without ending the search.
    assert sorted(f.ops[0] for f in findings) == ["fusion.43", "fusion.44"]
    by_op = {f.ops[0]: f for f in findings}
    # Savings: 2,000 µs x 10 % = 200 µs; 1,000 µs x 50 % = 500 µs per step.
    assert by_op["fusion.43"].saving.ps == 200 * sc.US
    assert by_op["fusion.44"].saving.ps == 500 * sc.US
    assert "`fusion.43` result `f32[36,4096]{1,0:T(8,128)}` is 10.0% padding (655,360 bytes for 589,824) " \
           "and takes 20.0% of device time" == by_op["fusion.43"].message
    assert dict(by_op["fusion.44"].evidence[0].values)["time share"] == "10.0%"
    # Severity from the saving's share of the 10 ms step: 5 % is medium (from 3 %), 2 % is low.
    assert by_op["fusion.44"].severity is Severity.MEDIUM
    assert by_op["fusion.43"].severity is Severity.LOW
    assert by_op["fusion.43"].host == "host0"  # one host: the finding names it


def test_over_several_hosts_a_finding_names_none(tmp_path: Path):
    designs = [sc.design([op for op, _ in EDGE_OPS], _edge_schedule, hostname=f"host{h}", first_chip=2 * h)
               for h in range(2)]
    findings, _ = _run(sc.analyse_hosts(designs, tmp_path), layouts=_edge_layouts)
    assert sorted(f.ops[0] for f in findings) == ["fusion.43", "fusion.44"]
    assert {f.host for f in findings} == {""}


def test_severity_is_capped_at_medium_and_follows_the_options(edges):
    findings, _ = _run(edges, layouts=_edge_layouts, high_share=0.04)
    assert {f.ops[0]: f.severity for f in findings} == {"fusion.44": Severity.MEDIUM, "fusion.43": Severity.LOW}
    findings, _ = _run(edges, layouts=_edge_layouts, medium_share=0.02)
    assert {f.ops[0]: f.severity for f in findings} == {"fusion.44": Severity.MEDIUM, "fusion.43": Severity.MEDIUM}


def test_max_findings_keeps_the_largest_saving(edges):
    findings, _ = _run(edges, layouts=_edge_layouts, max_findings=1)
    assert [f.ops[0] for f in findings] == ["fusion.44"]


def test_no_padding_is_never_a_finding_even_with_zero_thresholds(edges):
    findings, _ = _run(edges, layouts=_edge_layouts, min_padding_fraction=0.0, min_padding_bytes=0,
                       min_time_share=0.0)
    # Every readable padded op is reported; fusion.42 (padded = logical) never is.
    assert sorted(f.ops[0] for f in findings) == ["fusion.39", "fusion.40", "fusion.43", "fusion.44"]


def test_a_tuple_result_names_each_memory_space(tmp_path: Path):
    # A tuple of an HBM array and a VMEM array (S(1)), each 4 rows padded to 8: 50 % padding.
    text = "(f32[4,65536]{1,0:T(8,128)}, f32[4,65536]{1,0:T(8,128)S(1)})"
    hbm = _array("f32", (4, 65536), (1, 0), (8, 128), 1_048_576, 2_097_152)
    vmem = ArrayShape(dtype="f32", dims=(4, 65536), logical_bytes=1_048_576, padded_bytes=2_097_152,
                      layout=Layout(minor_to_major=(1, 0), tiles=((8, 128),), memory_space=1))
    shape = TupleShape((hbm, vmem))
    op = sc.OpDef("fusion.46", "loop fusion", bytes_accessed=1e6, shape=text)

    def schedule(chip, step):
        return [sc.Placed("fusion.46", 0, 1000 * sc.US)]

    (f,) = _run(sc.analyse(sc.design([op], schedule), tmp_path), layouts={text: shape}.__getitem__)[0]
    assert dict(f.evidence[0].values)["memory space"] == "hbm, vmem"
