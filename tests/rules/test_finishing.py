"""What the engine does to every rule's findings: repeats grouped into one, ops located in the model.

Regression for issue 20 (items 4 and 7): `padding-waste` reported `multiply_reduce_fusion` and its
clone `multiply_reduce_fusion.1` as two findings with one shape and one fix, and no finding said
which line of the model an op comes from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
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


# -- grouping and locating by the compiled program alone (no trace rows): hand-made findings ---------

# A program with a loop. fusion.1 and fusion.2 are clones (one opcode, kind, result and operand shape);
# fusion.9, in the loop body, is the same instruction again (a layer's op in every layer). Near misses:
# fusion.3 reads a bf16 operand, fusion.4 is an output fusion. fusion.6 comes from another line.
PROGRAM_HLO = """HloModule jit_step, is_scheduled=true

%f (x: f32[1024,256]) -> f32[1024,256] {
  ROOT %x = f32[1024,256]{1,0} parameter(0)
}

%body (p: f32[1024,256]) -> f32[1024,256] {
  %p = f32[1024,256]{1,0} parameter(0)
  ROOT %fusion.9 = f32[1024,256]{1,0} fusion(%p), kind=kLoop, calls=%f, metadata={op_name="jit(step)/while/body/mul" source_file="/home/u/model.py" source_line=33}
}

%cond (c: f32[1024,256]) -> pred[] {
  %c = f32[1024,256]{1,0} parameter(0)
  ROOT %t = pred[] constant(true)
}

ENTRY %main (a: f32[1024,256], b: bf16[1024,256]) -> f32[1024,256] {
  %a = f32[1024,256]{1,0} parameter(0)
  %b = bf16[1024,256]{1,0} parameter(1)
  %fusion.1 = f32[1024,256]{1,0} fusion(%a), kind=kLoop, calls=%f, metadata={op_name="jit(step)/mul" source_file="/home/u/model.py" source_line=12}
  %fusion.2 = f32[1024,256]{1,0} fusion(%a), kind=kLoop, calls=%f, metadata={op_name="jit(step)/mul" source_file="/home/u/model.py" source_line=12}
  %fusion.3 = f32[1024,256]{1,0} fusion(%b), kind=kLoop, calls=%f
  %fusion.4 = f32[1024,256]{1,0} fusion(%a), kind=kOutput, calls=%f, metadata={op_name="jit(step)/dot_general"}
  %fusion.6 = f32[1024,256]{1,0} fusion(%a), kind=kOutput, calls=%f, metadata={source_file="/home/u/layers.py" source_line=7}
  ROOT %while.5 = f32[1024,256]{1,0} while(%fusion.1), condition=%cond, body=%body
}
"""


def _program():
    from tpudiag.parsers.hlo_text import parse_hlo_text

    return parse_hlo_text(PROGRAM_HLO)


def _finding(op: str, ps: int, severity=None, *, rule: str = "memory-bound", fix: str = "fuse it",
             message: str | None = None, ops: tuple[str, ...] | None = None):
    from tpudiag.model.findings import Evidence, Finding, Saving, Severity

    return Finding(rule=rule, code="TPD106", severity=severity or Severity.LOW,
                   message=message or f"`{op}` moves 1 GiB", saving=Saving(ps, "measured", "its self time"),
                   fix=fix, evidence=(Evidence(op, (("time", f"{ps} ps"),)),), ops=ops or (op,))


def test_clones_in_the_program_are_grouped_without_a_trace_row():
    from tpudiag.model.findings import Severity
    from tpudiag.rules.finishing import group_repeats

    small = _finding("fusion.1", 300)
    large = _finding("fusion.2", 500, Severity.MEDIUM)
    looped = _finding("fusion.9", 300)  # ties fusion.1's saving: the op names order the two
    bf16 = _finding("fusion.3", 900)  # another operand shape
    output = _finding("fusion.4", 900)  # another fusion kind
    unknown = _finding("fusion.77", 900)  # in no program and no trace: never grouped, not even with another such
    unknown_too = _finding("fusion.78", 900)
    two_ops = _finding("fusion.1", 900, ops=("fusion.1", "fusion.2"))  # a finding of two ops is left whole
    other_fix = _finding("fusion.1", 100, fix="pad it")
    other_rule = _finding("fusion.2", 100, rule="padding-waste")
    findings = [small, bf16, large, output, unknown, looped, unknown_too, two_ops, other_fix, other_rule]
    out = group_repeats(findings, None, (_program(),))
    # The group takes the place of its first member; the rest keep their order.
    assert [f.ops for f in out] == [("fusion.2", "fusion.1", "fusion.9"), ("fusion.3",), ("fusion.4",),
                                    ("fusion.77",), ("fusion.78",), ("fusion.1", "fusion.2"), ("fusion.1",),
                                    ("fusion.2",)]
    group = out[0]
    # The largest member's message, then the others by saving, then by name; no trace: no "together".
    assert group.message == ("`fusion.2` moves 1 GiB; 2 more ops of the same shape with the same fix: "
                             "`fusion.1`, `fusion.9` (3 ops)")
    assert (group.saving.ps, group.saving.basis) == (1100, "measured")
    assert group.saving.explanation == "its self time, summed over the 3 ops of one shape"
    # No rule's scale given: the highest of the members' severities.
    assert group.severity is Severity.MEDIUM
    assert [e.subject for e in group.evidence] == ["fusion.2", "fusion.1", "fusion.9"]
    assert out[1:] == [bf16, output, unknown, unknown_too, two_ops, other_fix, other_rule]


def test_a_group_of_two_says_one_more_op():
    from tpudiag.rules.finishing import group_repeats

    [group] = group_repeats([_finding("fusion.2", 200), _finding("fusion.1", 200)], None, (_program(),))
    assert group.message == ("`fusion.1` moves 1 GiB; 1 more op of the same shape with the same fix: `fusion.2` "
                             "(2 ops)")
    assert group.ops == ("fusion.1", "fusion.2")


def test_sites_come_from_the_programs_metadata_when_the_trace_has_none():
    from tpudiag.model.findings import Evidence
    from tpudiag.rules.finishing import locate

    # fusion.1: file and line (the file's last path component) and JAX op; fusion.4: the JAX op only;
    # fusion.6: the line only; fusion.3: no metadata, so no site.
    mixed = _finding("fusion.1", 400, message="`fusion.1` feeds `fusion.4`, `fusion.6` and `fusion.3`",
                     ops=("fusion.1", "fusion.4", "fusion.6", "fusion.3"))
    mixed = dataclasses.replace(mixed, evidence=(Evidence("fusion.1", (("at", "model.py:12"),)),  # the rule wrote the line
                                     Evidence("fusion.4", (("bytes", "1 GiB"),)), Evidence("fusion.3", ())))
    bare = _finding("fusion.3", 100)
    [located, untouched] = locate([mixed, bare], None, (_program(),))
    assert [(s.op, s.source, s.tf_op) for s in located.sites] == [
        ("fusion.1", "model.py:12", "jit(step)/mul"), ("fusion.4", "", "jit(step)/dot_general"),
        ("fusion.6", "layers.py:7", "")]
    assert located.message == ("`fusion.1` (at `model.py:12`, `jit(step)/mul`) feeds `fusion.4` (at "
                               "`jit(step)/dot_general`), `fusion.6` (at `layers.py:7`) and `fusion.3`")
    assert located.evidence == (Evidence("fusion.1", (("at", "model.py:12"),)),
                                Evidence("fusion.4", (("bytes", "1 GiB"), ("at", "jit(step)/dot_general"))),
                                Evidence("fusion.3", ()))
    assert untouched == bare


def test_at_most_three_sites_are_written_into_a_message_and_a_line_once():
    from tpudiag.rules.finishing import MAX_SITES_IN_MESSAGE, locate

    assert MAX_SITES_IN_MESSAGE == 3
    # Four ops with a site; fusion.1 and fusion.2 share one line, told once; fusion.9 is the fourth site.
    f = _finding("fusion.1", 400, message="`fusion.1`, `fusion.2`, `fusion.4`, `fusion.6` and `fusion.9` are slow",
                 ops=("fusion.1", "fusion.2", "fusion.4", "fusion.6", "fusion.9"))
    [located] = locate([f], None, (_program(),))
    # The first three sites in the message's order are tried: fusion.2's line was told with fusion.1's.
    assert located.message == ("`fusion.1` (at `model.py:12`, `jit(step)/mul`), `fusion.2`, `fusion.4` (at "
                               "`jit(step)/dot_general`), `fusion.6` and `fusion.9` are slow")
    assert [s.op for s in located.sites] == ["fusion.1", "fusion.2", "fusion.4", "fusion.6", "fusion.9"]


def test_a_site_is_written_after_the_first_mention_only():
    from tpudiag.rules.finishing import locate

    f = _finding("fusion.1", 100, message="`fusion.1` waits; `fusion.1` again; and `fusion.1` a third time")
    [located] = locate([f], None, (_program(),))
    assert located.message == ("`fusion.1` (at `model.py:12`, `jit(step)/mul`) waits; `fusion.1` again; and "
                               "`fusion.1` a third time")


def test_a_groups_severity_is_its_rules_scale_on_the_summed_saving(analysis):
    # memory-bound's scale (high 15 %, medium 3 % of the 10 ms step; the rule's own severity is high),
    # applied to the group's summed saving, never below its highest member.
    from tpudiag.model.findings import Severity
    from tpudiag.rules import hbm_pressure, memory_bound
    from tpudiag.rules.finishing import _severity

    rule = (memory_bound.RULE, memory_bound.Options())
    low = [_finding("fusion.1", 0, Severity.LOW), _finding("fusion.2", 0, Severity.LOW)]
    assert _severity(low, 500 * sc.US, analysis, rule) is Severity.MEDIUM  # 5 %
    assert _severity(low, 1500 * sc.US, analysis, rule) is Severity.HIGH  # 15 %, inclusive
    assert _severity(low, 100 * sc.US, analysis, rule) is Severity.LOW  # 1 %
    medium = [_finding("fusion.1", 0, Severity.MEDIUM), *low]
    assert _severity(medium, 100 * sc.US, analysis, rule) is Severity.MEDIUM  # the highest member
    # No step time to scale with (no trace), or a rule without a scale: the highest member.
    assert _severity(low, 500 * sc.US, None, rule) is Severity.LOW
    assert _severity(low, 1500 * sc.US, analysis, (hbm_pressure.RULE, hbm_pressure.Options())) is Severity.LOW
    assert _severity(low, 1500 * sc.US, analysis, None) is Severity.LOW


# -- grouping and locating from the trace's own rows (the clones design, its metadata edited here) ---

def _traced(tmp_path, **columns):
    """The clones design analysed (`multiply_fusion`, `.1`: loop fusions; `fusion.9`: a convolution
    fusion; one result shape), with the ops table's columns replaced by `columns` (in its row order:
    multiply_fusion, multiply_fusion.1, fusion.9)."""
    analysis = sc.analyse(sc.design(OPS, _schedule), tmp_path)
    assert analysis.ops["name"].astype(str).tolist() == ["multiply_fusion", "multiply_fusion.1", "fusion.9"]
    return dataclasses.replace(analysis, ops=analysis.ops.assign(**{
        k: pd.array(v, dtype="string") for k, v in columns.items()}))


def test_a_trace_site_needs_a_source_or_a_jax_op_and_a_missing_one_is_empty(tmp_path):
    from tpudiag.rules.finishing import locate

    analysis = _traced(tmp_path, source=["model.py:12", None, None], tf_op=[None, "jit(step)/mul", None])
    f = _finding("multiply_fusion", 100, message="`multiply_fusion`, `multiply_fusion.1` and `fusion.9` wait",
                 ops=("multiply_fusion", "multiply_fusion.1", "fusion.9"))
    [located] = locate([f], analysis, ())
    # fusion.9 has neither in the trace and no program knows it: no site, its name left bare.
    assert [(s.op, s.source, s.tf_op) for s in located.sites] == [("multiply_fusion", "model.py:12", ""),
                                                                  ("multiply_fusion.1", "", "jit(step)/mul")]
    assert located.message == ("`multiply_fusion` (at `model.py:12`), `multiply_fusion.1` (at `jit(step)/mul`) and "
                               "`fusion.9` wait")
    assert [(e.subject, e.values) for e in located.evidence] == [
        ("multiply_fusion", (("time", "100 ps"), ("at", "model.py:12")))]


def test_the_trace_site_wins_over_the_programs(tmp_path):
    # `fusion.1` is in the program (model.py:12) and, renamed here, in the trace (train.py:3).
    from tpudiag.rules.finishing import locate

    analysis = _traced(tmp_path, name=["fusion.1", "multiply_fusion.1", "fusion.9"],
                       source=["train.py:3", "model.py:12", "model.py:20"])
    [located] = locate([_finding("fusion.1", 100)], analysis, (_program(),))
    assert [(s.op, s.source, s.tf_op) for s in located.sites] == [("fusion.1", "train.py:3", "jit(step)/mul")]


def test_one_result_shape_of_another_kind_is_not_a_repeat(tmp_path):
    # fusion.9 has the clones' result shape but is a convolution fusion: not grouped with them.
    from tpudiag.rules.finishing import group_repeats

    analysis = sc.analyse(sc.design(OPS, _schedule), tmp_path)
    out = group_repeats([_finding("multiply_fusion", 300), _finding("fusion.9", 200),
                         _finding("multiply_fusion.1", 100)], analysis, ())
    assert [f.ops for f in out] == [("multiply_fusion", "multiply_fusion.1"), ("fusion.9",)]
    # Same kind, another result shape: not a repeat either.
    reshaped = dataclasses.replace(analysis, ops=analysis.ops.assign(
        shape_with_layout=pd.array([SHAPE, "f32[4,50304]{1,0:T(4,128)}", SHAPE], dtype="string")))
    out = group_repeats([_finding("multiply_fusion", 300), _finding("multiply_fusion.1", 100)], reshaped, ())
    assert [f.ops for f in out] == [("multiply_fusion",), ("multiply_fusion.1",)]


def test_a_source_file_without_a_directory_is_its_own_name():
    from tpudiag.parsers.hlo_text import parse_hlo_text
    from tpudiag.rules.finishing import locate

    program = parse_hlo_text(PROGRAM_HLO.replace('source_file="/home/u/layers.py"', 'source_file="layers.py"'))
    [located] = locate([_finding("fusion.6", 100)], None, (program,))
    assert [(s.source, s.tf_op) for s in located.sites] == [("layers.py:7", "")]
