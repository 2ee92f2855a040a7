"""What the engine does to every rule's findings: repeats grouped into one, ops located in the model.

Regression for issue 20 (items 4 and 7): `padding-waste` reported `multiply_reduce_fusion` and its
clone `multiply_reduce_fusion.1` as two findings with one shape and one fix, and no finding said
which line of the model an op comes from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.test_padding_waste import known_layouts
from tests.rules.scenarios import run_rules
from tpudiag.rules import RulesConfig
from tpudiag.writers.tpu_design import OpDef, Placed

SHAPE = "f32[3,50257]{1,0:T(4,128)}"  # 25.1 % padding; fix: pad dim 0 to 4 and dim 1 to 50304
# Two clones (one shape, one category, one fix), each 1,000 µs per step, from one line of the model.
CLONE = OpDef("multiply_fusion", "loop fusion", bytes_accessed=1.6e9, shape=SHAPE, source="model.py:12",
              tf_op="jit(step)/mul")
CLONE_1 = OpDef("multiply_fusion.1", "loop fusion", bytes_accessed=1.6e9, shape=SHAPE, source="model.py:12",
                tf_op="jit(step)/mul")
# Near miss: the same result shape but another kind of op (a convolution fusion): not a clone.
OTHER = OpDef("fusion.9", "convolution fusion", bytes_accessed=1.6e9, shape=SHAPE, source="model.py:20",
              tf_op="jit(step)/dot_general")
OPS = (CLONE, CLONE_1, OTHER)


def _schedule(chip: int, step: int) -> list[Placed]:
    return [Placed(op.name, i * 1000 * sc.US, 1000 * sc.US) for i, op in enumerate(OPS)]


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    return sc.analyse(sc.design(OPS, _schedule), tmp_path_factory.mktemp("clones"))


def _padding(analysis):
    return run_rules(analysis, RulesConfig(select=("padding-waste",)), layouts=known_layouts)[0]


def test_clones_are_one_finding_listing_both_ops_with_summed_saving(analysis, snapshot):
    findings = _padding(analysis)
    assert sorted(f.ops for f in findings) == [("fusion.9",), ("multiply_fusion", "multiply_fusion.1")]
    [group] = [f for f in findings if len(f.ops) == 2]
    [other] = [f for f in findings if f.ops == ("fusion.9",)]
    one = round(1000 * sc.US * (804_864 - 603_084) / 804_864)  # each clone's saving, as for one op
    assert other.saving.ps == one
    assert group.saving.ps == 2 * one
    # Each clone alone saves 2.5 % of the step (low); together 5.0 %: medium on the rule's scale (3 %).
    assert (other.severity.label(), group.severity.label()) == ("low", "medium")
    assert "summed over the 2 ops of one shape" in group.saving.explanation
    assert "1 more op of the same shape with the same fix: `multiply_fusion.1`" in group.message
    # 2 x 1,000 µs in each 10 ms step of each chip: 20 % of device time.
    assert "(2 ops, together 2.00 ms per step, 20.0% of device time)" in group.message
    assert [e.subject for e in group.evidence] == ["multiply_fusion", "multiply_fusion.1"]
    snapshot("finishing-clones", render_findings(findings))


def test_findings_name_the_source_line_and_jax_op_beside_the_hlo_name(analysis):
    by_op = {f.ops[0]: f for f in _padding(analysis)}
    other = by_op["fusion.9"]
    assert other.message.startswith("`fusion.9` (at `model.py:20`, `jit(step)/dot_general`) result")
    assert [(s.op, s.source, s.tf_op) for s in other.sites] == [("fusion.9", "model.py:20", "jit(step)/dot_general")]
    assert ("at", "model.py:20, jit(step)/dot_general") in other.evidence[0].values
    group = by_op["multiply_fusion"]
    assert len(group.sites) == 2
    # One line of the model is told once in the message, every op's evidence row names it.
    assert group.message.count("`model.py:12`") == 1
    assert all(("at", "model.py:12, jit(step)/mul") in e.values for e in group.evidence)


def test_ops_without_metadata_keep_their_message(tmp_path: Path):
    bare = (OpDef("fusion.20", "loop fusion", bytes_accessed=1.6e9, shape=SHAPE),)
    d = sc.design(bare, lambda chip, step: [Placed("fusion.20", 0, 1000 * sc.US)])
    [f] = _padding(sc.analyse(d, tmp_path))
    assert f.sites == () and f.message.startswith("`fusion.20` result")


@pytest.mark.skipif(not (REPO / "examples" / "models" / "dumps" / "llm_decode_v5e").is_dir(),
                    reason="the bundled llm_decode_v5e example is not in this checkout")
def test_decode_example_reports_one_padding_finding_per_clone_group():
    import tpudiag

    models = REPO / "examples" / "models"
    d = tpudiag.diagnose(models / "captures" / "llm_decode_v5e", dumps=[models / "dumps" / "llm_decode_v5e"],
                         select=["padding-waste"])
    ops = [f.ops for f in d.findings]
    assert ("multiply_reduce_fusion", "multiply_reduce_fusion.1") in ops
    assert ("divide_convert_fusion", "divide_convert_fusion.1") in ops
    cited = [op for group in ops for op in group]
    assert len(cited) == len(set(cited))  # no op in two findings of one rule
    for f in d.findings:
        assert "`llm_decode.py:" in f.message, f.message
