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
from tpudiag.model.compiled import ArrayShape, Layout
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
