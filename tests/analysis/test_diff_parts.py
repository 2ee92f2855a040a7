"""`analysis.diff`'s parts on hand-made inputs: per-step statistics, the bootstrap interval, the
noise options' edges, window labels, op matching, findings pairing and the attribution.

Each expectation is worked by hand from the module docstring's definitions (the noise band, the
matching order, the Jaccard index over 1/2, the parts that add up to the step change), so these run
without a capture and a mutation tester can afford them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from tpudiag.analysis.diff import (Attribution, Change, CompiledFacts, Diff, Exposure, FindingChange, FindingRef,
                                   NamedChange, NoiseOptions, OpChange, OpPresence, Part, PartKind, StepStats,
                                   WindowTime, _array_text, _attribution, _capture_ps, _compare_findings, _facts,
                                   _first_array, _first_runs, _match, _op_table, _per_step_mean_over_cores,
                                   _per_step_op_times, _steps, _warnings, _window_of, _windows, bootstrap_ci, compare,
                                   compare_steps, hlo_fingerprint, step_stats, structure_key)
from tpudiag.model.findings import Finding, Saving, Severity
from tpudiag.model.profile import Platform, WindowThresholds
from tpudiag.parsers.hlo_text import parse_hlo_text
from tpudiag.parsers.layout import parse_shape

OPTS = NoiseOptions()


# ---------------------------------------------------------------------------------------------
# Per-step statistics and the noise band


def test_step_stats_of_five_steps_by_hand():
    # numpy's linear quantiles of 1..5: p10 at position 0.4 (1.4), p90 at 3.6 (4.6); spread half of 3.2.
    s = step_stats(np.array([1, 2, 3, 4, 5]), "median", OPTS)
    assert s == StepStats(5, 3.0, pytest.approx(1.4), pytest.approx(4.6), pytest.approx(1.6))
    # an outlier moves the mean (4) and not the median (3); p90 at 4 + 0.6 x 6 = 7.6
    skewed = [1, 2, 3, 4, 10]
    assert step_stats(skewed, "median", OPTS).centre_ps == 3.0
    m = step_stats(skewed, "mean", OPTS)
    assert (m.centre_ps, m.p90_ps, m.spread_ps) == (4.0, pytest.approx(7.6), pytest.approx(3.1))
    assert isinstance(m.n_steps, int) and isinstance(m.centre_ps, float)


def test_step_stats_of_no_steps_are_zeros():
    assert step_stats(np.zeros(0), "mean", OPTS) == StepStats(0, 0.0, 0.0, 0.0, 0.0)


def test_step_stats_take_the_quantiles_from_the_options():
    s = step_stats(np.arange(11.0), "mean", NoiseOptions(quantiles=(0.0, 1.0)))  # the whole range 0..10
    assert (s.p10_ps, s.p90_ps, s.spread_ps) == (0.0, 10.0, 5.0)


def _stats(centre: float, spread: float) -> StepStats:
    return StepStats(10, centre, centre - spread, centre + spread, spread)


def test_a_change_exactly_at_the_band_is_within_noise():
    # The band is the base's spread of 5; a change of exactly 5 either way is not beyond it.
    assert not compare(_stats(100.0, 5.0), _stats(105.0, 0.0), OPTS).significant
    assert not compare(_stats(100.0, 5.0), _stats(95.0, 0.0), OPTS).significant
    beyond = compare(_stats(100.0, 5.0), _stats(105.5, 0.0), OPTS)
    assert beyond.significant and beyond.delta_ps == 5.5 and beyond.relative == pytest.approx(0.055)


def test_a_faster_change_beyond_the_band_is_reported_faster():
    c = compare(_stats(100.0, 0.0), _stats(90.0, 0.0), OPTS)  # -10 against the 2 % floor
    assert c.significant and c.verdict == "faster" and c.relative == pytest.approx(-0.1)
    assert c.noise_band_ps == pytest.approx(2.0)


def test_the_relative_floor_is_taken_of_the_base_centres_size():
    # A negative centre (a part of the attribution can be one) still gets a positive floor.
    c = compare(_stats(-100.0, 0.0), _stats(-101.5, 0.0), OPTS)
    assert c.noise_band_ps == pytest.approx(2.0) and not c.significant


def test_without_an_absolute_floor_any_change_of_quiet_runs_counts():
    # no floor given: a base of 0 and no spread leave a band of 0, so half a picosecond is a change
    assert compare(_stats(0.0, 0.0), _stats(0.5, 0.0), OPTS).significant
    assert compare_steps([0.0] * 3, [0.5] * 3, "mean", OPTS).significant


def test_a_base_of_zero_has_no_relative_change():
    c = compare(_stats(0.0, 0.0), _stats(5.0, 0.0), OPTS)
    assert c.relative is None and c.significant and c.delta_ps == 5.0


def test_an_interval_touching_zero_is_not_significant():
    # The interval must exclude 0: an end exactly at 0 does not.
    assert not compare(_stats(100.0, 0.0), _stats(110.0, 0.0), OPTS, ci=(0.0, 20.0)).significant
    assert not compare(_stats(100.0, 0.0), _stats(90.0, 0.0), OPTS, ci=(-20.0, 0.0)).significant
    kept = compare(_stats(100.0, 0.0), _stats(110.0, 0.0), OPTS, ci=(1.0, 20.0))
    assert kept.significant and (kept.ci_low_ps, kept.ci_high_ps) == (1.0, 20.0)
    assert (compare(_stats(100.0, 0.0), _stats(110.0, 0.0), OPTS).ci_low_ps,
            compare(_stats(100.0, 0.0), _stats(110.0, 0.0), OPTS).ci_high_ps) == (None, None)


def test_verdicts():
    base = _stats(100.0, 0.0)
    assert Change(base, base, 5.0, 0.05, 1.0, True).verdict == "slower"
    assert Change(base, base, -5.0, -0.05, 1.0, True).verdict == "faster"
    assert Change(base, base, 5.0, 0.05, 10.0, False).verdict == "within noise"


# ---------------------------------------------------------------------------------------------
# The bootstrap interval


def test_the_interval_is_of_the_chosen_centre_at_the_chosen_confidence():
    # Base one step of 0; new three steps 0, 0, 90. A resample of the new run holds k copies of 90,
    # k binomial(3, 1/3): k=0 with p 8/27 (0.30), k=1 with 12/27 (0.44), so P(k <= 1) = 20/27 (0.74).
    # Its median is 0 while k <= 1, its mean 30 k. At confidence 0.1 the interval is the 45th to 55th
    # percentile: both inside k = 0..1 for the median (0, 0) and inside k = 1 for the mean (30, 30).
    opts = NoiseOptions(confidence=0.1)
    assert bootstrap_ci([0.0], [0.0, 0.0, 90.0], "median", opts) == (0.0, 0.0)
    assert bootstrap_ci([0.0], [0.0, 0.0, 90.0], "mean", opts) == pytest.approx((30.0, 30.0))
    # At 0.95 (2.5th to 97.5th) the interval spans k = 0 to 3: 0 to 90 for both.
    assert bootstrap_ci([0.0], [0.0, 0.0, 90.0], "mean", OPTS) == (0.0, 90.0)
    # The base is resampled too, and subtracted: the same values the other way round.
    assert bootstrap_ci([0.0, 0.0, 90.0], [0.0], "mean", OPTS) == (-90.0, 0.0)


def test_compare_steps_takes_the_interval_of_its_centre():
    # as above: the 45th to 55th percentile of the medians is (0, 0), of the means (30, 30)
    opts = NoiseOptions(confidence=0.1)
    assert (compare_steps([0.0], [0.0, 0.0, 90.0], "median", opts).ci_low_ps,
            compare_steps([0.0], [0.0, 0.0, 90.0], "mean", opts).ci_low_ps) == (0.0, pytest.approx(30.0))


def test_the_interval_of_two_constant_runs_is_their_difference():
    assert bootstrap_ci([100.0] * 4, [130.0] * 6, "median", NoiseOptions(resamples=50)) == (30.0, 30.0)


def test_no_interval_without_steps_or_without_resamples():
    assert bootstrap_ci([], [1.0], "mean", OPTS) is None
    assert bootstrap_ci([1.0], [], "mean", OPTS) is None
    assert bootstrap_ci([1.0], [2.0], "mean", NoiseOptions(resamples=0)) is None
    assert bootstrap_ci([1.0], [2.0], "mean", NoiseOptions(resamples=1)) == (1.0, 1.0)


def test_the_seed_decides_the_resamples():
    # 20 resamples of irregular values: two seeds give two intervals, one seed the same one each time
    base, new = [0.0, 1.0, 3.0, 7.0], [13.0, 29.0, 61.0, 127.0]
    a = bootstrap_ci(base, new, "mean", NoiseOptions(seed=1, resamples=20))
    assert a == bootstrap_ci(base, new, "mean", NoiseOptions(seed=1, resamples=20))
    assert a != bootstrap_ci(base, new, "mean", NoiseOptions(seed=2, resamples=20))


def test_a_lazy_comparison_skips_the_interval_only_inside_the_band():
    quiet, nudged = [100.0] * 5, [100.5] * 5  # +0.5 %, inside the 2 % floor
    assert compare_steps(quiet, nudged, "mean", OPTS, lazy_ci=True).ci_low_ps is None
    eager = compare_steps(quiet, nudged, "mean", OPTS)
    assert (eager.ci_low_ps, eager.ci_high_ps) == (0.5, 0.5) and not eager.significant
    moved = compare_steps(quiet, [110.0] * 5, "mean", OPTS, lazy_ci=True)
    assert (moved.ci_low_ps, moved.ci_high_ps) == (10.0, 10.0) and moved.significant


def test_compare_steps_passes_the_absolute_floor_and_the_centre():
    c = compare_steps([100.0] * 5, [110.0] * 5, "mean", OPTS, min_abs_ps=20.0)
    assert c.noise_band_ps == 20.0 and not c.significant
    c = compare_steps([100.0] * 5, [110.0] * 5, "mean", OPTS, min_abs_ps=20.0, lazy_ci=True)
    assert c.noise_band_ps == 20.0 and c.ci_low_ps is None
    # median of 1, 2, 30 is 2; mean 11
    assert compare_steps([0.0], [1.0, 2.0, 30.0], "median", OPTS).new.centre_ps == 2.0
    assert compare_steps([0.0], [1.0, 2.0, 30.0], "mean", OPTS).new.centre_ps == 11.0


# ---------------------------------------------------------------------------------------------
# The options


@pytest.mark.parametrize("kwargs", [{"quantiles": (0.0, 1.0)}, {"quantiles": (0.0, 0.01)}, {"resamples": 0},
                                    {"min_relative": 0.0, "min_step_share": 0.0}, {"confidence": 0.01},
                                    {"confidence": 0.99}])
def test_noise_options_accept_their_edges(kwargs):
    NoiseOptions(**kwargs)


def test_noise_options_refuse_with_the_value_given():
    with pytest.raises(ValueError) as e:
        NoiseOptions(quantiles=(0.5, 0.5))
    assert str(e.value) == "quantiles must satisfy 0 <= lo < hi <= 1, got (0.5, 0.5)"
    for q in ((-0.1, 0.9), (0.1, 1.1)):
        with pytest.raises(ValueError, match="quantiles must satisfy"):
            NoiseOptions(quantiles=q)
    for c in (0.0, 1.0):
        with pytest.raises(ValueError) as e:
            NoiseOptions(confidence=c)
        assert str(e.value) == f"confidence must be in (0, 1) and resamples >= 0, got confidence={c}, resamples=2000"
    with pytest.raises(ValueError) as e:
        NoiseOptions(resamples=-1)
    assert str(e.value) == "confidence must be in (0, 1) and resamples >= 0, got confidence=0.95, resamples=-1"
    with pytest.raises(ValueError) as e:
        NoiseOptions(min_step_share=-0.001)
    assert str(e.value) == "thresholds must be >= 0, got min_relative=0.02, min_step_share=-0.001"
    with pytest.raises(ValueError, match="min_relative=-0.1, min_step_share=0.001"):
        NoiseOptions(min_relative=-0.1)


def test_noise_option_defaults_as_documented():
    o = NoiseOptions()
    assert (o.min_relative, o.quantiles, o.min_step_share, o.confidence, o.resamples, o.seed) == \
        (0.02, (0.10, 0.90), 0.001, 0.95, 2000, 0)


# ---------------------------------------------------------------------------------------------
# Small values: compiled facts, windows, parts


def test_padding_bytes_need_both_sizes():
    assert CompiledFacts(100, 160).padding_bytes == 60
    assert CompiledFacts(None, 160).padding_bytes is None
    assert CompiledFacts(100, None).padding_bytes is None
    assert CompiledFacts().spills is None


def test_window_labels_at_their_edges():
    # covered = 1 - exposed / span: hidden at 0.9 or more, exposed at 0.1 or less
    assert WindowTime(1000, 100).label == "hidden"  # exactly 0.9 covered
    assert WindowTime(1000, 101).label == "partly hidden"
    assert WindowTime(1000, 899).label == "partly hidden"
    assert WindowTime(1000, 900).label == "exposed"
    assert WindowTime(1000, 1000).label == "exposed"
    assert WindowTime(0, 0).label == "" and WindowTime(-1, 0).label == ""
    assert WindowTime(1, 0).label == "hidden"
    assert WindowTime(10, 3) + WindowTime(5, 2) == WindowTime(15, 5)


def test_exposure_moves_only_between_labels_where_it_ran_in_both():
    exposed, hidden, absent = WindowTime(100, 100), WindowTime(100, 0), WindowTime(0, 0)
    assert Exposure(exposed, hidden).moved and Exposure(exposed, hidden).text() == "exposed → hidden"
    assert not Exposure(exposed, exposed).moved and Exposure(exposed, exposed).text() == "exposed"
    assert not Exposure(absent, exposed).moved and Exposure(absent, exposed).text() == "(absent) → exposed"
    assert not Exposure(hidden, absent).moved and Exposure(hidden, absent).text() == "hidden → (absent)"
    assert Exposure(WindowTime(100, 50), hidden).moved


def _op(name: str = "fusion.1", base: CompiledFacts | None = None, new: CompiledFacts | None = None,
        delta: float = 0.0, significant: bool = False, base_name: str | None = None, category: str = "loop fusion",
        matched_by: str = "name") -> OpChange:
    s = _stats(100.0, 0.0)
    return OpChange("m", name, base_name or name, category, "f32[8]", matched_by,
                    Change(s, s, delta, None, 1.0, significant), base, new)


def test_compiled_changes_need_both_runs_to_know_the_fact():
    assert _op(base=CompiledFacts(100, 100, 0), new=CompiledFacts(100, 160, 0)).compiled_changed  # padding
    assert _op(base=CompiledFacts(100, 100, 0), new=CompiledFacts(100, 100, 3)).compiled_changed  # spills
    assert not _op(base=CompiledFacts(100, 100, 2), new=CompiledFacts(200, 200, 2)).compiled_changed  # same padding
    assert not _op(base=CompiledFacts(100, 100, None), new=CompiledFacts(100, 100, 3)).compiled_changed
    assert not _op(base=CompiledFacts(100, 100, 3), new=CompiledFacts(100, 100, None)).compiled_changed
    assert not _op(base=CompiledFacts(None, None, 0), new=CompiledFacts(100, 160, 0)).compiled_changed
    assert not _op(base=CompiledFacts(100, 160, 0), new=CompiledFacts(None, None, 0)).compiled_changed
    assert not _op(base=None, new=CompiledFacts(100, 160, 3)).compiled_changed
    assert not _op(base=CompiledFacts(100, 160, 3), new=None).compiled_changed


def test_finding_change_flags():
    ref = FindingRef("spill", "TPD1", "low", "h", ("a",), "m", 0)
    assert FindingChange(ref, ref, True).changed and not FindingChange(ref, ref).changed
    assert FindingChange(ref, ref, how="renamed ops").renamed and FindingChange(ref, ref, how="overlapping ops").renamed
    assert not FindingChange(ref, ref).renamed and not FindingChange(ref, ref, how="same message").renamed


def test_named_part_kinds():
    assert {k for k in PartKind if k.named} == {PartKind.OP, PartKind.APPEARED, PartKind.GONE, PartKind.FAMILY}


def _part(kind: PartKind, delta: float, name: str = "x") -> Part:
    return Part(kind, name, name, "", delta, None)


def test_attribution_sums_and_named_share():
    a = Attribution(100.0, (_part(PartKind.OP, 60.0), _part(PartKind.FAMILY, 20.0), _part(PartKind.IDLE, 5.0),
                            _part(PartKind.UNATTRIBUTED, 15.0)))
    assert a.moved and a.named_ps == 80.0 and a.unattributed_ps == 15.0
    assert a.named_share == pytest.approx(0.8)  # 1 - |100 - 80| / 100
    # a negative change: 1 - |-100 - (-70)| / 100
    assert Attribution(-100.0, (_part(PartKind.GONE, -70.0),)).named_share == pytest.approx(0.7)
    assert Attribution(0.0, (_part(PartKind.OP, 0.0),)).named_share is None
    assert not Attribution(0.0, (_part(PartKind.OP, 0.0), _part(PartKind.UNATTRIBUTED, 0.0))).moved
    assert Attribution(0.0, (_part(PartKind.OP, 0.0), _part(PartKind.UNATTRIBUTED, -1.0))).moved


def _diff(**kw) -> Diff:
    fields = dict(base_input="a", new_input="b", base_run="r", new_run="r", options=OPTS, step_time=None,
                  breakdown=(), collectives=(), ops=(), appeared=(), disappeared=(), findings_rules_run=False)
    return Diff(**{**fields, **kw})


def test_what_counts_as_a_change_of_the_diff():
    s = _stats(100.0, 0.0)
    quiet = Change(s, s, 0.0, 0.0, 1.0, False)
    loud = Change(s, s, 10.0, 0.1, 1.0, True)
    presence = OpPresence("m", "copy.9", "copy", "f32[8]", 5.0)
    ref = FindingRef("spill", "TPD1", "low", "h", ("a",), "m", 0)
    assert not _diff().has_changes
    assert not _diff(step_time=quiet, breakdown=(NamedChange("compute", quiet),), ops=(_op(),)).has_changes
    assert _diff(step_time=loud).has_changes
    assert _diff(breakdown=(NamedChange("compute", loud),)).has_changes
    assert _diff(collectives=(NamedChange("all-reduce", loud),)).has_changes
    assert _diff(ops=(_op(significant=True),)).has_changes
    assert _diff(ops=(_op(base=CompiledFacts(1, 1), new=CompiledFacts(1, 2)),)).has_changes
    assert _diff(appeared=(presence,)).has_changes and _diff(disappeared=(presence,)).has_changes
    assert _diff(findings_appeared=(ref,)).has_changes and _diff(findings_resolved=(ref,)).has_changes
    both = (_op("a", significant=True), _op("b"), _op("c", base=CompiledFacts(1, 1), new=CompiledFacts(1, 2)))
    d = _diff(ops=both)
    assert [o.name for o in d.significant_ops] == ["a"] and [o.name for o in d.compiled_changes] == ["c"]
    assert _diff().op_basis == "per step and core"
    assert _diff(per_step=False).op_basis == "per core over the capture"


# ---------------------------------------------------------------------------------------------
# Op identity


def test_fingerprint_drops_every_kind_of_annotation():
    plain = "%fusion.1 = f32[8]{0} fusion(%p.0), kind=kLoop, calls=%fc.1"
    canonical = "%_ = f32[8]{0} fusion(%_), kind=kLoop, calls=%_"
    assert hlo_fingerprint(plain) == hashlib.sha1(canonical.encode()).hexdigest()[:16]
    for extra in (', frontend_attributes={_xla_stream_annotation="1"}', ", statistics={visualizing_index=1}",
                  ', backend_config="opaque"', ', backend_config={"a":{"b":1},"c":2}',
                  ', metadata={op_name="jit(f)/add" source_file="m.py" source_line=3}'):
        assert hlo_fingerprint(plain + extra) == hlo_fingerprint(plain), extra
    assert hlo_fingerprint(plain.replace(" = ", "  =   ")) == hlo_fingerprint(plain)  # whitespace runs
    assert hlo_fingerprint("%a-b.c_1 = f32[8]{0} negate(%x)") == hlo_fingerprint("%y = f32[8]{0} negate(%z)")
    assert hlo_fingerprint(plain.replace("kLoop", "kInput")) != hlo_fingerprint(plain)


def test_array_text_without_layouts():
    assert _array_text(None) == "?"
    assert _array_text(parse_shape("bf16[256,512]{1,0:T(8,128)(2,1)}")) == "bf16[256,512]"
    assert _array_text(parse_shape("f32[]")) == "f32[]"
    assert _array_text(parse_shape("(f32[8]{0}, s32[])")) == "(f32[8],s32[])"
    assert _array_text(parse_shape("(f32[8]{0})")) == "(f32[8])"  # a tuple of one stays a tuple


def test_first_array_of_a_result_shape():
    assert _first_array("bf16[256,512]{1,0:T(8,128)(2,1)}") == "bf16[256,512]"
    assert _first_array("(f32[8]{0}, s32[])") == "f32[8]"
    assert _first_array("f8e4m3fn[4,4]{1,0}") == "f8e4m3fn[4,4]"
    assert _first_array("token[]") == "token[]"
    assert _first_array("") == "" and _first_array("()") == ""


_MODULE = """HloModule m, is_scheduled=true

%fused.{n} (p0: f32[8,16], p1: f32[8,16]) -> f32[8,16] {{
  %p0 = f32[8,16]{{1,0}} parameter(0)
  %p1 = f32[8,16]{{1,0}} parameter(1)
  %{body}
  ROOT %neg.{n} = f32[8,16]{{1,0}} negate(%add.{n})
}}

ENTRY %main (a: f32[8,16], b: f32[8,16]) -> f32[8,16] {{
  %a = f32[8,16]{{1,0}} parameter(0)
  %b = f32[8,16]{{1,0}} parameter(1)
  ROOT %fusion.{n} = f32[8,16]{{1,0}} fusion(%a, %b), kind=kLoop, calls=%fused.{n}, \
metadata={{op_name="jit(f)/add" source_file="m.py" source_line={line}}}
}}
"""


def _key(n: int, body: str = "add.{n} = f32[8,16]{{1,0}} add(%p0, %p1)", line: int = 7) -> str:
    text = _MODULE.format(n=n, body=body.format(n=n), line=line)
    program = parse_hlo_text(text)
    return structure_key(program, program.find(f"fusion.{n}"))


def test_structure_key_ignores_names_and_sees_what_is_computed():
    base = _key(1)
    assert base and base == _key(7)  # other names, the same computation
    assert _key(1, "add.{n} = f32[8,16]{{1,0}} subtract(%p0, %p1)") != base  # another opcode inside
    assert _key(1, "add.{n} = f32[8,16]{{1,0}} add(%p1, %p0)") != base  # operands swapped
    assert _key(1, line=8) != base  # another source line


_CONVERTS = """HloModule m

%fused.1 (p0: f32[8]) -> f32[8] {{
  %p0 = f32[8]{{0}} parameter(0)
  %c = {middle}[8]{{0}} convert(%p0)
  ROOT %r = f32[8]{{0}} convert(%c)
}}

ENTRY %main (a: f32[8]) -> {result}[8] {{
  %a = f32[8]{{0}} parameter(0)
  %fusion.1 = f32[8]{{0}} fusion(%a), kind=kLoop, calls=%fused.1
  ROOT %convert.2 = {result}[8]{{0}} convert(%a)
}}
"""


def test_structure_key_sees_the_shapes_of_the_op_and_of_every_instruction_inside():
    def keys(middle: str, result: str) -> tuple[str, str]:
        program = parse_hlo_text(_CONVERTS.format(middle=middle, result=result))
        return structure_key(program, program.find("fusion.1")), structure_key(program, program.find("convert.2"))

    fusion, convert = keys("bf16", "bf16")
    # a round trip through f16 instead of bf16: the same opcodes and positions, another shape inside
    assert keys("f16", "bf16")[0] != fusion
    # a convert to f16 instead of bf16: the same opcode and operand, another result shape
    assert keys("bf16", "f16")[1] != convert
    assert keys("bf16", "bf16") == (fusion, convert)


def test_structure_key_of_a_program_missing_the_called_computation_is_empty():
    program = parse_hlo_text(_MODULE.format(n=1, body="add.1 = f32[8,16]{1,0} add(%p0, %p1)", line=7))
    inst = program.find("fusion.1")
    assert structure_key(program, dataclasses.replace(inst, called_computations=("no_such_computation",))) == ""
    # an operand the program does not hold is a `?` in the key: the key differs but is made
    other = dataclasses.replace(inst, operands=("a", "nowhere"))
    assert structure_key(program, other) not in ("", structure_key(program, inst))


# ---------------------------------------------------------------------------------------------
# Matching ops


def _ids(rows: dict[str, dict[str, str]]) -> pd.DataFrame:
    """Identities as `_op_identities` gives them: name_key -> module, name, fingerprint, structure, source_key."""
    cols = ("module", "name", "fingerprint", "structure", "source_key")
    return pd.DataFrame({c: [r.get(c, "m" if c == "module" else "") for r in rows.values()] for c in cols},
                        index=pd.Index(list(rows), name="name_key"))


def test_matching_tries_name_then_fingerprint_structure_and_source_line():
    base = _ids({"same": {"name": "same"}, "f.1": {"fingerprint": "F"}, "s.1": {"structure": "S"},
                 "l.1": {"source_key": "L"}, "gone": {"fingerprint": "G"}})
    new = _ids({"same": {"name": "same"}, "f.9": {"fingerprint": "F"}, "s.9": {"structure": "S"},
                "l.9": {"source_key": "L"}, "new": {"fingerprint": "N"}})
    pairs, only_base, only_new = _match(base, new)
    assert pairs == [("same", "same", "name"), ("f.1", "f.9", "fingerprint"), ("s.1", "s.9", "structure"),
                     ("l.1", "l.9", "source line")]
    assert (only_base, only_new) == ({"gone"}, {"new"})


def test_a_fingerprint_match_is_not_tried_again_by_structure():
    # f.1 pairs with f.9 by fingerprint; its structure would pair it with s.9 as well, but it is taken.
    base = _ids({"f.1": {"fingerprint": "F", "structure": "S"}})
    new = _ids({"f.9": {"fingerprint": "F"}, "s.9": {"structure": "S"}})
    assert _match(base, new) == ([("f.1", "f.9", "fingerprint")], set(), {"s.9"})


def test_keys_match_only_within_one_module():
    base = _ids({"a": {"module": "m1", "fingerprint": "F"}})
    new = _ids({"b": {"module": "m2", "fingerprint": "F"}})
    assert _match(base, new) == ([], {"a"}, {"b"})


def test_empty_keys_never_match():
    assert _match(_ids({"a": {}}), _ids({"b": {}})) == ([], {"a"}, {"b"})


def test_ambiguous_groups_are_left_unpaired():
    # Two ops with one fingerprint in the base and one in the new run: which is which is unknown.
    base = _ids({"a.1": {"fingerprint": "F"}, "a.2": {"fingerprint": "F"}})
    new = _ids({"b.1": {"fingerprint": "F"}})
    assert _match(base, new) == ([], {"a.1", "a.2"}, {"b.1"})
    # two and two by fingerprint (not a source line): still left alone
    new2 = _ids({"b.1": {"fingerprint": "F"}, "b.2": {"fingerprint": "F"}})
    assert _match(base, new2)[0] == []


def test_an_ambiguous_group_does_not_stop_the_groups_after_it():
    base = _ids({"a.1": {"fingerprint": "F"}, "a.2": {"fingerprint": "F"}, "c.1": {"fingerprint": "G"}})
    new = _ids({"b.1": {"fingerprint": "F"}, "d.1": {"fingerprint": "G"}})
    assert _match(base, new) == ([("c.1", "d.1", "fingerprint")], {"a.1", "a.2"}, {"b.1"})


def test_equal_groups_by_source_line_pair_in_the_order_they_first_run():
    base = _ids({"a.1": {"source_key": "L"}, "a.2": {"source_key": "L"}, "a.3": {"source_key": "L"}})
    new = _ids({"b.1": {"source_key": "L"}, "b.2": {"source_key": "L"}, "b.3": {"source_key": "L"}})
    pairs, only_base, only_new = _match(base, new, {"a.1": 30.0, "a.2": 10.0, "a.3": 20.0},
                                        {"b.1": 5.0, "b.2": 25.0, "b.3": 15.0})
    assert pairs == [("a.2", "b.1", "source line, order"), ("a.3", "b.3", "source line, order"),
                     ("a.1", "b.2", "source line, order")]
    assert not only_base and not only_new
    # without times, by key; a key without a time runs last
    pairs, _, _ = _match(base, new, None, {"b.3": 1.0})
    assert pairs == [("a.1", "b.3", "source line, order"), ("a.2", "b.1", "source line, order"),
                     ("a.3", "b.2", "source line, order")]


# ---------------------------------------------------------------------------------------------
# Findings


def _f(rule: str, ops: tuple[str, ...] = (), saving: int = 0, host: str = "h0", message: str = "") -> Finding:
    return Finding(rule=rule, code="TPD999", severity=Severity.MEDIUM, message=message or f"{rule} on {ops}",
                   saving=Saving(saving, "measured", "test"), fix="fix", host=host, ops=ops)


def test_a_findings_saving_moves_beyond_the_larger_of_its_floors():
    # min_relative 2 % of a 1000 ps saving is 20 ps; min_abs 50 ps is larger: 50 does not move it, 51 does
    for new_saving, moved in ((1050, False), (1051, True), (950, False), (949, True)):
        [kept] = _compare_findings([_f("r", ("a",), 1000)], [_f("r", ("a",), new_saving)], OPTS, 50.0)[2]
        assert kept.saving_changed is moved, new_saving
    # the relative floor decides when it is the larger: 2 % of 10,000 is 200
    [kept] = _compare_findings([_f("r", ("a",), 10_000)], [_f("r", ("a",), 10_200)], OPTS, 50.0)[2]
    assert not kept.saving_changed


def test_findings_pair_by_rule_host_and_ops_renamed_or_not():
    base = [_f("spill", ("fusion.1",)), _f("spill", ("fusion.2",)), _f("spill", ("fusion.3",), host="h1")]
    new = [_f("spill", ("fusion.3",), host="h0"), _f("pad", ("fusion.2",)), _f("spill", ("renamed.1",))]
    appeared, resolved, persisting = _compare_findings(base, new, OPTS, 0.0, {"renamed.1": "fusion.1"})
    assert [(c.base.ops, c.new.ops, c.how) for c in persisting] == [(("fusion.1",), ("renamed.1",), "renamed ops")]
    assert [(f.rule, f.ops, f.host) for f in appeared] == [("spill", ("fusion.3",), "h0"), ("pad", ("fusion.2",), "h0")]
    assert [(f.ops, f.host) for f in resolved] == [(("fusion.2",), "h0"), (("fusion.3",), "h1")]


def test_persisting_findings_come_in_the_new_runs_order():
    base = [_f("a", ("x",)), _f("b", ("y",))]
    new = [_f("b", ("y",)), _f("a", ("x",))]
    assert [c.new.rule for c in _compare_findings(base, new, OPTS, 0.0)[2]] == ["b", "a"]


def test_findings_without_ops_pair_by_their_message_less_numbers_and_names():
    base = [_f("idle", message="`host0` idles 12.5 % of 1,234 steps")]
    same = [_f("idle", message="`host7` idles 3.0 % of 99 steps")]
    other = [_f("idle", message="`host0` idles 12.5 % of 1,234 runs")]
    [kept] = _compare_findings(base, same, OPTS, 0.0)[2]
    assert kept.how == "same message"
    appeared, resolved, persisting = _compare_findings(base, other, OPTS, 0.0)
    assert not persisting and len(appeared) == len(resolved) == 1
    # another rule or host with the same message is another finding
    assert not _compare_findings(base, [_f("spill", message=base[0].message)], OPTS, 0.0)[2]
    assert not _compare_findings(base, [_f("idle", host="h9", message=base[0].message)], OPTS, 0.0)[2]


def test_findings_citing_ops_pair_when_more_than_half_of_their_ops_overlap():
    # Jaccard index: |{a,b}| / |{a,b,c,d}| = 1/2 is not more than half; 2/3 is
    half = _compare_findings([_f("r", ("a", "b", "c"))], [_f("r", ("a", "b", "d"))], OPTS, 0.0)
    assert not half[2] and len(half[0]) == 1
    most = _compare_findings([_f("r", ("a", "b", "c"))], [_f("r", ("a", "b"))], OPTS, 0.0)
    assert [c.how for c in most[2]] == ["overlapping ops"]
    # the best overlap wins: {a,b,c,d} shares 3/4 with the second base finding and 3/5 with the first
    base = [_f("r", ("a", "b", "c", "x")), _f("r", ("a", "b", "c", "d"), saving=7)]
    new = [_f("r", ("a", "b", "c", "e"))]
    [kept] = _compare_findings(base, new, OPTS, 0.0, {"e": "d"})[2]
    assert kept.base.saving_ps == 7 and kept.how == "renamed ops"
    best = _compare_findings([_f("r", ("a", "b", "c", "x", "y")), _f("r", ("a", "b", "c", "d"), saving=7)],
                             [_f("r", ("a", "b", "c"))], OPTS, 0.0)[2]
    assert [(c.base.saving_ps, c.how) for c in best] == [(7, "overlapping ops")]


def test_a_finding_keeps_its_rule_code_severity_host_ops_message_and_saving():
    f = Finding(rule="spill", code="TPD123", severity=Severity.HIGH, message="`fusion.1` spills 12 times",
                saving=Saving(4500, "measured", "test"), fix="fix", host="h3", ops=["fusion.1", "copy.2"])
    [resolved] = _compare_findings([f], [], OPTS, 0.0)[1]
    assert resolved == FindingRef("spill", "TPD123", "high", "h3", ("fusion.1", "copy.2"),
                                  "`fusion.1` spills 12 times", 4500)


def test_findings_of_another_rule_or_host_are_passed_over_not_the_end_of_the_search():
    # The base finding of another rule comes first; the overlapping one after it still pairs.
    base = [_f("other", ("a", "b")), _f("r", ("a", "b"), host="h9"), _f("r", ("a", "b", "c"))]
    [kept] = _compare_findings(base, [_f("r", ("a", "b"))], OPTS, 0.0)[2]
    assert kept.base.ops == ("a", "b", "c") and kept.how == "overlapping ops"
    # Without ops: a message that differs comes first; the same message after it still pairs.
    base = [_f("idle", message="`h0` idles a lot"), _f("idle", message="`h0` idles 5 %")]
    [kept] = _compare_findings(base, [_f("idle", message="`h1` idles 7 %")], OPTS, 0.0)[2]
    assert kept.base.message == "`h0` idles 5 %" and kept.how == "same message"


def test_a_finding_with_ops_never_pairs_with_one_without():
    r = _compare_findings([_f("r", (), message="same")], [_f("r", ("a",), message="same")], OPTS, 0.0)
    assert not r[2] and len(r[0]) == len(r[1]) == 1


# ---------------------------------------------------------------------------------------------
# Attribution


def _change(delta: float, significant: bool = False) -> Change:
    s = _stats(1000.0, 0.0)
    return Change(s, _stats(1000.0 + delta, 0.0), delta, delta / 1000, 1.0, significant)


def test_the_parts_add_up_with_the_rest_unattributed():
    ops = [_op("fusion.1", delta=300.0), _op("all-reduce.1", delta=50.0, category="all-reduce"),
           _op("fusion.9", base_name="all-gather.3", delta=5.0, category="all-gather")]
    appeared = [(OpPresence("m", "copy.9", "copy", "f32[8]", 40.0), np.array([40.0, 40.0])),
                (OpPresence("m", "all-gather.2", "all-gather", "f32[8]", 7.0), np.array([7.0, 7.0]))]
    gone = [(OpPresence("m", "fusion.4", "loop fusion", "f32[8]", 20.0), np.array([20.0, 20.0, 20.0]))]
    families = [(NamedChange("all-reduce", _change(50.0)), (1, 1), Exposure(WindowTime(10, 10), WindowTime(10, 0)))]
    a = _attribution(400.0, ops, appeared, gone, families, _change(-10.0), OPTS, 0.0, 2, 3)
    got = {(p.kind, p.name): p for p in a.parts}
    # collectives (by the new or the base name) count in their family only
    assert set(got) == {(PartKind.OP, "fusion.1"), (PartKind.APPEARED, "copy.9"), (PartKind.GONE, "fusion.4"),
                        (PartKind.FAMILY, "all-reduce"), (PartKind.IDLE, "idle"),
                        (PartKind.UNATTRIBUTED, "unattributed")}
    assert got[(PartKind.APPEARED, "copy.9")].delta_ps == 40.0 and got[(PartKind.APPEARED, "copy.9")].base_name == ""
    assert got[(PartKind.GONE, "fusion.4")].delta_ps == -20.0 and got[(PartKind.GONE, "fusion.4")].base_name == \
        "fusion.4"
    # an appeared op is compared against zeros over the base's steps (3), a gone one over the new run's (2)
    assert got[(PartKind.APPEARED, "copy.9")].change.base.n_steps == 3
    assert got[(PartKind.GONE, "fusion.4")].change.new.n_steps == 2
    fam = got[(PartKind.FAMILY, "all-reduce")]
    assert (fam.base_name, fam.category, fam.n_ops, fam.exposure.text()) == ("all-reduce", "collective", (1, 1),
                                                                            "exposed → hidden")
    assert got[(PartKind.OP, "fusion.1")].matched_by == "name"
    # 400 - (300 + 40 - 20 + 50 - 10) = 40
    assert got[(PartKind.UNATTRIBUTED, "unattributed")].delta_ps == 40.0
    assert got[(PartKind.UNATTRIBUTED, "unattributed")].change is None
    assert sum(p.delta_ps for p in a.parts) == 400.0 and a.total_ps == 400.0
    # largest first by size, whatever the sign
    assert [p.name for p in a.parts] == ["fusion.1", "all-reduce", "copy.9", "unattributed", "fusion.4", "idle"]


def test_a_collective_by_its_name_in_either_run_or_by_its_category_counts_in_its_family_only():
    ops = [_op("all-gather.7", base_name="fusion.203", category="loop fusion", delta=1.0),  # new name: a collective
           _op("fusion.9", base_name="all-reduce.3", category="loop fusion", delta=2.0),  # base name: a collective
           _op("fusion.4", category="all-to-all", delta=3.0),  # by its category only
           _op("fusion.1", base_name="fusion.0", category="convolution fusion", delta=4.0)]
    # appeared and gone ops: a collective listed first does not end the list
    appeared = [(OpPresence("m", "all-reduce.5", "", "f32[8]", 1.0), np.array([1.0])),  # by name, no category
                (OpPresence("m", "fusion.12", "all-reduce", "f32[8]", 1.0), np.array([1.0])),  # by category
                (OpPresence("m", "copy.9", "copy", "f32[8]", 1.0), np.array([1.0]))]
    gone = [(OpPresence("m", "fusion.13", "all-gather", "f32[8]", 1.0), np.array([1.0])),
            (OpPresence("m", "copy.8", "copy", "f32[8]", 1.0), np.array([1.0]))]
    a = _attribution(10.0, ops, appeared, gone, [], None, OPTS, 0.0, 1, 1)
    named = [(p.kind, p.name, p.base_name, p.category) for p in a.parts if p.kind is not PartKind.UNATTRIBUTED]
    assert sorted(named) == [(PartKind.APPEARED, "copy.9", "", "copy"), (PartKind.GONE, "copy.8", "copy.8", "copy"),
                             (PartKind.OP, "fusion.1", "fusion.0", "convolution fusion")]


def test_the_idle_the_family_and_the_rest_parts_whole():
    idle = _change(-10.0)
    family = NamedChange("all-gather", _change(30.0))
    exposure = Exposure(WindowTime(10, 10), WindowTime(10, 10))
    appeared = [(OpPresence("m", "copy.9", "copy", "f32[8]", 5.0), np.array([5.0]))]
    a = _attribution(100.0, [], appeared, [], [(family, (3, 2), exposure)], idle, OPTS, 0.0, 1, 1)
    parts = {p.kind: p for p in a.parts}
    assert parts[PartKind.IDLE] == Part(PartKind.IDLE, "idle", "idle", "", -10.0, idle)
    assert parts[PartKind.UNATTRIBUTED] == Part(PartKind.UNATTRIBUTED, "unattributed", "", "", 75.0, None)
    assert parts[PartKind.FAMILY] == Part(PartKind.FAMILY, "all-gather", "all-gather", "collective", 30.0,
                                          family.change, exposure=exposure, n_ops=(3, 2))
    assert (parts[PartKind.APPEARED].category, parts[PartKind.APPEARED].change.new.centre_ps) == ("copy", 5.0)


def test_the_rest_goes_after_a_named_part_of_the_same_size_and_ties_go_by_name():
    a = _attribution(60.0, [_op("b", delta=20.0), _op("a", delta=20.0)], [], [], [], None, OPTS, 0.0, 1, 1)
    assert [(p.kind, p.name) for p in a.parts] == [(PartKind.OP, "a"), (PartKind.OP, "b"),
                                                   (PartKind.UNATTRIBUTED, "unattributed")]
    a = _attribution(40.0, [_op("z", delta=20.0)], [], [], [], None, OPTS, 0.0, 1, 1)
    assert [p.kind for p in a.parts] == [PartKind.OP, PartKind.UNATTRIBUTED]  # both 20
    assert not [p for p in a.parts if p.kind is PartKind.IDLE]  # no idle part without an idle change


def test_a_part_for_an_appeared_op_has_its_own_band():
    # 1 ps of a new op against a 5 ps absolute floor: a part, within noise
    appeared = [(OpPresence("m", "copy.9", "copy", "f32[8]", 1.0), np.array([1.0, 1.0]))]
    [part] = [p for p in _attribution(1.0, [], appeared, [], [], None, OPTS, 5.0, 2, 2).parts
              if p.kind is PartKind.APPEARED]
    assert part.change.noise_band_ps == 5.0 and not part.change.significant and part.change.ci_low_ps is None


# ---------------------------------------------------------------------------------------------
# Windows of async ops, compiled facts per key


def test_a_done_op_takes_its_starts_windows():
    w = WindowTime(100, 40)
    windows = {"all-gather-start.1": w, "all-reduce.2": WindowTime(50, 50)}
    assert _window_of(windows, "all-gather-start.1") == w
    assert _window_of(windows, "all-gather-done.1") == w
    assert _window_of(windows, "all-reduce.2") == WindowTime(50, 50)
    assert _window_of(windows, "all-gather-done.2") == WindowTime(0, 0)  # another pair
    assert _window_of(windows, "all-gather-start.7") == WindowTime(0, 0)  # a start is named itself
    assert _window_of(windows, "fusion.3") == WindowTime(0, 0)


def test_compiled_facts_of_a_key():
    ids = pd.DataFrame({"logical_bytes": [100.0, np.nan], "padded_bytes": [160.0, np.nan],
                        "spill_stores": [3.0, np.nan], "spill_fills": [np.nan, np.nan]}, index=["a", "b"])
    assert _facts(ids, "a", known=False) is None
    assert _facts(ids, "a", known=True) == CompiledFacts(100, 160, 3)
    assert _facts(ids, "b", known=True) == CompiledFacts(None, None, None)
    ids.loc["b", "spill_fills"] = 4.0
    assert _facts(ids, "b", known=True).spills == 4
    ids.loc["a", "spill_fills"] = 4.0
    assert _facts(ids, "a", known=True).spills == 7
    assert isinstance(_facts(ids, "a", known=True).padded_bytes, int)


# ---------------------------------------------------------------------------------------------
# Helpers that read an analysis, on stand-ins holding only the tables each reads


def _steps_table(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
    """(step, core, idle_ps) rows."""
    return pd.DataFrame({"step": [r[0] for r in rows], "core": [r[1] for r in rows],
                         "idle_ps": [r[2] for r in rows]})


def test_steps_are_sorted_and_distinct_and_means_are_over_cores():
    a = SimpleNamespace(steps=_steps_table([(3, 0, 10), (1, 0, 20), (3, 1, 30), (1, 1, 60), (2, 0, 5)]))
    assert list(_steps(a)) == [1, 2, 3]
    assert list(_per_step_mean_over_cores(a, "idle_ps")) == [40.0, 5.0, 20.0]  # step 1: (20+60)/2
    assert _per_step_mean_over_cores(a, "idle_ps").dtype == np.float64
    empty = SimpleNamespace(steps=_steps_table([]))
    assert len(_steps(empty)) == 0 and len(_per_step_mean_over_cores(empty, "idle_ps")) == 0


def test_capture_time_per_core_is_the_cores_spans_averaged():
    a = SimpleNamespace(core_time_ps={"h0": 300, "h1": 500}, n_cores_of_ops=4)  # 800 core-ps over 4 cores
    assert _capture_ps(a) == 200.0


def _sums(rows: list[tuple[int, int, str, int]]) -> pd.DataFrame:
    """(step, program_id, name, self_ps) rows: `op_step_sums`, summed over every host's cores."""
    return pd.DataFrame({"step": [r[0] for r in rows], "program_id": np.array([r[1] for r in rows], np.uint64),
                         "name": pd.Categorical([r[2] for r in rows]), "self_ps": [r[3] for r in rows]})


def _keys(rows: list[tuple[int, str, str]]) -> pd.DataFrame:
    return pd.DataFrame({"program_id": np.array([r[0] for r in rows], np.uint64), "name": [r[1] for r in rows],
                         "name_key": [r[2] for r in rows]})


def test_op_times_per_step_and_core():
    # two cores; steps 1 and 2 (and events outside every step, -1)
    a = SimpleNamespace(steps=_steps_table([(1, 0, 0), (2, 0, 0)]), n_cores_of_ops=2,
                        per_step=SimpleNamespace(op_step_sums=_sums([
                            (1, 7, "f.1", 100), (2, 7, "f.1", 300), (1, 7, "c.2", 40), (-1, 7, "f.1", 1000),
                            (1, 8, "f.1", 60),  # another program's f.1: another op
                            (1, 9, "x.9", 5)])))  # an op the ops table does not hold
    ops = _keys([(7, "f.1", "K1"), (7, "c.2", "K2"), (8, "f.1", "K3"), (7, "f.1", "K1")])
    t = _per_step_op_times(a, ops)
    assert list(t.columns) == [1, 2] and t.dtypes.eq(np.float64).all()
    assert t.loc["K1"].tolist() == [50.0, 150.0]  # 100 and 300 over two cores; the -1 events left out
    assert t.loc["K2"].tolist() == [20.0, 0.0]  # absent in step 2: 0
    assert t.loc["K3"].tolist() == [30.0, 0.0]
    assert sorted(t.index) == ["K1", "K2", "K3"]
    # a capture without steps: one column, each op's total per core, outside steps included
    whole = _per_step_op_times(a, ops, per_step=False)
    assert list(whole.columns) == [0] and whole.loc["K1"].tolist() == [(100 + 300 + 1000) / 2]


def test_op_times_without_events_in_steps_is_an_empty_table_with_the_steps_as_columns():
    a = SimpleNamespace(steps=_steps_table([(1, 0, 0), (4, 0, 0)]), n_cores_of_ops=1,
                        per_step=SimpleNamespace(op_step_sums=_sums([(-1, 7, "f.1", 100)])))
    t = _per_step_op_times(a, _keys([(7, "f.1", "K1")]))
    assert t.empty and list(t.columns) == [1, 4] and t.index.name == "name_key"
    no_steps = SimpleNamespace(steps=_steps_table([]), n_cores_of_ops=1,
                               per_step=SimpleNamespace(op_step_sums=_sums([(1, 7, "f.1", 100)])))
    assert _per_step_op_times(no_steps, _keys([(7, "f.1", "K1")])).shape == (0, 0)


def test_an_op_first_runs_at_its_earliest_start_on_any_host():
    def events(rows):
        return pd.DataFrame({"program_id": np.array([r[0] for r in rows], np.uint64),
                             "name": pd.Categorical([r[1] for r in rows]), "start_ps": [r[2] for r in rows]})

    hosts = [SimpleNamespace(events=None),  # digested away: nothing to read, and the next hosts still are
             SimpleNamespace(events=events([(7, "f.1", 200)])),
             SimpleNamespace(events=events([(7, "f.1", 500), (7, "f.1", 300), (7, "c.2", 900)])),
             SimpleNamespace(events=events([]))]
    ops = _keys([(7, "f.1", "K1"), (7, "c.2", "K2"), (7, "g.3", "K3"), (7, "f.1", "K1")])
    first = _first_runs(SimpleNamespace(profile=SimpleNamespace(hosts=hosts)), ops)
    # g.3 never ran in the events: its row position (2) orders it
    assert first == {"K1": 200.0, "K2": 900.0, "K3": 2.0}
    assert _first_runs(SimpleNamespace(profile=SimpleNamespace(hosts=[SimpleNamespace()])), ops) == \
        {"K1": 0.0, "K2": 1.0, "K3": 2.0}


def test_collective_windows_summed_over_hosts_by_op_name():
    table = pd.DataFrame({"name": pd.Categorical(["all-reduce.1", "all-gather-start.2", "all-reduce.1"]),
                          "span_ps": [100, 50, 300], "exposed_ps": [10, 50, 30]})
    asked = []

    def collectives(thresholds):
        asked.append(thresholds)
        return SimpleNamespace(ops=table)

    w = _windows(SimpleNamespace(collectives=collectives))
    assert w == {"all-reduce.1": WindowTime(400, 40), "all-gather-start.2": WindowTime(50, 50)}
    assert asked == [WindowThresholds()]  # the default thresholds: the exposed-collective rule's


def _device(t: str) -> SimpleNamespace:
    return SimpleNamespace(device=SimpleNamespace(device_type=t))


def _run(n_steps: int, types=("TPU v5 lite",), modelled=False, cores=4, platform=Platform.TPU) -> SimpleNamespace:
    return SimpleNamespace(steps=_steps_table([(s, 0, 0) for s in range(n_steps)]), n_cores_of_ops=cores,
                           platform=platform,
                           profile=SimpleNamespace(modelled=modelled, hosts=[_device(t) for t in types]))


def test_warnings_name_what_weakens_the_comparison():
    assert _warnings(_run(3), _run(10), per_step=True) == []
    assert _warnings(_run(2), _run(1), per_step=True) == [
        "base run has 2 steps: too few to measure noise; only the relative floor applies",
        "new run has 1 step: too few to measure noise; only the relative floor applies"]
    assert _warnings(_run(0), _run(5), per_step=False) == [
        "a run has no steps: op times are each op's total per core over its capture, and the step time is not "
        "compared"]
    assert _warnings(_run(5, modelled=True), _run(5), per_step=True) == [
        "base run is modelled (`tpudiag simulate`), not measured"]
    assert _warnings(_run(5), _run(5, modelled=True), per_step=True) == [
        "new run is modelled (`tpudiag simulate`), not measured"]
    assert _warnings(_run(5, types=("TPU v5 lite", "TPU v4")), _run(5, types=("TPU v6 lite",)), per_step=True) == [
        "the chips differ: base TPU v4, TPU v5 lite; new TPU v6 lite (device types differ: times compare "
        "different hardware)"]
    gpu = _warnings(_run(5, types=("NVIDIA H100",), platform=Platform.GPU), _run(5, types=()), per_step=True)
    assert gpu == ["the GPUs differ: base NVIDIA H100; new (none) (device types differ: times compare different "
                   "hardware)"]
    assert _warnings(_run(5, types=("a",)), _run(5, types=("b",), platform=Platform.GPU), per_step=True) == [
        "the GPUs differ: base a; new b (device types differ: times compare different hardware)"]
    assert _warnings(_run(5, cores=4), _run(5, cores=8), per_step=True) == [
        "core counts differ (base 4, new 8): op times are per core"]
    # the same chip on every host of both runs, listed once
    assert _warnings(_run(5, types=("v", "v")), _run(5, types=("v",)), per_step=True) == []


def _ops_table(rows: list[tuple]) -> pd.DataFrame:
    """(host, program_id, module, name, category, shape_with_layout, source, tf_op) rows, categorical as in
    `analysis.ops`; None for a missing text."""
    cols = ("host", "program_id", "module", "name", "category", "shape_with_layout", "source", "tf_op")
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    frame = pd.DataFrame(data)
    for c in ("host", "module", "name", "category"):
        frame[c] = frame[c].astype("category")
    frame["program_id"] = frame["program_id"].astype(np.uint64)
    return frame


def _metadata(rows: list[tuple[int, str, str | None]]) -> pd.DataFrame:
    return pd.DataFrame({"program_id": np.array([r[0] for r in rows], np.uint64), "name": [r[1] for r in rows],
                         "hlo_text": pd.array([r[2] for r in rows], dtype="string")})


_TEXT = "%fusion.1 = f32[8]{0} fusion(%p), kind=kLoop, calls=%c"


def test_op_table_joins_each_hosts_hlo_text_and_makes_the_match_keys():
    ops = _ops_table([
        ("h0", 7, "jit_step", "fusion.1", "loop fusion", "f32[8]{0:T(256)}", "model.py:3", "jit(f)/add"),
        ("h0", 7, "jit_step", "copy.2", "copy", None, None, None),  # no shape, source or JAX op
        ("h1", 7, "jit_step", "fusion.1", "loop fusion", "f32[8]{0:T(256)}", "model.py:3", ""),  # source only
        ("h1", 7, "jit_step", "neg.3", "negate", "f32[8]{0}", "", "jit(f)/neg"),  # JAX op only
    ])
    hosts = [SimpleNamespace(host="h9", op_metadata=_metadata([])),  # a host without metadata comes first
             SimpleNamespace(host="h0", op_metadata=_metadata([(7, "fusion.1", _TEXT), (7, "copy.2", None),
                                                               (7, "fusion.1", "a second text of the op")])),
             SimpleNamespace(host="h1", op_metadata=_metadata([(7, "fusion.1", _TEXT.replace("%p", "%q"))]))]
    t = _op_table(SimpleNamespace(ops=ops, profile=SimpleNamespace(hosts=hosts)))
    assert len(t) == 4  # one row per op row: the second text of h0's fusion.1 is not another op
    assert list(t["hlo_text"]) == [_TEXT, "", _TEXT.replace("%p", "%q"), ""]  # neg.3 has no metadata row
    assert list(t["fingerprint"]) == [hlo_fingerprint(_TEXT), "", hlo_fingerprint(_TEXT), ""]
    assert list(t["structure"]) == ["", "", "", ""]  # no compiled programs joined
    assert list(t["source_key"]) == ["loop fusion\x00model.py:3\x00jit(f)/add\x00f32[8]", "",
                                     "loop fusion\x00model.py:3\x00\x00f32[8]", "negate\x00\x00jit(f)/neg\x00f32[8]"]
    assert list(t["name_key"])[:2] == ["jit_step\x00fusion.1\x00f32[8]{0:T(256)}", "jit_step\x00copy.2\x00"]
    assert list(t["shape_with_layout"])[1] == "" and list(t["source"])[1] == "" and list(t["tf_op"])[1] == ""
    for col in ("logical_bytes", "padded_bytes", "spill_stores", "spill_fills"):
        assert t[col].isna().all()  # no compiled facts given


def test_op_table_takes_compiled_facts_by_the_ops_row_index():
    ops = _ops_table([("h0", 7, "m", "a.1", "add", "f32[8]{0}", "", ""),
                      ("h0", 7, "m", "b.2", "add", "f32[8]{0}", "", "")])
    ops.index = pd.Index([10, 20])
    compiled = pd.DataFrame({"logical_bytes": pd.array([200, 100, 5], dtype="Int64"),
                             "padded_bytes": pd.array([None, 160, 5], dtype="Int64")}, index=[20, 10, 30])
    hosts = [SimpleNamespace(host="h0", op_metadata=_metadata([]))]
    t = _op_table(SimpleNamespace(ops=ops, profile=SimpleNamespace(hosts=hosts)), compiled)
    assert list(t["logical_bytes"]) == [100.0, 200.0]
    assert t["padded_bytes"].iloc[0] == 160.0 and np.isnan(t["padded_bytes"].iloc[1])
    assert t["spill_stores"].isna().all()  # a column the compiled facts lack
    assert list(t["hlo_text"]) == ["", ""] and list(t["fingerprint"]) == ["", ""]


def test_op_table_keys_ops_by_the_structure_of_their_compiled_instruction():
    program = parse_hlo_text(_MODULE.format(n=1, body="add.1 = f32[8,16]{1,0} add(%p0, %p1)", line=7))
    ops = _ops_table([("h0", 5, "m", "fusion.1", "loop fusion", "f32[8,16]{1,0}", "", ""),
                      ("h0", 5, "m", "add.1", "add", "f32[8,16]{1,0}", "", ""),  # inside the fusion's computation
                      ("h0", 5, "m", "nowhere.9", "add", "f32[8,16]{1,0}", "", ""),  # not in the program
                      ("h0", 6, "m", "fusion.1", "loop fusion", "f32[8,16]{1,0}", "", "")])  # another program id
    hosts = [SimpleNamespace(host="h0", op_metadata=_metadata([]))]
    t = _op_table(SimpleNamespace(ops=ops, profile=SimpleNamespace(hosts=hosts)), programs={(5, "m"): program})
    fusion, add, nowhere, other = t["structure"]
    assert fusion == structure_key(program, program.find("fusion.1")) and fusion
    assert add == structure_key(program, program.find("add.1")) and add and add != fusion
    assert (nowhere, other) == ("", "")
