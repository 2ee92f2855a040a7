"""`rules.base`: what a rule is and the helpers every rule shares, called directly on values built here.

Expectations come from the documented contract: the skip and option messages users read, the
health command each vendor ships (`tpu-info`, `nvidia-smi`, `amd-smi`), and per-step sums worked by
hand. Milliseconds, no capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from tpudiag.model.findings import Severity
from tpudiag.model.hardware import GpuDevice
from tpudiag.model.profile import DeviceInfo, PeaksSource, Platform
from tpudiag.rules.base import Rule, RuleInput, health_tool


def _device(platform: Platform, vendor: str | None = None) -> DeviceInfo:
    gpu = GpuDevice(vendor, None, 0, 0.0, 0.0, 0, None) if vendor is not None else None
    return DeviceInfo(platform, "", None, None, None, PeaksSource.NONE, 1, 1, gpu=gpu)


@pytest.mark.parametrize(("platform", "vendor", "tool"), [
    (Platform.TPU, None, "`tpu-info`"),
    (Platform.GPU, "NVIDIA", "`nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE`"),
    (Platform.GPU, "AMD", "`amd-smi metric`"),
    (Platform.GPU, "", "`nvidia-smi` or `amd-smi`"),  # the plane does not name its vendor
    (Platform.GPU, None, "`nvidia-smi` or `amd-smi`"),  # no GPU stats at all
    (Platform.CPU, None, "the machine's monitoring"),
])
def test_health_tool_is_the_vendors_own_command(platform, vendor, tool):
    assert health_tool(_device(platform, vendor)) == tool


@dataclass(frozen=True)
class _Options:
    enabled: bool = True
    count: int = 5
    share: float = 0.5
    label: str = "x"
    max_rows: int = 2


@dataclass(frozen=True)
class _NoOptions:
    pass


DOC = """Toy rule for the tests.

What it does
------------
Nothing.
"""


def _rule(options_type=_Options, doc=DOC, uses=()) -> Rule:
    return Rule(code="TPD999", name="toy-rule", severity=Severity.MEDIUM, inputs=(RuleInput.TRACE, RuleInput.HLO),
                options_type=options_type, check=lambda ctx, options: [], doc=doc, uses=uses)


def test_summary_is_the_first_line_without_its_period():
    assert _rule().summary == "Toy rule for the tests"
    assert _rule(doc="").summary == ""
    assert _rule(doc=None).summary == ""
    assert _rule(doc="Checks the MAX.\n\nMore.").summary == "Checks the MAX"  # only the period goes


def test_page_is_the_title_the_inputs_and_the_doc():
    assert _rule().page() == ("# toy-rule (TPD999)\n\nSeverity up to medium · needs trace, hlo\n\n"
                              f"{DOC.strip()}\n")
    with_uses = _rule(uses=(RuleInput.LLO, RuleInput.LAYOUTS)).page()
    assert with_uses.splitlines()[2] == "Severity up to medium · needs trace, hlo; uses llo, layouts when present"


def test_options_with_converts_numbers_to_the_defaults_type():
    rule = _rule()
    assert rule.default_options() == _Options()
    got = rule.options_with({"count": 3.0, "share": 1, "enabled": False, "label": "y"})
    assert got == _Options(enabled=False, count=3, share=1.0, label="y")
    assert type(got.count) is int and type(got.share) is float
    assert rule.options_with({}) == _Options()
    assert rule.options_with({"share": 0}).share == 0.0  # 0 is a threshold like any other
    assert type(rule.options_with({"count": 3}).count) is int  # an int for an int stays an int


@pytest.mark.parametrize(("overrides", "message"), [
    ({"cuont": 1}, "unknown option `cuont` for rule `toy-rule`; known: count, enabled, label, max_rows, share"),
    # Regression: the value was converted before the check, so 2.5 was refused as "got 2".
    ({"count": 2.5}, "option `count` of rule `toy-rule` must be int, got 2.5"),
    ({"count": True}, "option `count` of rule `toy-rule` must be int, got True"),
    ({"count": "3"}, "option `count` of rule `toy-rule` must be int, got '3'"),
    ({"share": "0.5"}, "option `share` of rule `toy-rule` must be float, got '0.5'"),
    ({"enabled": 1}, "option `enabled` of rule `toy-rule` must be bool, got 1"),
    ({"label": 3}, "option `label` of rule `toy-rule` must be str, got 3"),
    ({"count": -1}, "option `count` of rule `toy-rule` must be >= 0, got -1"),
    ({"share": float("nan")}, "option `share` of rule `toy-rule` must be a finite number, got nan"),
    ({"share": float("inf")}, "option `share` of rule `toy-rule` must be a finite number, got inf"),
])
def test_options_with_refuses_with_the_whole_message(overrides, message):
    with pytest.raises(ValueError) as info:
        _rule().options_with(overrides)
    assert str(info.value) == message


def test_a_rule_without_options_says_none_are_known():
    with pytest.raises(ValueError) as info:
        _rule(options_type=_NoOptions).options_with({"x": 1})
    assert str(info.value) == "unknown option `x` for rule `toy-rule`; known: none"


def test_option_keys_may_use_dashes_and_are_named_as_written():
    assert _rule().options_with({"max-rows": 7}).max_rows == 7
    with pytest.raises(ValueError) as info:
        _rule().options_with({"max-rows": 0.5})
    assert str(info.value) == "option `max-rows` of rule `toy-rule` must be int, got 0.5"


def test_factorized_reads_a_categorical_by_its_codes_and_keeps_first_seen_order():
    from tpudiag.rules.base import _factorized

    column = pd.Series(["b", "a", "b", "c"], dtype=pd.CategoricalDtype(["c", "b", "a"]))
    codes, labels = _factorized(column)
    assert codes.tolist() == [0, 1, 0, 2] and labels.tolist() == ["b", "a", "c"]
    assert codes.dtype == "int64" and labels.dtype == object
    # A missing value (code -1) goes the plain way: pandas' factorize marks it -1 too.
    codes, labels = _factorized(pd.Series(["b", None, "b"], dtype="category"))
    assert codes.tolist() == [0, -1, 0] and labels.tolist() == ["b"]
    codes, labels = _factorized(pd.Series(["y", "x", "y"]))  # first seen, not sorted
    assert codes.tolist() == [0, 1, 0] and labels.tolist() == ["y", "x"]
    # Labels are objects whatever the values: integer categories, and plain integers.
    codes, labels = _factorized(pd.Series([7, 3, 7], dtype="category"))
    assert codes.tolist() == [0, 1, 0] and labels.tolist() == [7, 3] and labels.dtype == object
    codes, labels = _factorized(pd.Series([7, 3, 7]))
    assert codes.tolist() == [0, 1, 0] and labels.tolist() == [7, 3] and labels.dtype == object


def test_doc_sections_split_at_each_underlined_title():
    from tpudiag.rules.base import doc_sections

    doc = ("Summary line.\n\nWhat it does\n------------\nOne.\n\nWhy it matters\n--------------\nTwo,\non two lines.\n\n"
           "Options\n-------\n- `x` (1): the last section runs to the end.\n")
    assert doc_sections(doc) == {"What it does": "One.", "Why it matters": "Two,\non two lines.",
                                 "Options": "- `x` (1): the last section runs to the end."}
    assert doc_sections("") == {} and doc_sections(None) == {}
    assert doc_sections("no titles here\n") == {}


def test_a_host_table_is_checked_before_a_rule_that_reads_it(tmp_path):
    # `Table.OP_METADATA` is every host's op metadata: a column missing on a host is named, not a KeyError.
    from dataclasses import replace

    from tests.rules import scenarios as sc
    from tpudiag.rules import RulesConfig

    analysis = sc.analyse(sc.low_mxu(), tmp_path)
    host = replace(analysis.profile.hosts[0], op_metadata=analysis.profile.hosts[0].op_metadata.drop(columns=["hlo_text"]))
    broken = replace(analysis, profile=replace(analysis.profile, hosts=(host, *analysis.profile.hosts[1:])))
    with pytest.raises(ValueError, match=r"op_metadata table lacks columns \['hlo_text'\]"):
        sc.run_rules(broken, RulesConfig(select=("low-mxu-utilization",)))


def test_op_events_slices_the_named_ops_folded_over_hosts():
    from types import SimpleNamespace

    from tpudiag.rules.base import op_events

    # The per-step worst-core table: an op per row, a row whose name is missing (code -1) never matches.
    table = pd.DataFrame({"name": pd.Categorical(["a", "b", None, "a"]), "step": [0, 0, 1, 1],
                          "self_ps": [10, 20, 30, 40]})
    analysis = SimpleNamespace(per_step=SimpleNamespace(op_step_worst=table))
    got = op_events(analysis, ["a", "zzz"])
    assert got["name"].tolist() == ["a", "a"] and got["step"].tolist() == [0, 1]
    assert got["self_ps"].tolist() == [10, 40]
    # Host "" and core 0 stand for the worst core of any host, as documented.
    assert got["host"].tolist() == ["", ""] and got["core"].tolist() == [0, 0] and got["core"].dtype == "int64"
    assert op_events(analysis, []).empty


def test_per_step_sums_keep_fractions_and_exact_integers():
    from tpudiag.rules.base import StepBasis, per_step_worst_core_by

    basis = StepBasis(n_steps=1, step_ps=1.0, whole_capture=True)
    frame = pd.DataFrame({"host": ["h", "h"], "core": [0, 0], "step": [0, 0], "v": [0.5, 0.25]})
    assert per_step_worst_core_by(frame, "v", basis, None)[1].tolist() == [0.75]  # float values stay floats
    # Integers are summed as integers: 2^53 + 1 + 1 is exact, where float64 sums would lose both ones.
    frame = frame.reindex([0, 1, 1]).reset_index(drop=True).assign(v=[2**53, 1, 1])
    assert per_step_worst_core_by(frame, "v", basis, None)[1].tolist() == [2**53 + 2]


def test_per_step_sums_of_an_empty_frame_are_one_group_of_nothing():
    # With `by` None there is one group, labelled None, even with no rows: its sum is 0, not -inf.
    from tpudiag.rules.base import StepBasis, per_step_worst_core_by

    empty = pd.DataFrame({"host": pd.Series([], dtype=object), "core": pd.Series([], dtype="int64"),
                          "step": pd.Series([], dtype="int64"), "v": pd.Series([], dtype="int64")})
    for whole in (True, False):
        labels, values = per_step_worst_core_by(empty, "v", StepBasis(1, 1.0, whole), None)
        assert labels.tolist() == [None] and values.tolist() == [0.0]


def test_per_step_sums_add_the_steps_as_integers():
    # Three steps whose worst cores hold 2^53, 1 and 1 ps: 2^53 + 2 over the steps, exact only when the
    # steps are added as integers (float64 drops each 1 added to 2^53). One step in the basis, so no mean.
    from tpudiag.rules.base import StepBasis, per_step_worst_core_by

    frame = pd.DataFrame({"host": ["h", "h", "h", "h"], "core": [0, 1, 0, 0], "step": [0, 0, 1, 2],
                          "v": [2**53, 5, 1, 1]})
    labels, values = per_step_worst_core_by(frame, "v", StepBasis(1, 1.0, False), None)
    assert values.tolist() == [2**53 + 2]


def test_per_step_worst_core_by_takes_each_groups_worst_core_per_step():
    # Op `b` (the second group) runs on two cores in step 0, 5 and 7 ps: its step costs the worse, 7,
    # not 12; step 1 has b on one core, 4 ps. `a` is 3 ps in step 0. Two steps: a 1.5, b (7 + 4) / 2.
    from tpudiag.rules.base import StepBasis, per_step_worst_core_by

    frame = pd.DataFrame({"name": ["a", "b", "b", "b"], "host": ["h"] * 4, "core": [0, 0, 1, 0],
                          "step": [0, 0, 0, 1], "v": [3, 5, 7, 4]})
    labels, values = per_step_worst_core_by(frame, "v", StepBasis(2, 1.0, False), "name")
    assert dict(zip(labels.tolist(), values.tolist())) == {"a": 1.5, "b": 5.5}
