"""The noise-aware diff: no change against itself, planted changes found with sign and size, noise ignored."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataclasses import replace

from tests.analysis.diff_designs import OPS, US, design, op_defs, write
from tests.conftest import REPO
from tpudiag.analysis.diff import (NoiseOptions, PartKind, StepStats, bootstrap_ci, compare, compare_steps,
                                  diff_analyses, hlo_fingerprint)
from tpudiag.analysis.profile_analysis import Analysis, analyze
from tpudiag.model.findings import Finding, Saving, Severity
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import CaptureDesign, OpDef

EXAMPLE = REPO / "examples" / "captures" / "train_v6e_4chip"


def analysed(path):
    return analyze(load_capture(path))


# Captures analysed so far in this process, by name: the tests that share one analyse it once, and a
# mutation tester's forked runs inherit what its timing run analysed (docs/testing.md). `diff` never
# writes into an analysis. Written under one directory for the process, removed when it exits.
_ANALYSED: dict[str, Analysis] = {}
_ROOT: list[Path] = []


def _root() -> Path:
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="tpudiag-diff-")))
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # not in a forked child, which may exit before its parent
                shutil.rmtree(_ROOT[0], ignore_errors=True)

        atexit.register(remove)
    return _ROOT[0]


def analysed_design(key: str, make: Callable[[], CaptureDesign]) -> Analysis:
    """The design `make()` gives, written and analysed once per process under the name `key`."""
    if key not in _ANALYSED:
        _ANALYSED[key] = analysed(write(_root(), key, make()))
    return _ANALYSED[key]


@pytest.fixture
def runs():
    return {
        "base": analysed_design("base", lambda: design(seed=1)),
        "noise": analysed_design("noise", lambda: design(seed=2)),  # same program, other ±1 % jitter
        "slow": analysed_design("slow", lambda: design(seed=3, scale={"fusion.1": 1.2})),  # matmul 20 % slower
        "fast": analysed_design("fast", lambda: design(seed=4, scale={"fusion.2": 0.7})),  # elementwise 30 % faster
    }


def test_a_capture_against_itself_reports_no_change():
    if "example" not in _ANALYSED:
        _ANALYSED["example"], _ANALYSED["example again"] = analysed(EXAMPLE), analysed(EXAMPLE)
    a, b = _ANALYSED["example"], _ANALYSED["example again"]
    d = diff_analyses(a, b, [], [])
    assert not d.has_changes
    assert d.step_time.delta_ps == 0 and d.step_time.verdict == "within noise"
    assert len(d.ops) == 19 and not d.appeared and not d.disappeared
    assert all(o.change.delta_ps == 0 and o.matched_by == "name" for o in d.ops)


def test_one_percent_jitter_is_not_reported(runs):
    d = diff_analyses(runs["base"], runs["noise"])
    assert d.step_time.delta_ps != 0  # the runs do differ...
    assert not d.has_changes  # ...but only within noise
    assert all(abs(o.change.relative) < 0.02 for o in d.ops)


def test_a_planted_20_percent_slowdown_is_reported_with_sign_and_size(runs):
    d = diff_analyses(runs["base"], runs["slow"])
    changed = {o.name: o for o in d.significant_ops}
    assert set(changed) == {"fusion.1"}  # the other ops only jittered
    op = changed["fusion.1"].change
    assert op.verdict == "slower"
    assert op.relative == pytest.approx(0.20, abs=0.01)
    assert op.delta_ps == pytest.approx(600 * US, rel=0.05)  # 20 % of 3 ms, per step and core
    # The step is 4.7 ms of ops + 0.2 ms gap: 0.6 ms more is about +12 %.
    assert d.step_time.verdict == "slower"
    assert d.step_time.delta_ps == pytest.approx(600 * US, rel=0.1)
    assert d.step_time.relative == pytest.approx(600 / 4700, abs=0.015)
    compute = {c.name: c.change for c in d.breakdown}["compute"]
    assert compute.verdict == "slower"
    assert {c.name: c.change for c in d.collectives}["all-reduce"].verdict == "within noise"


def test_a_faster_op_has_a_negative_change(runs):
    d = diff_analyses(runs["base"], runs["fast"])
    op = {o.name: o for o in d.significant_ops}["fusion.2"].change
    assert op.verdict == "faster" and op.delta_ps < 0
    assert op.relative == pytest.approx(-0.30, abs=0.01)
    assert d.step_time.verdict == "faster"


def _swapped():
    durations = {"fusion.1": 3000 * US, "fusion.2": 1000 * US, "copy.9": 250 * US}  # all-reduce.1 gone
    return analysed_design("swapped", lambda: design(seed=5, durations=durations))


def test_ops_that_appear_and_disappear(runs):
    new = _swapped()
    d = diff_analyses(runs["base"], new)
    assert [o.name for o in d.appeared] == ["copy.9"]
    assert d.appeared[0].time_ps == pytest.approx(250 * US, rel=0.02)
    assert (d.appeared[0].module, d.appeared[0].category, d.appeared[0].shape) == \
        ("jit_train_step", "loop fusion", "bf16[1024,1024]{1,0}")  # `op_defs`: loop fusion for an unknown op
    assert [o.name for o in d.disappeared] == ["all-reduce.1"]
    gone = {c.name: c.change for c in d.collectives}["all-reduce"]
    assert gone.verdict == "faster" and (gone.base.n_steps, gone.new.n_steps) == (10, 10)  # zeros in every step
    # the other way round the family appears: zeros in each of the base's ten steps
    back = {c.name: c.change for c in diff_analyses(new, runs["base"]).collectives}["all-reduce"]
    assert back.verdict == "slower" and (back.base.n_steps, back.base.centre_ps) == (10, 0.0)


def test_a_renamed_op_is_matched_by_its_hlo_fingerprint():
    # XLA renumbers fusions between compilations; the instruction itself is the same.
    def ops(matmul_name: str, operand: str):
        base = op_defs(["fusion.1", "fusion.2", "all-reduce.1"])
        renamed = OpDef(matmul_name, "convolution fusion", flops=2.0e12, bytes_accessed=1.0e9,
                        shape="bf16[1024,1024]{1,0}",
                        hlo_text=f"%{matmul_name} = bf16[1024,1024]{{1,0}} fusion(%{operand}), kind=kOutput, "
                                 f"calls=%fused_computation.{matmul_name[-1]}, metadata={{op_name=\"jit(f)/dot\"}}")
        return (renamed,) + base[1:]

    durations = {"fusion.7": 3000 * US, "fusion.2": 1000 * US, "all-reduce.1": 500 * US}
    base = analysed_design("fusion.7", lambda: design(seed=1, durations=durations, op_list=ops("fusion.7", "param.1")))
    renamed = {"fusion.9": 3000 * US, "fusion.2": 1000 * US, "all-reduce.1": 500 * US}
    new = analysed_design("fusion.9", lambda: design(seed=2, durations=renamed, op_list=ops("fusion.9", "param.4")))
    d = diff_analyses(base, new)
    matched = {o.name: o for o in d.ops}
    assert matched["fusion.9"].base_name == "fusion.7"
    assert matched["fusion.9"].matched_by == "fingerprint"
    assert not d.appeared and not d.disappeared and not d.has_changes


def test_fingerprint_ignores_names_metadata_and_backend_config():
    a = '%fusion.1 = f32[8]{0} fusion(%p.0), kind=kLoop, calls=%fc.1, metadata={op_name="a" source_line=3}'
    b = '%fusion.77 = f32[8]{0} fusion(%p.5), kind=kLoop, calls=%fc.9, metadata={op_name="b"}, backend_config={"x":1}'
    c = '%fusion.1 = f32[16]{0} fusion(%p.0), kind=kLoop, calls=%fc.1'
    assert hlo_fingerprint(a) == hlo_fingerprint(b)
    assert hlo_fingerprint(a) != hlo_fingerprint(c)
    assert hlo_fingerprint("") == ""


def test_noise_band_is_the_largest_of_floor_and_spreads():
    opts = NoiseOptions(min_relative=0.02)
    base = StepStats(10, 100.0, 90.0, 110.0, 10.0)
    new = StepStats(10, 108.0, 100.0, 116.0, 8.0)
    c = compare(base, new, opts)
    assert c.noise_band_ps == 10.0 and not c.significant  # +8 is inside the base's spread of 10
    c = compare(StepStats(10, 100.0, 99.5, 100.5, 0.5), StepStats(10, 101.5, 101, 102, 0.5), opts)
    assert c.noise_band_ps == pytest.approx(2.0) and not c.significant  # the 2 % floor
    c = compare(StepStats(10, 100.0, 99.5, 100.5, 0.5), StepStats(10, 103.0, 102.5, 103.5, 0.5), opts)
    assert c.significant and c.verdict == "slower"


def test_one_outlier_step_is_not_a_change_because_the_interval_includes_zero():
    # Nine quiet steps and one 100 µs hiccup: the mean moves by 10 µs, past the spread-based band,
    # but resampling the steps shows the change rests on that one step.
    base = [0.0] * 9 + [100.0 * US]
    new = [0.0] * 10
    c = compare_steps(base, new, "mean", NoiseOptions())
    assert abs(c.delta_ps) > c.noise_band_ps
    assert c.ci_low_ps < 0 <= c.ci_high_ps
    assert not c.significant
    assert compare_steps(base, new, "mean", NoiseOptions(resamples=0)).significant  # without the interval


def test_bootstrap_interval_is_reproducible_and_brackets_a_clear_shift():
    base, new = [100.0, 101.0, 99.0, 100.5, 99.5], [120.0, 121.0, 119.0, 120.5, 119.5]
    lo, hi = bootstrap_ci(base, new, "median", NoiseOptions())
    assert 0 < lo <= 20 <= hi
    assert bootstrap_ci(base, new, "median", NoiseOptions()) == (lo, hi)


def test_the_planted_change_has_an_interval_around_it(runs):
    op = {o.name: o for o in diff_analyses(runs["base"], runs["slow"]).ops}["fusion.1"].change
    assert op.ci_low_ps < op.delta_ps < op.ci_high_ps and op.ci_low_ps > 0


@pytest.mark.parametrize("kwargs", [{"quantiles": (0.9, 0.1)}, {"min_relative": -0.1}, {"confidence": 1.0},
                                    {"resamples": -1}])
def test_noise_options_validate_themselves(kwargs):
    with pytest.raises(ValueError, match="got"):
        NoiseOptions(**kwargs)


def _finding(rule: str, ops: tuple[str, ...], saving_ps: int) -> Finding:
    return Finding(rule=rule, code="TPD999", severity=Severity.MEDIUM, message=f"{rule} on {ops}",
                   saving=Saving(saving_ps, "measured", "test"), fix="fix it", host="host0", ops=ops)


def test_findings_are_matched_by_rule_and_ops(runs):
    base = [_finding("exposed-collective", ("all-reduce.1",), 500 * US), _finding("spill", ("fusion.2",), 10 * US)]
    new = [_finding("exposed-collective", ("all-reduce.1",), 300 * US),
           _finding("padding-waste", ("fusion.1",), 40 * US)]
    d = diff_analyses(runs["base"], runs["noise"], base, new)
    assert d.findings_rules_run
    assert [f.rule for f in d.findings_appeared] == ["padding-waste"]
    assert [f.rule for f in d.findings_resolved] == ["spill"]
    [kept] = d.findings_persisting
    assert (kept.base.saving_ps, kept.new.saving_ps) == (500 * US, 300 * US)
    assert kept.saving_changed
    assert d.has_changes


def test_a_finding_whose_saving_only_jitters_is_not_a_change(runs):
    base = [_finding("exposed-collective", ("all-reduce.1",), 500 * US)]
    new = [_finding("exposed-collective", ("all-reduce.1",), 501 * US)]  # +0.2 %: noise
    [kept] = diff_analyses(runs["base"], runs["noise"], base, new).findings_persisting
    assert not kept.saving_changed


def test_without_findings_they_are_not_compared(runs):
    d = diff_analyses(runs["base"], runs["noise"])
    assert not d.findings_rules_run and not d.findings_appeared
    # findings of one run only are not compared either: the other's rules did not run
    one = [_finding("spill", ("fusion.2",), 10 * US)]
    for base, new in ((one, None), (None, one)):
        d = diff_analyses(runs["base"], runs["noise"], base, new)
        assert not d.findings_rules_run and not d.findings_appeared and not d.findings_resolved


_steps = st.lists(st.floats(min_value=0, max_value=1e10, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(_steps, st.sampled_from(["mean", "median"]))
def test_a_distribution_never_differs_from_itself(values, centre):
    c = compare_steps(values, values, centre, NoiseOptions(resamples=200))
    assert c.delta_ps == 0 and not c.significant


@settings(max_examples=100, deadline=None)
@given(_steps, _steps, st.sampled_from(["mean", "median"]))
def test_swapping_the_runs_flips_the_sign(a, b, centre):
    ab = compare_steps(a, b, centre, NoiseOptions(resamples=200))
    ba = compare_steps(b, a, centre, NoiseOptions(resamples=200))
    assert ab.delta_ps == pytest.approx(-ba.delta_ps, abs=1e-3)
    if ab.significant and ba.significant:
        assert ab.verdict != ba.verdict


def _compiled(analysis, padded_extra: dict[str, int], spills: dict[str, int]):
    """Compiled facts per op row (as `JoinResult.columns`): 1 MiB logical, plus the given padding and spills."""
    import pandas as pd

    names = analysis.ops["name"].astype(str)
    return pd.DataFrame({
        "logical_bytes": pd.array([1 << 20] * len(names), dtype="Int64"),
        "padded_bytes": pd.array([(1 << 20) + padded_extra.get(n, 0) for n in names], dtype="Int64"),
        "spill_stores": pd.array([spills.get(n, 0) for n in names], dtype="Int64"),
        "spill_fills": pd.array([None] * len(names), dtype="Int64"),
    }, index=analysis.ops.index)


def test_padding_and_spill_changes_come_from_the_compiled_facts(runs):
    base = _compiled(runs["base"], {"fusion.1": 0}, {})
    new = _compiled(runs["noise"], {"fusion.1": 3 << 20}, {"fusion.2": 12})  # same times, new layout and spills
    d = diff_analyses(runs["base"], runs["noise"], base_compiled=base, new_compiled=new)
    changed = {o.name: o for o in d.compiled_changes}
    assert set(changed) == {"fusion.1", "fusion.2"}
    assert (changed["fusion.1"].base_compiled.padding_bytes, changed["fusion.1"].new_compiled.padding_bytes) == \
        (0, 3 << 20)
    assert (changed["fusion.2"].base_compiled.spills, changed["fusion.2"].new_compiled.spills) == (0, 12)
    assert d.has_changes and not d.significant_ops


def test_without_compiled_facts_on_one_side_nothing_is_claimed(runs):
    d = diff_analyses(runs["base"], runs["noise"], new_compiled=_compiled(runs["noise"], {"fusion.1": 1}, {}))
    assert not d.compiled_changes
    assert all(o.base_compiled is None and o.new_compiled is not None for o in d.ops)


def test_padding_and_spill_changes_are_rendered_in_markdown_and_json(runs):
    import json

    from tpudiag.render.diff_json import render_diff_json
    from tpudiag.render.diff_markdown import render_diff_markdown

    d = diff_analyses(runs["base"], runs["noise"], base_compiled=_compiled(runs["base"], {}, {}),
                      new_compiled=_compiled(runs["noise"], {"fusion.1": 3 << 20}, {}))
    md = render_diff_markdown(d)
    assert "## Padding and spills (compiled programs)" in md
    assert "| `fusion.1` | convolution fusion | 0 B → 3 MiB | 0 → 0 |" in md
    doc = json.loads(render_diff_json(d))
    [op] = [o for o in doc["ops"] if o["compiled_changed"]]
    assert op["new_compiled"]["padding_bytes"] == 3 << 20


# ---------------------------------------------------------------------------------------------
# Attribution, matching by what ops compute, findings paired through their ops, captures without steps


def test_the_parts_of_a_change_add_up_to_it_and_the_planted_op_leads(runs):
    d = diff_analyses(runs["base"], runs["slow"])
    a = d.attribution
    assert a.total_ps == d.step_time.delta_ps
    assert sum(p.delta_ps for p in a.parts) == pytest.approx(a.total_ps, abs=1)
    lead = a.parts[0]
    assert (lead.kind, lead.name) == (PartKind.OP, "fusion.1")
    assert lead.change.significant and lead.change.noise_band_ps > 0  # each part carries its band
    # The step is the slowest chip's and the parts are means over chips: the rest stays small.
    assert a.named_share > 0.9
    families = {p.name: p for p in a.parts if p.kind is PartKind.FAMILY}
    assert set(families) == {"all-reduce"} and not families["all-reduce"].change.significant
    # the synchronous all-reduce has no compute beside it: its family's windows are exposed in both runs
    assert families["all-reduce"].exposure.text() == "exposed" and families["all-reduce"].exposure.new.span_ps > 0
    [idle] = [p for p in a.parts if p.kind is PartKind.IDLE]
    assert idle.change == {c.name: c.change for c in d.breakdown}["idle"]


def test_ops_that_went_away_and_appeared_are_parts_of_the_change(runs):
    d = diff_analyses(runs["base"], _swapped())  # all-reduce.1 gone, copy.9 new
    parts = {(p.kind, p.name): p for p in d.attribution.parts}
    assert parts[(PartKind.APPEARED, "copy.9")].delta_ps == pytest.approx(250 * US, rel=0.02)
    # A collective counts in its family: the all-reduce that went away is the family's -500 µs.
    assert parts[(PartKind.FAMILY, "all-reduce")].delta_ps == pytest.approx(-500 * US, rel=0.02)
    assert (PartKind.GONE, "all-reduce.1") not in parts


def _renamed_design(seed: int, names: dict[str, str], source: str = "model.py:43"):
    """fusion.1's work under another name and HLO text (`seed` operands: a changed fusion), at `source`."""
    defs = []
    for name in ("fusion.1", "fusion.2", "all-reduce.1"):
        category, _ = OPS[name]
        new = names.get(name, name)
        defs.append(OpDef(new, category, flops=2.0e12, bytes_accessed=1.0e9, shape="bf16[256,512]{1,0}",
                          source=source if name == "fusion.1" else f"model.py:{len(defs)}",
                          tf_op="jit(f)/dot_general" if name == "fusion.1" else f"jit(f)/op{len(defs)}",
                          hlo_text=f"%{new} = bf16[256,512]{{1,0}} fusion({', '.join(['%p'] * seed)}), kind=kOutput, "
                                   f"calls=%c.{seed}"
                          if name == "fusion.1" else ""))
    durations = {names.get(k, k): v for k, (_, v) in OPS.items()}
    return design(seed=seed, durations=durations, op_list=tuple(defs))


def _before_rename():
    return analysed_design("before rename", lambda: _renamed_design(1, {}))


def _renamed():
    # other name, other HLO text (the fingerprint differs: it has two operands, not one)
    return analysed_design("renamed", lambda: _renamed_design(2, {"fusion.1": "subtract_convert_fusion.2"}))


def test_a_recompiled_fusion_pairs_by_source_line_jax_op_and_shape():
    base, new = _before_rename(), _renamed()
    d = diff_analyses(base, new)
    pair = {o.name: o for o in d.ops}["subtract_convert_fusion.2"]
    assert (pair.base_name, pair.matched_by) == ("fusion.1", "source line")
    assert not d.appeared and not d.disappeared


def test_a_recompiled_fusion_at_another_line_does_not_pair():
    base = _before_rename()
    new = analysed_design("moved", lambda: _renamed_design(2, {"fusion.1": "fusion.77"}, source="model.py:44"))
    d = diff_analyses(base, new)
    assert [o.name for o in d.appeared] == ["fusion.77"] and [o.name for o in d.disappeared] == ["fusion.1"]


def test_a_finding_on_a_renamed_op_is_the_same_finding():
    base, new = _before_rename(), _renamed()
    d = diff_analyses(base, new, [_finding("spill", ("fusion.1",), 0), _finding("spill", ("fusion.2",), 0)],
                      [_finding("spill", ("subtract_convert_fusion.2",), 0), _finding("spill", ("all-reduce.1",), 0),
                       _finding("spill", ("fusion.2",), 0)])
    [renamed, same] = sorted(d.findings_persisting, key=lambda p: p.how)
    assert (renamed.base.ops, renamed.new.ops, renamed.how) == (("fusion.1",), ("subtract_convert_fusion.2",),
                                                                "renamed ops")
    assert not renamed.changed
    assert same.how == "same ops" and same.base.ops == ("fusion.2",)
    # A finding on another op is not paired with it, renamed or not.
    assert [f.ops for f in d.findings_appeared] == [("all-reduce.1",)]
    assert not d.findings_resolved


def test_findings_citing_most_of_the_same_ops_pair(runs):
    base = [_finding("exposed-collective", ("a.1", "a.2", "a.3"), 500 * US)]
    new = [_finding("exposed-collective", ("a.1", "a.2", "a.3", "a.4"), 500 * US),
           _finding("exposed-collective", ("b.1", "b.2"), 10 * US)]
    d = diff_analyses(runs["base"], runs["noise"], base, new)
    [kept] = d.findings_persisting
    assert kept.how == "overlapping ops" and kept.new.ops[-1] == "a.4"
    assert [f.ops for f in d.findings_appeared] == [("b.1", "b.2")]


def _stepless(seed: int, scale: dict[str, float] | None = None):
    d = design(seed=seed, scale=scale, n_steps=3)
    return replace(d, steps_line=False, modules_line=False)


def test_captures_without_steps_compare_op_totals_per_core():
    base = analysed_design("stepless", lambda: _stepless(1))
    new = analysed_design("stepless, slower", lambda: _stepless(2, {"fusion.1": 1.5}))
    assert base.steps.empty and new.steps.empty  # no Steps line and no module executions
    d = diff_analyses(base, new)
    assert not d.per_step and d.step_time is None and d.attribution is None
    assert d.op_basis == "per core over the capture"
    ops = {o.name: o.change for o in d.ops}
    # three steps of 3 ms on each chip: 9 ms per core in the base capture, half as much again in the new
    assert ops["fusion.1"].base.centre_ps == pytest.approx(9000 * US, rel=0.02)
    assert ops["fusion.1"].delta_ps == pytest.approx(4500 * US, rel=0.03) and ops["fusion.1"].significant
    assert not ops["fusion.2"].significant
    assert d.base_capture_ps > 3 * (4500 * US)
    assert any("no steps" in w for w in d.warnings)


def test_the_diff_names_its_inputs_and_each_captures_length(runs):
    opts = NoiseOptions(seed=3)
    d = diff_analyses(runs["base"], runs["slow"], options=opts)
    assert d.base_input == str(_root() / "base" / "plugins" / "profile" / "run")
    assert d.new_input == str(_root() / "slow" / "plugins" / "profile" / "run")
    assert (d.base_run, d.new_run, d.options) == ("run", "run", opts)
    # Per core, ten steps of 4.5 ms of ops and a 200 µs gap: 47 ms; the slow run's matmul adds 10 x 0.6 ms.
    assert d.base_capture_ps == pytest.approx(47_000 * US, rel=0.01)
    assert d.new_capture_ps == pytest.approx(53_000 * US, rel=0.01)
    assert [c.name for c in d.breakdown] == ["compute", "collectives", "infeed/outfeed", "idle"]
    assert d.ops[0].name == "fusion.1" and d.per_step and not d.warnings
    assert {(o.module, o.shape) for o in d.ops} == {("jit_train_step", "bf16[1024,1024]{1,0}")}  # `op_defs`


def test_an_absolute_floor_of_half_the_step_hides_every_part_but_the_step_time(runs):
    d = diff_analyses(runs["base"], runs["slow"], options=NoiseOptions(min_step_share=0.5))
    floor = 0.5 * d.step_time.base.centre_ps  # half the base's median step (4.7 ms): above the 0.6 ms change
    assert d.step_time.significant  # the step time has no absolute floor
    assert all(o.change.noise_band_ps == pytest.approx(floor) and not o.change.significant for o in d.ops)
    assert all(c.change.noise_band_ps >= floor and not c.change.significant for c in d.breakdown + d.collectives)
    assert not d.significant_ops


def test_the_step_time_is_compared_by_its_median_over_the_designs_steps(runs):
    # Every chip's step lasts the slowest chip's ops plus the gap (`diff_designs`): its median over the
    # ten steps of each design, not the mean.
    base, slow = design(seed=1), design(seed=3, scale={"fusion.1": 1.2})
    lengths = [[d.step_length(0, s) for s in range(d.first_step, d.first_step + d.n_steps)] for d in (base, slow)]
    d = diff_analyses(runs["base"], runs["slow"])
    assert d.step_time.base.centre_ps == np.median(lengths[0]) != np.mean(lengths[0])
    assert d.step_time.new.centre_ps == np.median(lengths[1])
    assert d.step_time.delta_ps == np.median(lengths[1]) - np.median(lengths[0])


def test_a_run_without_steps_against_one_with_steps_compares_totals(runs):
    stepless = analysed_design("stepless", lambda: _stepless(1))
    for base, new in ((runs["base"], stepless), (stepless, runs["base"])):
        d = diff_analyses(base, new, options=NoiseOptions(min_step_share=0.5))
        assert not d.per_step and d.step_time is None and d.attribution is None and not d.breakdown
        assert d.warnings[0].startswith("a run has no steps")
        # The absolute floor is a share of the base's whole capture per core, not of a step. (A capture
        # without a modules line names no module, so its ops pair with none; the all-reduce family compares.)
        [family] = d.collectives
        assert family.name == "all-reduce" and family.change.noise_band_ps >= 0.5 * d.base_capture_ps


def test_one_step_in_each_run_is_still_compared_per_step():
    one = analysed_design("one step", lambda: design(seed=1, n_steps=1))
    other = analysed_design("one step, other jitter", lambda: design(seed=2, n_steps=1))
    d = diff_analyses(one, other)
    assert d.per_step and d.step_time is not None and d.step_time.base.n_steps == 1
    assert d.warnings == ("base run has 1 step: too few to measure noise; only the relative floor applies",
                          "new run has 1 step: too few to measure noise; only the relative floor applies")


def test_collectives_carry_their_windows_and_ops_inside_the_band_no_interval(runs):
    d = diff_analyses(runs["base"], runs["noise"])
    ops = {o.name: o for o in d.ops}
    # the synchronous all-reduce runs with no compute beside it: exposed in both runs
    assert ops["all-reduce.1"].exposure.text() == "exposed" and ops["all-reduce.1"].exposure.base.span_ps > 0
    assert ops["fusion.1"].exposure is None and ops["fusion.2"].exposure is None
    # jitter only: every op is inside its band, so no interval was computed for it
    assert all(o.change.ci_low_ps is None and o.change.ci_high_ps is None for o in d.ops)


_FUSED = """HloModule jit_train_step

%fused.{n} (p0: f32[8,16], p1: f32[8,16]) -> f32[8,16] {{
  %p0 = f32[8,16]{{1,0}} parameter(0)
  %p1 = f32[8,16]{{1,0}} parameter(1)
  %mul.{n} = f32[8,16]{{1,0}} multiply(%p0, %p1)
  ROOT %neg.{n} = f32[8,16]{{1,0}} negate(%mul.{n})
}}

ENTRY %main (a: f32[8,16], b: f32[8,16]) -> f32[8,16] {{
  %a = f32[8,16]{{1,0}} parameter(0)
  %b = f32[8,16]{{1,0}} parameter(1)
  ROOT %{name} = f32[8,16]{{1,0}} fusion(%a, %b), kind=kLoop, calls=%fused.{n}
}}
"""


def _recompiled(seed: int, name: str):
    """fusion.1's work as `name`, with no source line or JAX op, and a trace text of `seed` operands (so
    neither the name, the fingerprint nor the source line pairs it): only the compiled program can."""
    defs = (OpDef(name, "loop fusion", flops=1.0e9, bytes_accessed=1.0e9, shape="f32[8,16]{1,0}",
                  hlo_text=f"%{name} = f32[8,16]{{1,0}} fusion({', '.join(['%p'] * seed)}), kind=kLoop, calls=%c"),
            ) + op_defs(["fusion.2", "all-reduce.1"])
    durations = {name: 3000 * US, "fusion.2": 1000 * US, "all-reduce.1": 500 * US}
    return design(seed=seed, durations=durations, op_list=defs)


def test_a_recompiled_fusion_pairs_by_the_structure_of_its_compiled_program():
    from tpudiag.parsers.hlo_text import parse_hlo_text

    base = analysed_design("structure a", lambda: _recompiled(1, "fusion.1"))
    new = analysed_design("structure b", lambda: _recompiled(2, "fusion.77"))
    # the design's module and program id (1000 + seed) key each run's program, as `JoinResult.programs` does
    programs = ({(1001, "jit_train_step"): parse_hlo_text(_FUSED.format(n=1, name="fusion.1"))},
                {(1002, "jit_train_step"): parse_hlo_text(_FUSED.format(n=9, name="fusion.77"))})
    d = diff_analyses(base, new, base_programs=programs[0], new_programs=programs[1])
    pair = {o.name: o for o in d.ops}["fusion.77"]
    assert (pair.base_name, pair.matched_by) == ("fusion.1", "structure")
    assert not d.appeared and not d.disappeared
    # a program on one side only, or none: nothing pairs them
    for b, n in ((programs[0], None), (None, programs[1]), (None, None)):
        d = diff_analyses(base, new, base_programs=b, new_programs=n)
        assert [o.name for o in d.appeared] == ["fusion.77"] and [o.name for o in d.disappeared] == ["fusion.1"]


def _twins(seed: int, first: str, second: str):
    """Two ops alike in everything but their names (same category, shape, source line and JAX op; no
    HLO text of their own), `first` running first in every step."""
    defs = tuple(OpDef(n, "loop fusion", flops=1.0e9, bytes_accessed=1.0e9, shape="f32[8]{0}", source="model.py:7",
                       tf_op="jit(f)/mul") for n in (first, second)) + op_defs(["all-reduce.1"])
    durations = {first: 1000 * US, second: 1000 * US, "all-reduce.1": 500 * US}
    return design(seed=seed, durations=durations, op_list=defs)


def test_alike_ops_renamed_pair_in_the_order_they_first_run():
    # The base runs fusion.5 before fusion.3; one new run fusion.8 before fusion.9, the other the reverse.
    base = analysed_design("twins 5, 3", lambda: _twins(1, "fusion.5", "fusion.3"))
    in_order = analysed_design("twins 8, 9", lambda: _twins(2, "fusion.8", "fusion.9"))
    reversed_ = analysed_design("twins 9, 8", lambda: _twins(3, "fusion.9", "fusion.8"))
    for new, expected in ((in_order, {"fusion.8": "fusion.5", "fusion.9": "fusion.3"}),
                          (reversed_, {"fusion.9": "fusion.5", "fusion.8": "fusion.3"})):
        pairs = {o.name: (o.base_name, o.matched_by) for o in diff_analyses(base, new).ops if o.name != "all-reduce.1"}
        assert pairs == {n: (b, "source line, order") for n, b in expected.items()}


def test_ops_only_in_one_run_come_longest_first(runs):
    # Against two alike 1 ms ops, the base's 3 ms matmul and 1 ms elementwise op went away, in that order.
    twins = analysed_design("twins 8, 9", lambda: _twins(2, "fusion.8", "fusion.9"))
    d = diff_analyses(runs["base"], twins)
    assert [o.name for o in d.disappeared] == ["fusion.1", "fusion.2"]
    assert {o.name for o in d.appeared} == {"fusion.8", "fusion.9"}
