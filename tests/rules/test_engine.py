"""The engine: ranking, skips, selection, a healthy capture, and the layering rules never break."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.rules import RULES, RulesConfig
from tpudiag.rules.base import StepBasis, per_step_worst_core, step_basis

RULES_DIR = Path(__file__).resolve().parents[2] / "tpudiag" / "rules"


def test_healthy_capture_has_no_high_severity_finding(tmp_path: Path):
    findings, _ = run_rules(sc.analyse(sc.healthy(), tmp_path))
    assert [f for f in findings if f.severity >= Severity.HIGH] == []
    assert findings == []


def test_findings_are_ranked_by_saving_across_rules(tmp_path: Path):
    # Both collective and matmul problems in one capture: the ranking interleaves the rules.
    ops = sc.COLLECTIVE_OPS + sc.MXU_OPS

    def schedule(chip, step):
        return sc.exposed_collectives_schedule(chip, step) + [
            sc.Placed(p.op, p.offset_ps + 7000 * sc.US, p.dur_ps // 4) for p in sc.mxu_schedule(chip, step)[:3]]

    findings, skipped = run_rules(sc.analyse(sc.design(ops, schedule), tmp_path))
    savings = [f.saving.ps for f in findings]
    assert savings == sorted(savings, reverse=True)
    # The steps end idle after 7.7 ms of 10: device-idle reports that too.
    assert {f.rule for f in findings} == {"exposed-collective", "low-mxu-utilization", "device-idle"}
    assert "spill" in {s.rule for s in skipped}


def test_select_and_ignore(tmp_path: Path):
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    findings, skipped = run_rules(analysis, RulesConfig(ignore=("exposed-collective",)))
    assert all(f.rule != "exposed-collective" for f in findings)
    findings, skipped = run_rules(analysis, RulesConfig(select=("spill",)))
    assert findings == [] and [s.rule for s in skipped] == ["spill"]


def test_rules_skip_on_a_capture_without_tpu_ops(tmp_path: Path):
    analysis = sc.analyse(sc.design((), lambda chip, step: []), tmp_path)
    findings, skipped = run_rules(analysis)
    assert findings == []
    assert {s.rule: s.reason for s in skipped}["exposed-collective"] == "needs a device trace with ops (TPU, GPU or XLA CPU)"


def test_step_basis_and_worst_core(tmp_path: Path):
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    basis = step_basis(analysis)
    assert (basis.n_steps, basis.step_ps, basis.whole_capture) == (3, 10_000 * sc.US, False)
    ev = analysis.profile.hosts[0].events
    ar = ev[ev["name"] == "all-reduce.4"]
    assert per_step_worst_core(ar, "dur_ps", basis) == 800 * sc.US  # chip 1's 800 µs, not the mean


def test_without_steps_the_capture_counts_as_one_step(tmp_path: Path):
    d = sc.exposed_collectives(steps_line=False, modules_line=False)
    findings, _ = run_rules(sc.analyse(d, tmp_path), RulesConfig(select=("exposed-collective",)))
    sync = [f for f in findings if f.message.startswith("synchronous")][0]
    assert sync.saving.ps == 3 * 800 * sc.US and "whole capture" in sync.saving.explanation
    # The engine says so for every saving in time: per capture, and "per step" in its explanation too.
    assert {f.saving.per for f in findings} == {"capture"}
    assert sync.saving.explanation == ("largest exposed collective time on any core over the capture, averaged over "
                                       "1 step (no steps: whole capture)")


@pytest.mark.parametrize("path", sorted(RULES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_rules_never_import_render_cli_or_tui_and_never_print(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith(("tpudiag.render", "tpudiag.cli", "tpudiag.tui")), node.module
            if path.name not in ("engine.py", "config.py"):  # only the engine builds inputs from parsers
                assert not node.module.startswith("tpudiag.parsers"), f"{path.name} imports {node.module}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith(("tpudiag.render", "tpudiag.cli", "tpudiag.tui", "rich")), alias.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("print", "open"), f"{path.name} calls {node.func.id}"


def test_registry_is_sorted_and_unique():
    codes = [r.code for r in RULES]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)
    assert len({r.name for r in RULES}) == len(RULES)


def test_severity_scale_boundaries_and_cap():
    from tpudiag.rules.base import SeverityScale

    scale = SeverityScale(high_share=0.15, medium_share=0.03)
    assert scale.of(0.15, Severity.HIGH) == Severity.HIGH
    assert scale.of(0.1499, Severity.HIGH) == Severity.MEDIUM
    assert scale.of(0.03, Severity.HIGH) == Severity.MEDIUM
    assert scale.of(0.0299, Severity.HIGH) == Severity.LOW
    assert scale.of(0.5, Severity.MEDIUM) == Severity.MEDIUM  # a rule's own severity caps its findings


def test_a_dominant_problem_is_high_severity(tmp_path: Path):
    # The synchronous all-reduce stretched to 2 ms of a 10 ms step: 20 % exposed, above 15 %.
    def schedule(chip, step):
        return [sc.Placed("fusion.1", 0, 3000 * sc.US), sc.Placed("all-reduce.4", 3000 * sc.US, 2000 * sc.US)]

    findings, _ = run_rules(sc.analyse(sc.design(sc.COLLECTIVE_OPS, schedule), tmp_path),
                            RulesConfig(ignore=("device-idle",)))  # the step's last 5 ms are idle too
    assert [(f.rule, f.severity) for f in findings] == [("exposed-collective", Severity.HIGH)]


def test_declared_tables_are_checked_before_a_rule_runs(tmp_path: Path):
    analysis = sc.analyse(sc.low_mxu(), tmp_path)
    analysis = replace(analysis, ops=analysis.ops.drop(columns=["flop_rate"]))  # a new analysis: others share it
    with pytest.raises(ValueError, match=r"ops table lacks columns \['flop_rate'\]"):
        run_rules(analysis, RulesConfig(select=("low-mxu-utilization",)))


def test_a_modelled_capture_has_no_measured_savings(tmp_path: Path):
    # `tpudiag simulate` marks its captures: their times are estimates, so "measured" becomes "modelled".
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    analysis = replace(analysis, profile=replace(analysis.profile, modelled=True))
    findings, _ = run_rules(analysis, RulesConfig(select=("exposed-collective",)))
    assert findings and {f.saving.basis for f in findings} == {"modelled"}
    assert all(f.saving.explanation.startswith("from a modelled capture, ") for f in findings)


# -- skip reasons: what each rule lacks, as `rules_skipped` prints it -------------------------------

TRACE_REASON = "needs a device trace with ops (TPU, GPU or XLA CPU)"
HLO_REASON = "needs the compiled HLO (`--dumps DIR` of an XLA dump, or a capture that embeds it)"
STATIC_NO_HLO = ("needs a timeline, modelled from the compiled HLO: pass the XLA dump (`--xla_dump_to`) "
                 "of the same compile too")


def _skips(analysis, compiled=None, **kwargs) -> dict[str, str]:
    from tpudiag.model.inputs import CompiledInputs
    from tpudiag.rules import run_rules as engine_run_rules

    findings, skipped = engine_run_rules(analysis, None, compiled or CompiledInputs(), **kwargs)
    assert findings == []
    return {s.rule: s.reason for s in skipped}


def test_with_no_input_every_rule_is_skipped_naming_what_it_needs():
    # Trace rules need a trace, spill its LLO dumps, the memory rules the compiled HLO.
    reasons = _skips(None)
    assert reasons == {**{r.name: TRACE_REASON for r in RULES if r.inputs[0] == "trace"},
                       "spill": "needs LLO dumps (`--dumps DIR`)",
                       "hbm-pressure": HLO_REASON, "vmem-pressure": HLO_REASON}
    assert len(reasons) == len(RULES) == 12


def test_static_mode_without_programs_asks_for_the_xla_dump():
    # Dumps alone (static) with nothing compiled: a trace rule's timeline would be modelled from the HLO,
    # so the HLO is what to pass; the memory rules read the HLO itself; spill needs the LLO dumps.
    reasons = _skips(None, static=True)
    hlo_itself = "needs the compiled HLO: pass the XLA dump (`--xla_dump_to`) of the same compile too"
    assert reasons == {**{r.name: STATIC_NO_HLO for r in RULES if r.inputs[0] == "trace"},
                       "spill": "needs LLO dumps (`--xla_jf_dump_to`) of the same compile, in the same directory",
                       "hbm-pressure": hlo_itself, "vmem-pressure": hlo_itself}


def test_static_mode_with_programs_but_no_timeline_asks_for_the_generation(tmp_path: Path):
    # The HLO is there, but no timeline was modelled (the TPU generation is unknown): say how to give it.
    from tests.memory_dumps import write_adam_dump
    from tpudiag import diagnose

    compiled = diagnose(write_adam_dump(tmp_path / "d", layers=2, target=False), select="hbm-pressure").compiled
    assert compiled.programs
    from tpudiag.rules import run_rules as engine_run_rules

    _, skipped = engine_run_rules(None, RulesConfig(select=("exposed-collective", "low-mxu-utilization")),
                                  compiled, static=True)
    generation = ("needs a timeline, modelled from the dumps only when the TPU generation is known "
                  "(keep `*.target_arguments.txt` with the dump, or pass --chip)")
    assert [(s.rule, s.reason) for s in skipped] == [("exposed-collective", generation),
                                                     ("low-mxu-utilization", generation)]


def test_a_trace_without_a_peak_says_the_peak_is_missing(tmp_path: Path):
    # The matmuls record FLOPs, but neither the trace nor the hardware table knows an unnamed chip's peak.
    no_peak = sc.analyse(sc.low_mxu(device_type="", peak_tflops=None), tmp_path / "mxu")
    _, skipped = run_rules(no_peak, RulesConfig(select=("low-mxu-utilization",)))
    assert [s.reason for s in skipped] == [
        "needs the device's peak FLOP/s: neither the trace nor the hardware table gives one"]
    # Neither half (no op records FLOPs, no peak): the input's own reason.
    neither = sc.analyse(sc.exposed_collectives(device_type="", peak_tflops=None), tmp_path / "coll")
    _, skipped = run_rules(neither, RulesConfig(select=("low-mxu-utilization",)))
    assert [s.reason for s in skipped] == ["needs per-op FLOPs and a peak FLOP/s in the trace"]


def test_static_mode_labels_time_savings_a_compiler_estimate(tmp_path: Path):
    # In static mode the analysis is a timeline modelled from the compiler's estimate: nothing is measured.
    analysis = sc.analyse(sc.exposed_collectives(), tmp_path)
    config = RulesConfig(select=("exposed-collective",))
    measured, _ = run_rules(analysis, config)
    static, _ = run_rules(analysis, config, static=True)
    assert measured and [f.saving.ps for f in static] == [f.saving.ps for f in measured]
    assert {f.saving.basis for f in measured} == {"measured"}
    assert {f.saving.basis for f in static} == {"compiler estimate"}
    assert [f.saving.explanation for f in static] == [
        f"on the timeline modelled from it, {f.saving.explanation}" for f in measured]


def test_static_mode_keeps_the_explanation_of_a_saving_in_bytes(tmp_path: Path):
    # A memory finding saves bytes, not time: no timeline was used for it, so its explanation stays whole.
    from tests.rules.test_finishing import _program
    from tests.rules.test_hbm_pressure import _lever, _memory
    from tpudiag.model.inputs import CompiledInputs, HloInput
    from tpudiag.rules import run_rules as engine_run_rules

    compiled = CompiledInputs(hlo=(HloInput(_program(), "dump"),))
    memory = (_memory(14, levers=(_lever("donation", 3),), first="donation"),)
    [f], _ = engine_run_rules(None, RulesConfig(select=("hbm-pressure",)), compiled, static=True, memory=memory)
    assert f.saving.ps == 0 and f.saving.explanation == "donation: donation frees 3 GiB; levers overlap, never add them"
    # ... nor its basis: the bytes are modelled from the buffer assignment, not the compiler's time estimate
    assert f.saving.basis == "modelled" and f.saving.bytes == 3 * 2**30


def test_tpu_only_rules_are_skipped_on_a_gpu_capture(tmp_path: Path):
    from tests import gpu_captures as gc

    analysis = sc.analyse_path(gc.write(gc.training(), tmp_path))
    _, skipped = run_rules(analysis, RulesConfig(select=("padding-waste", "spill", "vmem-pressure", "device-idle")))
    reason = "about TPU hardware (tiled layouts, LLO dumps, VMEM): not on a GPU capture"
    assert [(s.rule, s.reason) for s in skipped] == [("padding-waste", reason), ("spill", reason),
                                                     ("vmem-pressure", reason)]


def test_a_modelled_capture_keeps_savings_that_were_modelled_already(tmp_path: Path):
    # low-mxu's savings are modelled from the utilisation in any capture: nothing to relabel or prefix.
    analysis = sc.analyse(sc.low_mxu(), tmp_path)
    config = RulesConfig(select=("low-mxu-utilization",))
    measured, _ = run_rules(analysis, config)
    modelled, _ = run_rules(replace(analysis, profile=replace(analysis.profile, modelled=True)), config)
    assert measured and {f.saving.basis for f in measured} == {"modelled"}
    assert [f.saving for f in modelled] == [f.saving for f in measured]


def test_without_steps_the_step_is_the_mean_core_span(tmp_path: Path):
    # Three 10 ms periods on each chip, the last op ending 6.5 ms (chip 0's 500 µs all-reduce) and 6.8 ms
    # (chip 1's 800 µs) into the third: spans of 26.5 and 26.8 ms, 26.65 ms per core on average.
    analysis = sc.analyse(sc.exposed_collectives(steps_line=False, modules_line=False), tmp_path)
    assert step_basis(analysis) == StepBasis(1, (26_500 + 26_800) / 2 * sc.US, True)
