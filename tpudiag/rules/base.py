"""What a rule is: a stable code, a kebab-case name, the inputs it needs, its options and its check.

A rule is a pure function of a `RuleContext` (the analysed profile, the compiled inputs and their
join to the trace ops) and its frozen `Options`; it returns findings and never prints or reads files.
The rule module's docstring is its user documentation, in the sections listed in `DOC_SECTIONS`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from tpudiag.analysis.join import JoinResult
from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model import schemas
from tpudiag.model.compiled import Shape
from tpudiag.model.hardware import ChipSpec
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.findings import Finding, Severity
from tpudiag.model.grouping import group_sums
from tpudiag.model.memory import ProgramMemory
from tpudiag.model.profile import DeviceInfo, Platform
from tpudiag.model.units import number_problem

DOC_SECTIONS = ("What it does", "Why it matters", "Evidence", "How to fix", "Savings estimate", "Known limits",
                "Options")

class RuleInput(StrEnum):
    """An input a rule may need (`Rule.inputs`) or use when present (`Rule.uses`); the value is what
    `tpudiag rules`, the docs and the JSON's `rules_skipped` print."""

    TRACE = "trace"
    FLOPS = "flops"
    LAYOUTS = "layouts"
    LLO = "llo"
    HLO = "hlo"


# The reason printed when a rule is skipped for want of the input.
INPUTS: Mapping[RuleInput, str] = {
    RuleInput.TRACE: "needs a device trace with ops (TPU, GPU or XLA CPU)",
    RuleInput.FLOPS: "needs per-op FLOPs and a peak FLOP/s in the trace",
    RuleInput.LAYOUTS: "needs layouts (op shapes with TPU tiled layouts and the layout parser)",
    RuleInput.LLO: "needs LLO dumps (`--dumps DIR`)",
    RuleInput.HLO: "needs the compiled HLO (`--dumps DIR` of an XLA dump, or a capture that embeds it)",
}


class Table(StrEnum):
    """An analysis table a rule reads (`Rule.tables`), checked against its schema before the rule runs."""

    OPS = "ops"
    STEPS = "steps"
    OP_STEP_WORST = "op_step_worst"
    OP_METADATA = "op_metadata"


def _host_tables(attr: str, schema):
    def check(analysis: Analysis) -> None:
        for host in analysis.profile.hosts:
            schema.require(getattr(host, attr))
    return check


# The check the engine runs before a rule, per table it declares: a missing or mistyped column is a
# bug in the analysis, reported precisely instead of as a KeyError deep in a rule.
TABLES: Mapping[Table, Callable[[Analysis], None]] = {
    Table.OPS: lambda a: schemas.OPS.require(a.ops),
    Table.STEPS: lambda a: schemas.STEPS.require(a.steps),
    Table.OP_STEP_WORST: lambda a: schemas.OP_STEP_WORST.require(a.per_step.op_step_worst),
    Table.OP_METADATA: _host_tables("op_metadata", schemas.OP_METADATA),
}


@dataclass(frozen=True)
class RuleContext:
    """Everything a rule may look at; the engine runs a rule only when the inputs it declares are here.

    analysis: the analysed capture (measured, or modelled from a compiled program in static mode);
      None for compiler dumps that give no timeline (no generation known), where only rules that
      do not need `trace` run.
    compiled: LLO dumps and HLO programs (`CompiledInputs.programs` are the ones rules read).
    join: compiled facts per trace op (`tpudiag.analysis.join`), None when nothing was joined.
    layouts: the layout parser's `parse_shape` (shape text -> `Shape` with its logical and padded
      bytes), injected so rule modules import no parser; it raises ValueError on text it cannot read.
    chip: the TPU generation's spec when known (trace, dump target or `--chip`).
    static: True when times come from the compiler's estimate, not a measured trace.
    memory: the device memory of the compiled programs (`tpudiag.analysis.device_memory.program_memories`
      of `compiled` and its `oom_errors`), built once per diagnosis for the rules and the report.
    """

    analysis: Analysis | None
    compiled: CompiledInputs = field(default_factory=CompiledInputs)
    join: JoinResult | None = None
    layouts: Callable[[str], Shape] | None = None
    chip: ChipSpec | None = None
    static: bool = False
    memory: tuple[ProgramMemory, ...] = ()


@dataclass(frozen=True)
class Rule:
    code: str  # stable, e.g. TPD101
    name: str  # kebab-case, reads well after "allow"
    severity: Severity  # the highest severity its findings take
    inputs: tuple[RuleInput, ...]  # all needed: the rule is skipped without any of them
    options_type: type  # a frozen dataclass; every field is a threshold with a default
    check: Callable[[RuleContext, Any], list[Finding]]
    doc: str  # the module docstring
    uses: tuple[RuleInput, ...] = ()  # optional inputs: used when present, never required
    tables: tuple[Table, ...] = ()  # analysis tables read, checked against their schemas
    tpu_only: bool = False  # about TPU hardware (tiled layouts, LLO, VMEM): skipped on GPU and CPU captures

    @property
    def summary(self) -> str:
        """The docstring's first line, without its period."""
        return (self.doc or "").strip().splitlines()[0].rstrip(".") if self.doc else ""

    def page(self) -> str:
        """The rule's documentation, in Markdown: what `tpudiag rule NAME` prints and `docs/rules/NAME.md`
        holds (`tests/rules/test_rule_docs.py` keeps the two the same)."""
        needs = ", ".join(self.inputs)
        uses = f"; uses {', '.join(self.uses)} when present" if self.uses else ""
        return (f"# {self.name} ({self.code})\n\nSeverity up to {self.severity.label()} · needs {needs}{uses}\n\n"
                f"{self.doc.strip()}\n")

    def default_options(self):
        return self.options_type()

    def options_with(self, overrides: Mapping[str, Any]):
        """Options with `overrides` applied; ValueError naming an unknown key or a bad value."""
        fields = {f.name: f for f in dataclasses.fields(self.options_type)}
        defaults = self.options_type()
        clean = {}
        for key, value in overrides.items():
            attr = key.replace("-", "_")
            if attr not in fields:
                raise ValueError(f"unknown option `{key}` for rule `{self.name}`; "
                                 f"known: {', '.join(sorted(fields)) or 'none'}")
            default = getattr(defaults, attr)
            if isinstance(default, bool) or isinstance(value, bool):
                ok = isinstance(value, bool) and isinstance(default, bool)
            elif isinstance(default, (int, float)):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                if ok and isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
                    ok = value.is_integer()
                    value = int(value) if ok else value  # the refusal shows the value given: 2.5, not 2
                elif ok and isinstance(default, float):
                    value = float(value)
            else:
                ok = isinstance(value, type(default))
            if not ok:
                raise ValueError(f"option `{key}` of rule `{self.name}` must be {type(default).__name__}, "
                                 f"got {value!r}")
            problem = number_problem(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            if problem:  # every threshold is a count, share or size: NaN, inf or negative is a mistake
                raise ValueError(f"option `{key}` of rule `{self.name}` {problem}")
            clean[attr] = value
        return dataclasses.replace(defaults, **clean)


_SECTION = re.compile(r"^(?P<title>[A-Z][A-Za-z ]+)\n-+\n", re.MULTILINE)


def doc_sections(doc: str) -> dict[str, str]:
    """A rule docstring's sections, keyed by title (titles are underlined with dashes)."""
    matches = list(_SECTION.finditer(doc or ""))
    out = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(doc)
        out[m.group("title").strip()] = doc[m.end():end].strip()
    return out


# -- shared helpers for rules ---------------------------------------------------------------------

@dataclass(frozen=True)
class SeverityScale:
    """Severity from the saving's share of the step time."""

    high_share: float
    medium_share: float

    def of(self, share: float, cap: Severity) -> Severity:
        if share >= self.high_share:
            sev = Severity.HIGH
        elif share >= self.medium_share:
            sev = Severity.MEDIUM
        else:
            sev = Severity.LOW
        return min(sev, cap)


@dataclass(frozen=True)
class LagBand:
    """The noise band of the straggler rules, as options: a lag counts when it exceeds both
    `min_lag_fraction` of the reference and `noise_sigmas` standard deviations of the step times.
    Each straggler rule's `Options` extends it (and documents both)."""

    min_lag_fraction: float = 0.03
    noise_sigmas: float = 3.0

    def __post_init__(self):
        if not 0.0 <= self.min_lag_fraction < 10.0:
            raise ValueError(f"min_lag_fraction must be in [0, 10), got {self.min_lag_fraction}")
        if self.noise_sigmas < 0:
            raise ValueError(f"noise_sigmas must be at least 0, got {self.noise_sigmas}")


@dataclass(frozen=True)
class StepBasis:
    """How per-step savings are computed: the number of steps and the mean step time."""

    n_steps: int
    step_ps: float  # mean step time (slowest core), 0 when the capture has no steps
    whole_capture: bool  # True when there are no steps: the capture counts as one step


def whole_capture(analysis: Analysis) -> bool:
    """The capture has no steps: it counts as one step, and a saving is over the capture, not per step."""
    return analysis.steps.empty


def step_basis(analysis: Analysis) -> StepBasis:
    steps = analysis.steps
    if whole_capture(analysis):
        span = max(analysis.core_time_ps.values(), default=0)
        return StepBasis(1, span / analysis.n_cores_of_ops, True)
    per_step = steps.groupby("step")["dur_ps"].max()
    return StepBasis(len(per_step), float(per_step.mean()), False)


def per_step_worst_core(frame: pd.DataFrame, value: str, basis: StepBasis) -> float:
    """Mean over steps of the largest per-(host, core) sum of `value` in that step.

    The step time is the slowest core's, so removing time from every core shortens a step by at
    most the largest per-core amount: this is the per-step upper bound the rules report. Rows
    outside every step (step == -1) are ignored unless the capture has no steps at all.
    """
    if frame.empty:
        return 0.0
    return float(per_step_worst_core_by(frame, value, basis, None)[1][0])


def _factorized(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """`pd.factorize(column.to_numpy(), sort=False)` as (int64 codes, labels as objects); a
    categorical without missing values through its integer codes, not a string per row."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        if not (codes < 0).any():
            group, seen = pd.factorize(codes, sort=False)
            return group.astype(np.int64), np.asarray(column.cat.categories, dtype=object)[seen]
    group, labels = pd.factorize(column.to_numpy(), sort=False)
    return group.astype(np.int64), np.asarray(labels, dtype=object)


def per_step_worst_core_by(frame: pd.DataFrame, value: str, basis: StepBasis,
                          by: str | None) -> tuple[np.ndarray, np.ndarray]:
    """`per_step_worst_core` for every group of column `by` at once: (group labels, values).

    One sort over whole arrays instead of a pandas groupby per group: the exposed-collective rule
    asks this for hundreds of ops over hundreds of thousands of windows. With `by` None there is
    one group, labelled None.
    """
    n = len(frame)
    if by is not None:
        group, labels = _factorized(frame[by])
    else:
        group, labels = np.zeros(n, dtype=np.int64), np.array([None], dtype=object)
    vals = frame[value].to_numpy()
    vals = vals.astype(np.int64) if vals.dtype.kind in "iub" else vals.astype(np.float64)
    host = _factorized(frame["host"])[0]
    core = frame["core"].to_numpy().astype(np.int64)
    out = np.zeros(len(labels), dtype=np.float64)
    if basis.whole_capture:
        (g, _, _), sums = group_sums([group, host, core], vals)
        worst = np.full(len(labels), -np.inf)
        np.maximum.at(worst, g, sums.astype(np.float64))
        present = np.isfinite(worst)
        out[present] = worst[present]
        return labels, out
    step = frame["step"].to_numpy().astype(np.int64)
    inside = step >= 0
    if not inside.any():
        return labels, out
    (g, s, _, _), sums = group_sums([group[inside], step[inside], host[inside], core[inside]], vals[inside])
    # Max over (host, core) within each (group, step): the sums are sorted by group then step.
    new = np.ones(len(g), dtype=bool)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    heads = np.flatnonzero(new)
    worst = np.maximum.reduceat(sums, heads)
    total = np.zeros(len(labels), dtype=worst.dtype)
    np.add.at(total, g[heads], worst)
    out = total.astype(np.float64) / basis.n_steps
    return labels, out


def op_hlo_texts(analysis: Analysis) -> dict[str, str]:
    """Op name -> the HLO text the trace's op metadata gives it (any host; the last host wins)."""
    meta = pd.concat([h.op_metadata for h in analysis.profile.hosts], ignore_index=True)
    return dict(zip(meta["name"].astype(str), meta["hlo_text"].astype(str)))


def op_events(analysis: Analysis, names) -> pd.DataFrame:
    """(host, core, step, name, self_ps) of the ops named in `names`: per step, the self time on the
    worst core of any host (`analysis.per_step`, folded over hosts: host "" and core 0 stand for
    it). What every per-step worst-core sum reads: the max over (host, core) of the events' sums."""
    table = analysis.per_step.op_step_worst
    # By category code: the table has steps x ops rows, the names are few.
    column = table["name"].astype("category")
    categories = np.asarray(column.cat.categories.astype(str), dtype=object)
    codes = column.cat.codes.to_numpy()
    wanted_code = np.append(pd.Index(categories).isin(set(map(str, names))), False)  # code -1: no name
    wanted = wanted_code[codes]
    n = int(wanted.sum())
    return pd.DataFrame({"host": np.full(n, "", dtype=object), "core": np.zeros(n, dtype=np.int64),
                         "step": table["step"].to_numpy()[wanted],
                         "name": categories[codes[wanted]],
                         "self_ps": table["self_ps"].to_numpy()[wanted]})


def health_tool(device: DeviceInfo) -> str:
    """The command that shows a device's health and clocks: `tpu-info`, `nvidia-smi`, `amd-smi`."""
    if device.platform is Platform.GPU:
        vendor = device.gpu.vendor if device.gpu is not None else ""
        return {"AMD": "`amd-smi metric`", "NVIDIA": "`nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE`"}.get(
            vendor, "`nvidia-smi` or `amd-smi`")
    return "`tpu-info`" if device.platform is Platform.TPU else "the machine's monitoring"
