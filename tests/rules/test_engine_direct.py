"""`rules.engine` with toy rules: what it hands a rule, which rules it skips, and what it does to findings.

A toy rule records the context and options it is given and returns findings written here, so each
step of `run_rules` (inputs, skips, tables, static and modelled labels, grouping, sites, the whole
capture, the ranking) is checked on its own. The analyses are the scenario captures of
`tests/rules/scenarios.py` (2 chips, 3 steps of 10 ms), analysed once per process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tests.rules import scenarios as sc
from tests.rules import test_finishing as tf
from tpudiag.model.findings import Evidence, Finding, Saving, Severity
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.profile import Platform
from tpudiag.rules import engine
from tpudiag.rules.base import Rule, RuleContext, RuleInput, Table
from tpudiag.rules.engine import available_inputs, run_rules

US = sc.US


@dataclass(frozen=True)
class _Scale:
    high_share: float = 0.15
    medium_share: float = 0.03


class _Selected:
    """Stands for a `RulesConfig`: the engine asks it only for the (rule, options) it selects."""

    def __init__(self, *pairs):
        self.pairs = list(pairs)

    def resolve(self):
        return self.pairs


def _rule(name="toy", findings=(), inputs=(RuleInput.TRACE,), uses=(), tables=(), tpu_only=False, seen=None,
          severity=Severity.HIGH):
    def check(ctx, options):
        if seen is not None:
            seen.append((ctx, options))
        return list(findings)

    return Rule(code="TPD990", name=name, severity=severity, inputs=tuple(inputs), options_type=_Scale, check=check,
                doc="Toy.", uses=tuple(uses), tables=tuple(tables), tpu_only=tpu_only)


def _finding(ps, basis="measured", explanation="self time per step", ops=(), message="toy", severity=Severity.LOW,
             nbytes=0, blocking=False):
    return Finding(rule="toy", code="TPD990", severity=severity, message=message,
                   saving=Saving(ps, basis, explanation, bytes=nbytes), fix="fix it",
                   evidence=tuple(Evidence(op, (("time", "1"),)) for op in ops), ops=tuple(ops), blocking=blocking)


def _clones(tmp_path: Path):
    """The clones design of `test_finishing`: `multiply_fusion` and `.1` (one shape, `model.py:12`) and
    `fusion.9` (`model.py:20`), 1,000 µs each per 10 ms step on each chip."""
    return sc.analyse(sc.design(tf.OPS, tf._schedule), tmp_path)


def _on(analysis, platform=None, **device):
    host = analysis.profile.hosts[0]
    dev = replace(host.device, platform=platform or host.device.platform, **device)
    return replace(analysis, profile=replace(analysis.profile, hosts=(replace(host, device=dev),
                                                                      *analysis.profile.hosts[1:])))


# -- what a rule is given -------------------------------------------------------------------------

def test_a_rule_gets_the_analysis_the_inputs_its_options_and_the_memory_built_for_it(tmp_path, monkeypatch):
    import tpudiag.analysis.device_memory as device_memory
    from tpudiag.parsers.layout import parse_shape

    built = []
    monkeypatch.setattr(device_memory, "program_memories", lambda c, errors: built.append((c, errors)) or ("mem",))
    analysis = replace(_clones(tmp_path), join="the analysis' join")
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),), chip="a chip", oom_errors=("an error",))
    seen = []
    options = _Scale(0.5, 0.1)
    run_rules(analysis, _Selected((_rule(uses=(RuleInput.LAYOUTS, RuleInput.HLO), seen=seen), options)), compiled,
              join="a join")
    [(ctx, got)] = seen
    assert got is options
    assert (ctx.analysis, ctx.compiled, ctx.join, ctx.chip, ctx.static, ctx.memory) == (
        analysis, compiled, "a join", "a chip", False, ("mem",))
    assert ctx.layouts is parse_shape  # the layout parser, since the rule uses layouts
    assert built == [(compiled, ("an error",))]
    # No join given: the analysis' own; the layouts and memory given are kept.
    seen.clear()
    run_rules(analysis, _Selected((_rule(uses=(RuleInput.LAYOUTS, RuleInput.HLO), seen=seen), options)), compiled,
              layouts=len, memory=("given",), static=True)
    [(ctx, _)] = seen
    assert (ctx.join, ctx.layouts, ctx.memory, ctx.static) == ("the analysis' join", len, ("given",), True)
    assert len(built) == 1


def test_what_a_rule_does_not_use_is_not_built(tmp_path, monkeypatch):
    import tpudiag.analysis.device_memory as device_memory

    def refuse(*args):
        raise AssertionError("program_memories called for a rule that does not read the HLO")

    monkeypatch.setattr(device_memory, "program_memories", refuse)
    seen = []
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),))
    run_rules(_clones(tmp_path), _Selected((_rule(seen=seen), _Scale())), compiled)
    [(ctx, _)] = seen
    assert (ctx.layouts, ctx.memory, ctx.join) == (None, (), None)


def test_without_an_analysis_the_context_has_none_and_no_join():
    seen = []
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),))
    run_rules(None, _Selected((_rule(inputs=(RuleInput.HLO,), seen=seen), _Scale())), compiled, memory=())
    [(ctx, _)] = seen
    assert (ctx.analysis, ctx.join) == (None, None)


def test_no_config_runs_every_registered_rule():
    from tpudiag.rules import RULES

    _, skipped = run_rules(None, None, CompiledInputs())
    assert [s.rule for s in skipped] == [r.name for r in RULES]


# -- skips ------------------------------------------------------------------------------------------

def test_skips_name_the_first_missing_input_and_the_next_rule_still_runs():
    seen = []
    config = _Selected((_rule("llo-and-hlo", inputs=(RuleInput.LLO, RuleInput.HLO)), _Scale()),
                       (_rule("hlo-only", inputs=(RuleInput.HLO,), seen=seen,
                              findings=[_finding(0, "modelled", nbytes=5)]), _Scale()))
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),))
    findings, skipped = run_rules(None, config, compiled, memory=())
    assert [(s.rule, s.reason) for s in skipped] == [("llo-and-hlo", "needs LLO dumps (`--dumps DIR`)")]
    assert len(seen) == 1 and [f.saving.bytes for f in findings] == [5]
    # Neither input: the first one declared is named.
    _, skipped = run_rules(None, config, CompiledInputs())
    assert [(s.rule, s.reason) for s in skipped] == [
        ("llo-and-hlo", "needs LLO dumps (`--dumps DIR`)"),
        ("hlo-only", "needs the compiled HLO (`--dumps DIR` of an XLA dump, or a capture that embeds it)")]


def test_tpu_only_rules_skip_off_a_tpu_but_not_in_static_mode_or_on_a_tpu(tmp_path):
    analysis = _clones(tmp_path)
    seen = []
    config = _Selected((_rule("tpu-toy", tpu_only=True, seen=seen), _Scale()), (_rule("any-toy", seen=seen), _Scale()))
    _, skipped = run_rules(_on(analysis, Platform.GPU), config, CompiledInputs())
    assert [(s.rule, s.reason) for s in skipped] == [
        ("tpu-toy", "about TPU hardware (tiled layouts, LLO dumps, VMEM): not on a GPU capture")]
    assert len(seen) == 1  # the next rule ran
    # In static mode the timeline is modelled, not a GPU's: nothing is skipped for the platform.
    seen.clear()
    assert run_rules(_on(analysis, Platform.GPU), config, CompiledInputs(), static=True)[1] == []
    assert len(seen) == 2
    seen.clear()
    assert run_rules(analysis, config, CompiledInputs())[1] == [] and len(seen) == 2


def test_declared_tables_are_checked_with_the_analysis_and_not_without_one(tmp_path):
    analysis = _clones(tmp_path)
    broken = replace(analysis, ops=analysis.ops.drop(columns=["self_time_ps"]))
    with pytest.raises(ValueError, match=r"ops table lacks columns \['self_time_ps'\]"):
        run_rules(broken, _Selected((_rule(tables=(Table.OPS,)), _Scale())), CompiledInputs())
    # Without an analysis (dumps alone, no timeline) a rule reading the HLO runs, its tables unchecked.
    seen = []
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),))
    run_rules(None, _Selected((_rule(inputs=(RuleInput.HLO,), tables=(Table.OPS,), seen=seen), _Scale())), compiled,
              memory=())
    assert len(seen) == 1


# -- what happens to the findings -------------------------------------------------------------------

def test_static_mode_labels_time_savings_and_keeps_bytes_and_estimates_as_they_are(tmp_path):
    findings = [_finding(1, explanation="one ps"), _finding(0, "modelled", explanation="bytes", nbytes=9),
                _finding(2, "compiler estimate", explanation="estimated"),
                _finding(0, "measured", explanation="none", message="no saving")]
    got, _ = run_rules(_clones(tmp_path), _Selected((_rule(findings=findings), _Scale())), CompiledInputs(),
                       static=True)
    assert [(f.saving.ps, f.saving.basis, f.saving.explanation) for f in got] == [
        (2, "compiler estimate", "estimated"),  # already the compiler's estimate: not told twice
        (1, "compiler estimate", "on the timeline modelled from it, one ps"),
        (0, "compiler estimate", "none"),  # no time saved: no timeline named (ranked by message: "no saving")
        (0, "modelled", "bytes")]  # bytes are modelled from the buffers, not from the timeline: kept


def test_a_modelled_capture_relabels_measured_savings_only(tmp_path):
    analysis = _clones(tmp_path)
    modelled = replace(analysis, profile=replace(analysis.profile, modelled=True))
    findings = [_finding(3, explanation="measured one"), _finding(2, "modelled", explanation="modelled one")]
    got, _ = run_rules(modelled, _Selected((_rule(findings=findings), _Scale())), CompiledInputs())
    assert [(f.saving.basis, f.saving.explanation) for f in got] == [
        ("modelled", "from a modelled capture, measured one"), ("modelled", "modelled one")]
    # The same findings from a measured capture are left alone.
    got, _ = run_rules(analysis, _Selected((_rule(findings=findings), _Scale())), CompiledInputs())
    assert [(f.saving.basis, f.saving.explanation) for f in got] == [("measured", "measured one"),
                                                                    ("modelled", "modelled one")]


def test_repeats_are_grouped_on_the_rules_scale_and_located_from_the_trace(tmp_path):
    # Two clones, 500 µs each of a 10 ms step: each 5 % alone, 10 % together, medium on the toy scale
    # (3 % medium, 15 % high) though both members are low.
    findings = [_finding(500 * US, ops=("multiply_fusion",), message="`multiply_fusion` is slow"),
                _finding(500 * US, ops=("multiply_fusion.1",), message="`multiply_fusion.1` is slow")]
    [group], _ = run_rules(_clones(tmp_path), _Selected((_rule(findings=findings), _Scale())), CompiledInputs())
    assert group.ops == ("multiply_fusion", "multiply_fusion.1") and group.saving.ps == 1000 * US
    assert group.severity is Severity.MEDIUM
    # 2 x 1,000 µs of each 10 ms step on each chip: 2 ms per step, 20 % of device time.
    assert group.message == ("`multiply_fusion` (at `model.py:12`, `jit(step)/mul`) is slow; 1 more op of the same "
                             "shape with the same fix: `multiply_fusion.1` (2 ops, together 2.00 ms per step, 20.0% "
                             "of device time)")


def test_ops_known_only_to_the_program_are_grouped_and_located_from_it(tmp_path):
    # The clones design's trace has no `fusion.1` or `fusion.2`; the program has both, clones of one line.
    findings = [_finding(100, ops=("fusion.1",), message="`fusion.1` is slow"),
                _finding(100, ops=("fusion.2",), message="`fusion.2` is slow")]
    compiled = CompiledInputs(hlo=(HloInput(tf._program(), "dump"),))
    [group], _ = run_rules(_clones(tmp_path), _Selected((_rule(findings=findings), _Scale())), compiled, memory=())
    assert group.ops == ("fusion.1", "fusion.2")
    assert [(s.op, s.source, s.tf_op) for s in group.sites] == [("fusion.1", "model.py:12", "jit(step)/mul"),
                                                                ("fusion.2", "model.py:12", "jit(step)/mul")]
    assert group.message.startswith("`fusion.1` (at `model.py:12`, `jit(step)/mul`) is slow; 1 more op")


def test_without_steps_time_savings_are_over_the_capture(tmp_path):
    no_steps = sc.analyse(sc.exposed_collectives(steps_line=False, modules_line=False), tmp_path)
    findings = [_finding(1, explanation="self time per step, per step"),
                _finding(0, "modelled", explanation="bytes per step", nbytes=4)]
    got, _ = run_rules(no_steps, _Selected((_rule(findings=findings), _Scale())), CompiledInputs())
    assert [(f.saving.per, f.saving.explanation) for f in got] == [
        ("capture", "self time over the capture, over the capture"), ("step", "bytes per step")]
    # With steps: left as the rule wrote them.
    got, _ = run_rules(_clones(tmp_path / "stepped"), _Selected((_rule(findings=findings), _Scale())),
                       CompiledInputs())
    assert [(f.saving.per, f.saving.explanation) for f in got] == [("step", "self time per step, per step"),
                                                                  ("step", "bytes per step")]


def test_findings_are_ranked_blocking_first_then_by_saving():
    findings = [_finding(1, "modelled", message="small"), _finding(0, "modelled", message="blocking", blocking=True),
                _finding(7, "modelled", message="large")]
    got, _ = run_rules(None, _Selected((_rule(inputs=(), findings=findings), _Scale())), CompiledInputs())
    assert [f.message for f in got] == ["blocking", "large", "small"]


# -- available_inputs --------------------------------------------------------------------------------

def _inputs(analysis, layouts=None, compiled=None):
    return available_inputs(RuleContext(analysis=analysis, compiled=compiled or CompiledInputs(), layouts=layouts))


def test_inputs_of_a_trace_with_tiled_layouts_but_no_flops(tmp_path):
    analysis = _clones(tmp_path)  # f32[3,50257]{1,0:T(4,128)} on every op, no FLOPs, a v6e peak
    assert _inputs(analysis, layouts=len) == {RuleInput.TRACE, RuleInput.LAYOUTS}
    assert _inputs(analysis) == {RuleInput.TRACE}  # no layout parser: no layouts
    assert _inputs(None) == set()


def test_flops_need_an_op_with_flops_and_a_peak(tmp_path):
    analysis = _clones(tmp_path)
    one = np.zeros(len(analysis.ops))
    one[0] = 1.0  # one op records a single FLOP
    with_flops = replace(analysis, ops=analysis.ops.assign(flops=one))
    assert _inputs(with_flops) == {RuleInput.TRACE, RuleInput.FLOPS}
    assert _inputs(_on(with_flops, peak_flops_per_s=None)) == {RuleInput.TRACE}
    assert _inputs(_on(analysis, peak_flops_per_s=None)) == {RuleInput.TRACE}


def test_layouts_need_a_tiled_shape_and_a_missing_shape_is_not_one(tmp_path):
    analysis = _clones(tmp_path)
    shapes = ["f32[8,128]{1,0}"] * len(analysis.ops)
    shapes[0] = None  # missing, as the ops schema's string column holds it (<NA>)
    untiled = replace(analysis, ops=analysis.ops.assign(shape_with_layout=pd.array(shapes, dtype="string")))
    assert _inputs(untiled, layouts=len) == {RuleInput.TRACE}


def test_compiled_inputs_give_llo_and_hlo():
    compiled = CompiledInputs(llo=("an LLO dump",), hlo=(HloInput(tf._program(), "dump"),))
    assert _inputs(None, compiled=compiled) == {RuleInput.LLO, RuleInput.HLO}


def test_a_trace_without_device_events_is_no_trace(tmp_path):
    analysis = _clones(tmp_path)
    empty = replace(analysis, digests={h: SimpleNamespace(n_events=0) for h in analysis.digests})
    assert _inputs(empty, layouts=len) == set()
    assert engine._has_device_trace(analysis) and not engine._has_device_trace(empty)
