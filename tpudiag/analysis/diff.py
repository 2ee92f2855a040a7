"""Compare two captures step by step, so that run-to-run noise is not reported as a change.

Every compared quantity is a per-step distribution in each run: the step time (slowest core, and
over hosts the slowest host), the step breakdown (mean over cores), each collective family's time
and each op's self time (summed over cores, divided by the run's core count: time per step and
core). Its *centre* is the median for the step time (one slow step does not move it) and the mean
for breakdown parts, families and ops (they add up to busy time).

**Noise band.** A change is reported only when |new centre - base centre| exceeds

    band = max(min_relative x |base centre|,  larger of the two runs' spreads,  min_abs_ps)

where a run's spread is half its p10-p90 range over steps, *and* a 95 % bootstrap confidence
interval of the change (steps resampled with replacement in each run, fixed seed, so the output is
reproducible) excludes zero. With uniform ±1 % jitter the spread is
about 0.8 %, and two noisy runs of the same program differ by far less than the 2 % floor; a real
20 % slowdown of an op clears both. For ops, `min_abs_ps` is `min_step_share` of the base step
time, so changes too small to matter for the step are not listed as changes. Runs with fewer than
`MIN_STEPS_FOR_SPREAD` steps get a warning: their spread says little, only the floor applies.

**Matching ops.** By what they compute, so an op XLA renamed in a recompile (`fusion.203` ->
`subtract_convert_fusion.2`) still pairs; the method is recorded per pair (`OpChange.matched_by`),
tried in this order, each on the ops the earlier ones left:

1. `name`: the same (module, op name, result shape);
2. `fingerprint`: the canonical HLO instruction text (names, metadata, backend config removed),
   unique in both runs;
3. `structure`: the opcode tree of the fused computation (opcodes with their operands as
   positions), the operand and output shapes, the source line and the JAX op name, from the
   compiled programs joined to each run (`JoinResult.programs`), unique in both runs;
4. `source line`: (category, source line, JAX op name, first result array's type and dims) - what
   survives a change of fusion or of async wrapping; unique in both runs, or the same number of ops
   in both, then paired in the order they first run (`source line, order`).

Program ids are not used: they change with every recompilation.

**Attribution.** The step-time change (median over steps) is split into parts that add up to it:
each matched op (its change of self time per step and core), each op that appeared (+) or went
away (-), each collective family (its ops' self time together, matched or not), the change of idle
time, and the rest, `unattributed` (the step time is the slowest core's median while the parts are
means over cores; overlapping ops). Each part has its own noise band; collective parts say how
exposed their windows were in each run (`exposure`), so a collective the new run hides shows as
`exposed -> hidden`.

**Captures without steps.** When a run has no steps, op times are each op's total self time per
core over the whole capture, in both runs (`Diff.per_step` is False), and the renderers say so.

Findings pair through their ops: a finding of the new run whose cited ops map (by the op pairs
above) onto the ops a base finding of the same rule and host cites is the same finding, renamed
or not; findings that cite no op pair by rule, host and message with numbers and quoted names
removed; findings citing several ops pair when most of their ops do (Jaccard index above 1/2).
Persisting ones show their saving before and after.
Padding and spills are compared per matched op when compiled programs are joined to both runs
(the HLO a capture embeds, or `--dumps`): padded minus logical bytes, and spill stores + fills.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis, combined_step_times
from tpudiag.model.compiled import CompiledProgram, Instruction, leaf_arrays
from tpudiag.model.findings import Finding
from tpudiag.model.hlo_names import async_pair_key, async_role, collective_family
from tpudiag.model.profile import Platform, WindowThresholds

MIN_STEPS_FOR_SPREAD = 3


@dataclass(frozen=True)
class NoiseOptions:
    """Thresholds of the noise band; see the module docstring."""

    min_relative: float = 0.02  # changes under 2 % of the base centre are never reported
    quantiles: tuple[float, float] = (0.10, 0.90)  # spread = half this range of per-step values
    min_step_share: float = 0.001  # op/family changes under 0.1 % of the base step are not reported
    confidence: float = 0.95  # of the bootstrap interval of the change
    resamples: int = 2000  # bootstrap resamples; 0 turns the interval off
    seed: int = 0  # of the bootstrap, for reproducible output

    def __post_init__(self) -> None:
        lo, hi = self.quantiles
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"quantiles must satisfy 0 <= lo < hi <= 1, got {self.quantiles}")
        if not 0 < self.confidence < 1 or self.resamples < 0:
            raise ValueError(f"confidence must be in (0, 1) and resamples >= 0, got confidence={self.confidence}, "
                             f"resamples={self.resamples}")
        if self.min_relative < 0 or self.min_step_share < 0:
            raise ValueError(f"thresholds must be >= 0, got min_relative={self.min_relative}, "
                             f"min_step_share={self.min_step_share}")


@dataclass(frozen=True)
class StepStats:
    """One quantity over the steps of one run, in ps."""

    n_steps: int
    centre_ps: float  # median (step time) or mean (everything else)
    p10_ps: float
    p90_ps: float
    spread_ps: float  # half of the quantile range


@dataclass(frozen=True)
class Change:
    base: StepStats
    new: StepStats
    delta_ps: float  # new centre - base centre
    relative: float | None  # delta / base centre; None when the base is 0
    noise_band_ps: float
    significant: bool  # |delta| > noise band, and the confidence interval (when known) excludes 0
    ci_low_ps: float | None = None  # bootstrap confidence interval of delta; None for an op inside its band
    ci_high_ps: float | None = None

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "within noise"
        return "slower" if self.delta_ps > 0 else "faster"


@dataclass(frozen=True)
class NamedChange:
    """A breakdown part (compute, collectives, io, idle) or a collective family."""

    name: str
    change: Change


@dataclass(frozen=True)
class CompiledFacts:
    """What the compiled program says about one op (`tpudiag.analysis.join`); None where it says nothing."""

    logical_bytes: int | None = None  # operands + result
    padded_bytes: int | None = None  # the same in their tiled TPU layouts
    spills: int | None = None  # VMEM spill stores + fills (LLO dump)

    @property
    def padding_bytes(self) -> int | None:
        if self.logical_bytes is None or self.padded_bytes is None:
            return None
        return self.padded_bytes - self.logical_bytes


MATCH_METHODS = ("name", "fingerprint", "structure", "source line", "source line, order")

# A collective's windows are hidden when compute covers at least this share of them, exposed at most
# the lower one (the exposed-collective rule's defaults, `model.profile.WindowThresholds`).
_HIDDEN_AT, _EXPOSED_AT = WindowThresholds().hidden, WindowThresholds().exposed


@dataclass(frozen=True)
class WindowTime:
    """A collective op's (or family's) windows in one run: span and the part no compute covers."""

    span_ps: int
    exposed_ps: int

    @property
    def label(self) -> str:
        """`exposed`, `hidden` or `partly hidden`; '' without windows (the op is absent there)."""
        if self.span_ps <= 0:
            return ""
        covered = 1 - self.exposed_ps / self.span_ps
        if covered >= _HIDDEN_AT:
            return "hidden"
        return "exposed" if covered <= _EXPOSED_AT else "partly hidden"

    def __add__(self, other: WindowTime) -> WindowTime:
        return WindowTime(self.span_ps + other.span_ps, self.exposed_ps + other.exposed_ps)


@dataclass(frozen=True)
class Exposure:
    """How exposed a collective (or a family's) windows were in each run."""

    base: WindowTime
    new: WindowTime

    @property
    def moved(self) -> bool:
        """From exposed to hidden or back (or partly), where it ran in both."""
        b, n = self.base.label, self.new.label
        return bool(b and n and b != n)

    def text(self) -> str:
        """`exposed -> hidden`, `exposed` when it did not move, `(absent) -> exposed`."""
        b, n = self.base.label or "(absent)", self.new.label or "(absent)"
        return b if b == n else f"{b} → {n}"


@dataclass(frozen=True)
class OpChange:
    """An op present in both runs."""

    module: str
    name: str  # in the new run
    base_name: str  # differs from `name` when matched by fingerprint across a rename
    category: str
    shape: str
    matched_by: str  # MATCH_METHODS: how the pair was made
    change: Change  # self time per step and core (per core over the capture without steps)
    base_compiled: CompiledFacts | None = None  # None: no compiled facts joined in that run
    new_compiled: CompiledFacts | None = None
    exposure: Exposure | None = None  # a collective's windows in each run; None for other ops

    @property
    def compiled_changed(self) -> bool:
        """Padding bytes or spills differ, where both runs know them."""
        b, n = self.base_compiled, self.new_compiled
        if b is None or n is None:
            return False
        return ((b.padding_bytes is not None and n.padding_bytes is not None and b.padding_bytes != n.padding_bytes)
                or (b.spills is not None and n.spills is not None and b.spills != n.spills))


@dataclass(frozen=True)
class OpPresence:
    """An op present in one run only, with its time per step and core there."""

    module: str
    name: str
    category: str
    shape: str
    time_ps: float


@dataclass(frozen=True)
class FindingRef:
    rule: str
    code: str
    severity: str
    host: str
    ops: tuple[str, ...]
    message: str
    saving_ps: int


@dataclass(frozen=True)
class FindingChange:
    """A finding present in both runs (same rule and host, paired through its ops), with its saving
    in each; `how` is `same ops`, `renamed ops` (every op paired with a differently named one),
    `overlapping ops` (most of its ops paired) or `same message` (a finding citing no op)."""

    base: FindingRef
    new: FindingRef
    saving_changed: bool = False  # beyond min_relative of the base saving and min_step_share of the step
    how: str = "same ops"

    @property
    def changed(self) -> bool:
        return self.saving_changed

    @property
    def renamed(self) -> bool:
        """Paired through ops of other names."""
        return self.how in ("renamed ops", "overlapping ops")


class PartKind(str, Enum):
    """What a part of the attribution stands for."""

    OP = "op"  # an op in both runs
    APPEARED = "appeared"  # an op only in the new run
    GONE = "gone"  # an op only in the base run
    FAMILY = "family"  # a collective family: all its ops, in either run
    IDLE = "idle"
    UNATTRIBUTED = "unattributed"  # the step-time change the parts above do not account for

    @property
    def named(self) -> bool:
        """Attributed to named ops or a collective family."""
        return self in (PartKind.OP, PartKind.APPEARED, PartKind.GONE, PartKind.FAMILY)


@dataclass(frozen=True)
class Part:
    """One part of a step-time change, per step and core; `change` is None for the unattributed rest,
    which has no distribution of its own."""

    kind: PartKind
    name: str  # the op in the new run (the base run's for a gone op), the family, `idle`, `unattributed`
    base_name: str  # the op in the base run; differs from `name` for a renamed op
    category: str
    delta_ps: float
    change: Change | None
    matched_by: str = ""  # for an OP part
    exposure: Exposure | None = None  # for collectives and families
    n_ops: tuple[int, int] = (1, 1)  # ops a FAMILY part holds in the base and the new run


@dataclass(frozen=True)
class Attribution:
    """The step-time change split into parts that add up to it, largest first."""

    total_ps: float  # the change of the median step time
    parts: tuple[Part, ...]

    @property
    def moved(self) -> bool:
        """Any part changed at all."""
        return any(p.delta_ps for p in self.parts)

    @property
    def named_ps(self) -> float:
        return sum(p.delta_ps for p in self.parts if p.kind.named)

    @property
    def unattributed_ps(self) -> float:
        return sum(p.delta_ps for p in self.parts if p.kind is PartKind.UNATTRIBUTED)

    @property
    def named_share(self) -> float | None:
        """Share of the change attributed to named ops or families: 1 - |the rest| / |change|."""
        if not self.total_ps:
            return None
        return 1 - abs(self.total_ps - self.named_ps) / abs(self.total_ps)


@dataclass(frozen=True)
class Diff:
    base_input: str
    new_input: str
    base_run: str
    new_run: str
    options: NoiseOptions
    step_time: Change | None
    breakdown: tuple[NamedChange, ...]  # compute, collectives, infeed/outfeed, host transfers (when any), idle
    collectives: tuple[NamedChange, ...]  # per collective family, sorted by |delta|
    ops: tuple[OpChange, ...]  # matched ops, sorted by |delta|, largest first
    appeared: tuple[OpPresence, ...]  # only in the new run, by time
    disappeared: tuple[OpPresence, ...]  # only in the base run, by time
    findings_rules_run: bool
    findings_appeared: tuple[FindingRef, ...] = ()
    findings_resolved: tuple[FindingRef, ...] = ()
    findings_persisting: tuple[FindingChange, ...] = ()
    warnings: tuple[str, ...] = ()
    attribution: Attribution | None = None  # None when a run has no steps
    per_step: bool = True  # False: op times are totals per core over each capture (a run has no steps)
    base_capture_ps: float = 0.0  # the capture's duration per core (mean over cores of each core's span)
    new_capture_ps: float = 0.0

    @property
    def op_basis(self) -> str:
        """What an op's time is: `per step and core`, or `per core over the capture`."""
        return "per step and core" if self.per_step else "per core over the capture"

    @property
    def significant_ops(self) -> tuple[OpChange, ...]:
        return tuple(o for o in self.ops if o.change.significant)

    @property
    def compiled_changes(self) -> tuple[OpChange, ...]:
        """Matched ops whose padding or spills changed (from compiled programs joined to each run)."""
        return tuple(o for o in self.ops if o.compiled_changed)

    @property
    def has_changes(self) -> bool:
        """Anything beyond noise: step time, breakdown, collectives, ops, or the set of ops or findings."""
        return bool((self.step_time and self.step_time.significant)
                    or any(c.change.significant for c in self.breakdown + self.collectives)
                    or self.significant_ops or self.compiled_changes or self.appeared or self.disappeared
                    or self.findings_appeared or self.findings_resolved)


# ---------------------------------------------------------------------------------------------
# Per-step distributions


def step_stats(values: np.ndarray, centre: str, options: NoiseOptions) -> StepStats:
    """`centre` is "median" or "mean"; empty input gives zeros."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return StepStats(0, 0.0, 0.0, 0.0, 0.0)
    lo, hi = np.quantile(v, options.quantiles)
    c = float(np.median(v)) if centre == "median" else float(v.mean())
    return StepStats(int(v.size), c, float(lo), float(hi), float(hi - lo) / 2)


def compare(base: StepStats, new: StepStats, options: NoiseOptions, min_abs_ps: float = 0.0,
            ci: tuple[float, float] | None = None) -> Change:
    """Compare two distributions against the noise band of the module docstring."""
    delta = new.centre_ps - base.centre_ps
    band = max(options.min_relative * abs(base.centre_ps), base.spread_ps, new.spread_ps, min_abs_ps)
    relative = delta / base.centre_ps if base.centre_ps else None
    significant = abs(delta) > band and (ci is None or ci[0] > 0 or ci[1] < 0)
    return Change(base, new, delta, relative, band, significant, *(ci or (None, None)))


def bootstrap_ci(base: np.ndarray, new: np.ndarray, centre: str, options: NoiseOptions) -> tuple[float, float] | None:
    """Confidence interval of centre(new) - centre(base), resampling each run's steps; None without data."""
    b, n = np.asarray(base, dtype=np.float64), np.asarray(new, dtype=np.float64)
    if options.resamples == 0 or b.size == 0 or n.size == 0:
        return None
    rng = np.random.default_rng(options.seed)
    rb = b[rng.integers(0, b.size, size=(options.resamples, b.size))]
    rn = n[rng.integers(0, n.size, size=(options.resamples, n.size))]
    f = np.median if centre == "median" else np.mean
    d = f(rn, axis=1) - f(rb, axis=1)
    tail = (1 - options.confidence) / 2 * 100
    lo, hi = np.percentile(d, [tail, 100 - tail])
    return float(lo), float(hi)


def compare_steps(base: np.ndarray, new: np.ndarray, centre: str, options: NoiseOptions,
                  min_abs_ps: float = 0.0, lazy_ci: bool = False) -> Change:
    """`compare` of two runs' per-step values, with the bootstrap interval.

    `lazy_ci`: skip the bootstrap when the change is inside the band anyway (the interval is then
    None); used for ops, of which a big program has thousands.
    """
    b, n = step_stats(base, centre, options), step_stats(new, centre, options)
    if lazy_ci and not compare(b, n, options, min_abs_ps).significant:
        return compare(b, n, options, min_abs_ps)
    return compare(b, n, options, min_abs_ps, bootstrap_ci(base, new, centre, options))


def _n_cores(analysis: Analysis) -> int:
    """The cores a per-core time divides by: on a GPU those that ran ops (`Analysis.n_cores_of_ops`)."""
    return analysis.n_cores_of_ops


def _steps(analysis: Analysis) -> np.ndarray:
    return np.sort(analysis.steps["step"].unique()) if not analysis.steps.empty else np.zeros(0, np.int64)


def _per_step_mean_over_cores(analysis: Analysis, column: str) -> np.ndarray:
    s = analysis.steps
    if s.empty:
        return np.zeros(0)
    return s.groupby("step")[column].mean().to_numpy(dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Op identity

_NAME = re.compile(r"%[\w.\-]+")
_DROP = re.compile(r",?\s*(metadata|backend_config|frontend_attributes|statistics)=(\{[^{}]*(\{[^{}]*\}[^{}]*)*\}|\"[^\"]*\")")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")


def hlo_fingerprint(hlo_text: str) -> str:
    """A short hash of the canonical HLO instruction: names, metadata and backend config removed.

    '' for an empty text. Two instructions doing the same thing on the same shapes share it.
    """
    if not hlo_text:
        return ""
    text = _DROP.sub("", hlo_text)
    text = _NAME.sub("%_", text)
    text = " ".join(text.split())
    return _hash(text)


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _array_text(shape) -> str:
    """`bf16[256,512]`: a shape without its layout; tuples as their leaves in parentheses."""
    if shape is None:
        return "?"
    leaves = leaf_arrays(shape)
    arrays = [f"{a.dtype}[{','.join(map(str, a.dims))}]" for a in leaves]
    return arrays[0] if len(arrays) == 1 and not hasattr(shape, "elements") else f"({','.join(arrays)})"


def structure_key(program: CompiledProgram, inst: Instruction) -> str:
    """A hash of what an instruction computes, its names left out: the opcode tree of the computation
    it calls (each instruction's opcode, shape and operands as positions), its operand and output
    shapes, its source line and JAX op name. '' for an instruction the program does not hold whole."""
    parts = [inst.opcode, inst.fusion_kind, inst.custom_call_target, _array_text(inst.shape),
             f"{inst.source_file}:{inst.source_line}", inst.op_name]
    for operand in inst.operands:
        o = program.find(operand)
        parts.append(_array_text(o.shape) if o is not None else "?")
    for called in inst.called_computations:
        if called not in program.computations:
            return ""
        body = program.computation_instructions(called)
        position = {b.name: i for i, b in enumerate(body)}
        for b in body:
            refs = ",".join(str(position.get(o, "?")) for o in b.operands)
            parts.append(f"{b.opcode}({refs}):{_array_text(b.shape)}")
    return _hash("|".join(parts))


def _first_array(shape_text: str) -> str:
    """The first array of a result shape without its layout (`bf16[256,512]`), '' without one."""
    m = _ARRAY.search(shape_text)
    return f"{m.group(1)}[{m.group(2)}]" if m else ""


COMPILED_COLUMNS = ("logical_bytes", "padded_bytes", "spill_stores", "spill_fills")

Programs = Mapping[tuple[int, str], CompiledProgram]  # `JoinResult.programs`


def _op_table(analysis: Analysis, compiled: pd.DataFrame | None = None, programs: Programs | None = None
              ) -> pd.DataFrame:
    """One row per (host, program, op) with module, category, shape, source, fingerprints and compiled facts."""
    ops = analysis.ops[["host", "program_id", "module", "name", "category", "shape_with_layout", "source",
                        "tf_op"]].copy()
    for col in COMPILED_COLUMNS:
        if compiled is not None and col in compiled.columns:
            ops[col] = compiled[col].reindex(ops.index).astype("Float64").to_numpy(dtype=np.float64,
                                                                                      na_value=np.nan)
        else:
            ops[col] = np.nan
    for col in ("host", "module", "name", "category"):
        ops[col] = ops[col].astype(str)
    for col in ("shape_with_layout", "source", "tf_op"):
        ops[col] = ops[col].fillna("").astype(str)
    texts = []
    for host in analysis.profile.hosts:
        md = host.op_metadata
        if md.empty:
            continue
        texts.append(pd.DataFrame({"host": host.host, "program_id": md["program_id"].to_numpy(),
                                   "name": md["name"].astype(str).to_numpy(),
                                   "hlo_text": md["hlo_text"].fillna("").astype(str).to_numpy()}))
    if texts:
        t = pd.concat(texts, ignore_index=True).drop_duplicates(["host", "program_id", "name"])
        ops = ops.merge(t, on=["host", "program_id", "name"], how="left")
    else:
        ops["hlo_text"] = ""
    ops["hlo_text"] = ops["hlo_text"].fillna("")
    ops["fingerprint"] = [hlo_fingerprint(t) for t in ops["hlo_text"]]
    ops["structure"] = _structure_column(ops, programs or {})
    ops["source_key"] = [f"{c}\x00{s}\x00{j}\x00{_first_array(t)}" if s or j else ""
                         for c, s, j, t in zip(ops["category"], ops["source"], ops["tf_op"],
                                               ops["shape_with_layout"])]
    # Joined in Python: pandas adding the scalar "\x00" to a column reads it as a numpy string, which
    # drops trailing NULs, so the separators were lost ("jit_stepfusion.1f32[8]{0}").
    ops["name_key"] = [f"{m}\x00{n}\x00{s}" for m, n, s in zip(ops["module"], ops["name"], ops["shape_with_layout"])]
    return ops


def _structure_column(ops: pd.DataFrame, programs: Programs) -> list[str]:
    keys: dict[tuple[int, str, str], str] = {}
    out = []
    for pid, module, name in zip(ops["program_id"], ops["module"], ops["name"]):
        k = (int(pid), module, name)
        if k not in keys:
            program = programs.get((int(pid), module))
            inst = program.find(name) if program is not None else None
            keys[k] = structure_key(program, inst) if inst is not None else ""
        out.append(keys[k])
    return out


def _per_step_op_times(analysis: Analysis, ops: pd.DataFrame, per_step: bool = True) -> pd.DataFrame:
    """Rows: name_key; columns: the run's steps; values: self time per step and core (ps).

    `per_step` False: one column, `capture`, each op's total self time per core over the capture."""
    sums = analysis.per_step.op_step_sums  # summed over every host's cores
    if per_step:
        steps = _steps(analysis)
        inside = sums[sums["step"] >= 0]
    else:
        steps = np.zeros(1, np.int64)
        inside = sums.assign(step=0)
    if inside.empty or len(steps) == 0:
        return pd.DataFrame(index=pd.Index([], name="name_key"), columns=steps, dtype=np.float64)
    g = pd.DataFrame({"program_id": inside["program_id"].to_numpy(), "name": inside["name"].astype(str).to_numpy(),
                      "step": inside["step"].to_numpy(), "self_ps": inside["self_ps"].to_numpy()})
    # A program's op has one name_key on every host (module, name and shape are the program's).
    keys = ops[["program_id", "name", "name_key"]].drop_duplicates(["program_id", "name"])
    g = g.merge(keys, on=["program_id", "name"], how="inner")
    table = g.pivot_table(index="name_key", columns="step", values="self_ps", aggfunc="sum", fill_value=0)
    table = table.reindex(columns=steps, fill_value=0).astype(np.float64)
    return table / _n_cores(analysis)


def _op_identities(ops: pd.DataFrame) -> pd.DataFrame:
    """Per name_key (ops merged over hosts): module, name, category, shape and the match keys."""
    return ops.groupby("name_key", sort=False).agg(module=("module", "first"), name=("name", "first"),
                                                   category=("category", "first"),
                                                   shape=("shape_with_layout", "first"),
                                                   fingerprint=("fingerprint", "first"),
                                                   structure=("structure", "first"),
                                                   source_key=("source_key", "first"),
                                                   **{c: (c, "first") for c in COMPILED_COLUMNS})


def _facts(ids: pd.DataFrame, key: str, known: bool) -> CompiledFacts | None:
    if not known:
        return None

    def num(col: str) -> int | None:
        v = ids.at[key, col]
        return None if pd.isna(v) else int(v)

    stores, fills = num("spill_stores"), num("spill_fills")
    spills = None if stores is None and fills is None else (stores or 0) + (fills or 0)
    return CompiledFacts(num("logical_bytes"), num("padded_bytes"), spills)


def _match(base_ids: pd.DataFrame, new_ids: pd.DataFrame, base_order: Mapping[str, float] | None = None,
           new_order: Mapping[str, float] | None = None) -> tuple[list[tuple[str, str, str]], set[str], set[str]]:
    """[(base key, new key, matched_by)], unmatched base keys, unmatched new keys (module docstring).

    `*_order`: name_key -> when the op first runs, for pairing equal groups in order."""
    pairs: list[tuple[str, str, str]] = []
    base_left, new_left = set(base_ids.index), set(new_ids.index)
    for key in sorted(base_left & new_left):
        pairs.append((key, key, "name"))
    base_left -= {p[0] for p in pairs}
    new_left -= {p[1] for p in pairs}

    def groups(ids: pd.DataFrame, keys: set[str], column: str) -> dict[tuple[str, str], list[str]]:
        out: dict[tuple[str, str], list[str]] = {}
        for k in sorted(keys):
            v = ids.at[k, column]
            if v:
                out.setdefault((str(ids.at[k, "module"]), str(v)), []).append(k)
        return out

    def order(keys: list[str], when: Mapping[str, float] | None) -> list[str]:
        return sorted(keys, key=lambda k: ((when or {}).get(k, float("inf")), k))

    for column, method in (("fingerprint", "fingerprint"), ("structure", "structure"), ("source_key", "source line")):
        gb, gn = groups(base_ids, base_left, column), groups(new_ids, new_left, column)
        for key in sorted(set(gb) & set(gn)):
            b, n = gb[key], gn[key]
            if len(b) == len(n) == 1:
                found = [(b[0], n[0], method)]
            elif column == "source_key" and len(b) == len(n):
                found = [(x, y, "source line, order") for x, y in zip(order(b, base_order), order(n, new_order))]
            else:
                continue  # ambiguous: several ops compute alike, in different numbers
            pairs += found
            base_left -= {f[0] for f in found}
            new_left -= {f[1] for f in found}
    return pairs, base_left, new_left


def _first_runs(analysis: Analysis, ops: pd.DataFrame) -> dict[str, float]:
    """name_key -> its first start on any core, where the host kept its events; else by op row order."""
    starts: dict[tuple[int, str], float] = {}
    for host in analysis.profile.hosts:
        events = getattr(host, "events", None)
        if events is None or events.empty:
            continue
        first = events.groupby(["program_id", "name"], observed=True)["start_ps"].min()
        for (pid, name), t in first.items():
            k = (int(pid), str(name))
            starts[k] = min(starts.get(k, float("inf")), float(t))
    out: dict[str, float] = {}
    for i, (pid, name, key) in enumerate(zip(ops["program_id"], ops["name"], ops["name_key"])):
        out.setdefault(key, starts.get((int(pid), name), float(i)))
    return out


# ---------------------------------------------------------------------------------------------
# Collective exposure


def _windows(analysis: Analysis) -> dict[str, WindowTime]:
    """Per collective op name (summed over hosts): its windows' span and exposed time."""
    table = analysis.collectives(WindowThresholds()).ops
    out: dict[str, WindowTime] = {}
    for name, span, exposed in zip(table["name"].astype(str), table["span_ps"], table["exposed_ps"]):
        out[name] = out.get(name, WindowTime(0, 0)) + WindowTime(int(span), int(exposed))
    return out


_NO_WINDOW = WindowTime(0, 0)


def _window_of(windows: Mapping[str, WindowTime], name: str) -> WindowTime:
    """An op's windows: its own, or for an async done op its start's (a window is named by its start)."""
    if name in windows:
        return windows[name]
    key = async_pair_key(name)
    if key is not None and async_role(name)[0] == "done":
        for start, w in windows.items():
            if async_pair_key(start) == key:
                return w
    return _NO_WINDOW


# ---------------------------------------------------------------------------------------------
# Findings

_QUOTED = re.compile(r"`[^`]*`")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _ref(f: Finding) -> FindingRef:
    return FindingRef(f.rule, f.code, f.severity.label(), f.host, tuple(f.ops), f.message, f.saving.ps)


def _compare_findings(base: Sequence[Finding], new: Sequence[Finding], options: NoiseOptions, min_abs_ps: float,
                      new_to_base: Mapping[str, str] | None = None):
    """Findings paired through their ops (module docstring): (appeared, resolved, persisting)."""
    rename = new_to_base or {}
    b_refs, n_refs = list(map(_ref, base)), list(map(_ref, new))

    def moved(x: FindingRef, y: FindingRef) -> bool:
        return abs(y.saving_ps - x.saving_ps) > max(options.min_relative * x.saving_ps, min_abs_ps)

    def mapped(f: FindingRef) -> frozenset[str]:
        return frozenset(rename.get(o, o) for o in f.ops)

    def text_key(f: FindingRef) -> str:
        return _NUMBER.sub("#", _QUOTED.sub("``", f.message))

    b_left, n_left = list(range(len(b_refs))), list(range(len(n_refs)))
    persisting: list[tuple[int, FindingChange]] = []

    def pair(i: int, j: int, how: str) -> None:
        b_left.remove(i)
        n_left.remove(j)
        persisting.append((j, FindingChange(b_refs[i], n_refs[j], moved(b_refs[i], n_refs[j]), how)))

    for j in list(n_left):  # the same ops, or the same ops renamed
        n = n_refs[j]
        for i in b_left:
            b = b_refs[i]
            if (b.rule, b.host) == (n.rule, n.host) and b.ops and frozenset(b.ops) == mapped(n):
                pair(i, j, "same ops" if frozenset(b.ops) == frozenset(n.ops) else "renamed ops")
                break
    for j in list(n_left):  # most of their ops, or no ops and the same message
        n = n_refs[j]
        best, best_score = None, 0.5
        for i in b_left:
            b = b_refs[i]
            if (b.rule, b.host) != (n.rule, n.host):
                continue
            if not b.ops and not n.ops:
                if text_key(b) == text_key(n):
                    best, best_score = i, 2.0
                continue
            x, y = frozenset(b.ops), mapped(n)
            score = len(x & y) / len(x | y) if x | y else 0.0
            if score > best_score:
                best, best_score = i, score
        if best is not None:
            pair(best, j, "same message" if best_score == 2.0 else "overlapping ops")
    appeared = tuple(n_refs[j] for j in n_left)
    resolved = tuple(b_refs[i] for i in b_left)
    return appeared, resolved, tuple(c for _, c in sorted(persisting, key=lambda x: x[0]))


# ---------------------------------------------------------------------------------------------
# The diff


def _warnings(base: Analysis, new: Analysis, per_step: bool) -> list[str]:
    out = []
    if not per_step:
        out.append("a run has no steps: op times are each op's total per core over its capture, and the step "
                   "time is not compared")
    for label, a in (("base", base), ("new", new)):
        n = len(_steps(a))
        if 0 < n < MIN_STEPS_FOR_SPREAD:
            out.append(f"{label} run has {n} step{'s' * (n != 1)}: too few to measure noise; only the "
                       "relative floor applies")
        if a.profile.modelled:
            out.append(f"{label} run is modelled (`tpudiag simulate`), not measured")
    bt = sorted({h.device.device_type for h in base.profile.hosts})
    nt = sorted({h.device.device_type for h in new.profile.hosts})
    if bt != nt:
        devices = "GPUs" if Platform.GPU in (base.platform, new.platform) else "chips"
        out.append(f"the {devices} differ: base {', '.join(bt) or '(none)'}; new {', '.join(nt) or '(none)'} "
                   "(device types differ: times compare different hardware)")
    if _n_cores(base) != _n_cores(new):
        out.append(f"core counts differ (base {_n_cores(base)}, new {_n_cores(new)}): op times are per core")
    return out


def _capture_ps(analysis: Analysis) -> float:
    """The capture's duration per core: every core's span, averaged."""
    return sum(analysis.core_time_ps.values()) / _n_cores(analysis)


def _attribution(total_ps: float, op_changes: Sequence[OpChange], appeared: Sequence[tuple[OpPresence, np.ndarray]],
                 gone: Sequence[tuple[OpPresence, np.ndarray]],
                 families: Sequence[tuple[NamedChange, tuple[int, int], Exposure]],
                 idle: Change | None, options: NoiseOptions, min_abs_ps: float, n_new: int, n_base: int,
                 ) -> Attribution:
    """The parts of a step-time change (module docstring); collectives count in their family only."""
    parts: list[Part] = []
    for o in op_changes:
        if not collective_family(o.name, o.category) and not collective_family(o.base_name, o.category):
            parts.append(Part(PartKind.OP, o.name, o.base_name, o.category, o.change.delta_ps, o.change,
                              o.matched_by))
    for kind, rows in ((PartKind.APPEARED, appeared), (PartKind.GONE, gone)):
        for r, values in rows:
            if collective_family(r.name, r.category):
                continue
            zeros = np.zeros(n_base if kind is PartKind.APPEARED else n_new)
            b, n = (zeros, values) if kind is PartKind.APPEARED else (values, zeros)
            ch = compare_steps(b, n, "mean", options, min_abs_ps, lazy_ci=True)
            parts.append(Part(kind, r.name, "" if kind is PartKind.APPEARED else r.name, r.category,
                              ch.delta_ps, ch))
    for fam, n_ops, exposure in families:
        parts.append(Part(PartKind.FAMILY, fam.name, fam.name, "collective", fam.change.delta_ps, fam.change,
                          exposure=exposure, n_ops=n_ops))
    if idle is not None:
        parts.append(Part(PartKind.IDLE, "idle", "idle", "", idle.delta_ps, idle))
    rest = total_ps - sum(p.delta_ps for p in parts)
    parts.append(Part(PartKind.UNATTRIBUTED, "unattributed", "", "", rest, None))
    parts.sort(key=lambda p: (-abs(p.delta_ps), p.kind is PartKind.UNATTRIBUTED, p.name))
    return Attribution(total_ps, tuple(parts))


def diff_analyses(base: Analysis, new: Analysis, base_findings: Sequence[Finding] | None = None,
                  new_findings: Sequence[Finding] | None = None,
                  options: NoiseOptions = NoiseOptions(), base_compiled: pd.DataFrame | None = None,
                  new_compiled: pd.DataFrame | None = None, base_programs: Programs | None = None,
                  new_programs: Programs | None = None) -> Diff:
    """The noise-aware comparison of two analysed captures; findings are compared when both are given.

    `base_compiled`/`new_compiled`: compiled facts per op (`JoinResult.columns` of
    `tpudiag.analysis.join`, indexed like each analysis' ops table), for padding and spill changes.
    `base_programs`/`new_programs`: the compiled programs joined to each run (`JoinResult.programs`),
    for matching ops by the structure of what they compute.
    """
    per_step = len(_steps(base)) > 0 and len(_steps(new)) > 0
    b_times, _ = combined_step_times(base.steps, len(base.profile.hosts))
    n_times, _ = combined_step_times(new.steps, len(new.profile.hosts))
    step_time = None
    if per_step and len(b_times) and len(n_times):
        step_time = compare_steps(b_times, n_times, "median", options)
    base_capture_ps, new_capture_ps = _capture_ps(base), _capture_ps(new)
    base_step_ps = float(np.median(b_times)) if per_step and len(b_times) else base_capture_ps
    min_abs = options.min_step_share * base_step_ps

    breakdown = []
    if per_step:
        host = ((("host transfers", "host_transfer_ps"),)
                if base.steps["host_transfer_ps"].any() or new.steps["host_transfer_ps"].any() else ())
        for label, col in (("compute", "compute_ps"), ("collectives", "collective_ps"), ("infeed/outfeed", "io_ps"),
                           *host, ("idle", "idle_ps")):
            breakdown.append(NamedChange(label, compare_steps(
                _per_step_mean_over_cores(base, col), _per_step_mean_over_cores(new, col), "mean", options, min_abs)))

    b_ops, n_ops = _op_table(base, base_compiled, base_programs), _op_table(new, new_compiled, new_programs)
    b_steps, n_steps = _per_step_op_times(base, b_ops, per_step), _per_step_op_times(new, n_ops, per_step)
    b_ids, n_ids = _op_identities(b_ops), _op_identities(n_ops)
    pairs, only_base, only_new = _match(b_ids, n_ids, _first_runs(base, b_ops), _first_runs(new, n_ops))
    b_win, n_win = _windows(base), _windows(new)

    def values(table: pd.DataFrame, key: str) -> np.ndarray:
        return table.loc[key].to_numpy() if key in table.index else np.zeros(table.shape[1])

    def exposure(b_name: str, n_name: str) -> Exposure | None:
        b, n = _window_of(b_win, b_name), _window_of(n_win, n_name)
        return Exposure(b, n) if b.span_ps or n.span_ps else None

    op_changes = []
    for bk, nk, how in pairs:
        ch = compare_steps(values(b_steps, bk), values(n_steps, nk), "mean", options, min_abs, lazy_ci=True)
        ident = n_ids.loc[nk]
        base_name = str(b_ids.at[bk, "name"])
        op_changes.append(OpChange(str(ident["module"]), str(ident["name"]), base_name,
                                   str(ident["category"]), str(ident["shape"]), how, ch,
                                   _facts(b_ids, bk, base_compiled is not None),
                                   _facts(n_ids, nk, new_compiled is not None),
                                   exposure(base_name, str(ident["name"]))))
    op_changes.sort(key=lambda o: (-abs(o.change.delta_ps), o.name))

    def presence(ids: pd.DataFrame, table: pd.DataFrame, keys: set[str]) -> list[tuple[OpPresence, np.ndarray]]:
        rows = [(OpPresence(str(ids.at[k, "module"]), str(ids.at[k, "name"]), str(ids.at[k, "category"]),
                            str(ids.at[k, "shape"]), float(values(table, k).mean()) if table.shape[1] else 0.0),
                 values(table, k)) for k in keys]
        return sorted(rows, key=lambda r: (-r[0].time_ps, r[0].name))

    appeared, gone = presence(n_ids, n_steps, only_new), presence(b_ids, b_steps, only_base)

    def family_of(ids: pd.DataFrame) -> dict[str, str]:
        return {k: collective_family(str(ids.at[k, "name"]), str(ids.at[k, "category"])) for k in ids.index}

    b_fam_of, n_fam_of = family_of(b_ids), family_of(n_ids)
    families, family_parts = [], []
    for fam in sorted({f for f in (*b_fam_of.values(), *n_fam_of.values()) if f}):
        b_keys = [k for k, f in b_fam_of.items() if f == fam]
        n_keys = [k for k, f in n_fam_of.items() if f == fam]
        bv = sum((values(b_steps, k) for k in b_keys), np.zeros(b_steps.shape[1]))
        nv = sum((values(n_steps, k) for k in n_keys), np.zeros(n_steps.shape[1]))
        named = NamedChange(fam, compare_steps(bv, nv, "mean", options, min_abs))
        families.append(named)
        win_b = sum((b_win.get(str(b_ids.at[k, "name"]), _NO_WINDOW) for k in b_keys), _NO_WINDOW)
        win_n = sum((n_win.get(str(n_ids.at[k, "name"]), _NO_WINDOW) for k in n_keys), _NO_WINDOW)
        family_parts.append((named, (len(b_keys), len(n_keys)), Exposure(win_b, win_n)))
    families.sort(key=lambda c: (-abs(c.change.delta_ps), c.name))

    attribution = None
    if step_time is not None:
        idle = {c.name: c.change for c in breakdown}.get("idle")
        attribution = _attribution(step_time.delta_ps, op_changes, appeared, gone, family_parts, idle, options,
                                   min_abs, n_steps.shape[1], b_steps.shape[1])

    rules_run = base_findings is not None and new_findings is not None
    new_to_base = {o.name: o.base_name for o in op_changes}
    found = (_compare_findings(base_findings or (), new_findings or (), options, min_abs, new_to_base)
             if rules_run else ((), (), ()))
    return Diff(base_input=base.profile.input_path, new_input=new.profile.input_path, base_run=base.profile.run,
                new_run=new.profile.run, options=options, step_time=step_time, breakdown=tuple(breakdown),
                collectives=tuple(families), ops=tuple(op_changes),
                appeared=tuple(r for r, _ in appeared), disappeared=tuple(r for r, _ in gone),
                findings_rules_run=rules_run, findings_appeared=found[0], findings_resolved=found[1],
                findings_persisting=found[2], warnings=tuple(_warnings(base, new, per_step)),
                attribution=attribution, per_step=per_step, base_capture_ps=base_capture_ps,
                new_capture_ps=new_capture_ps)
