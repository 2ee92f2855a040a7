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

**Matching ops.** By a fingerprint of the canonical HLO text (instruction and operand names,
metadata and backend config removed) when that fingerprint is unique in both runs, so an op
renamed by XLA (`fusion.123` -> `fusion.124`) still matches; otherwise by (module name, op name,
result shape). Program ids are not used: they change with every recompilation.

Findings are matched by (rule, ops cited, host); persisting ones show their saving before and after.
Padding and spills are compared per matched op when compiled programs are joined to both runs
(the HLO a capture embeds, or `--dumps`): padded minus logical bytes, and spill stores + fills.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis, combined_step_times
from tpudiag.model.findings import Finding
from tpudiag.model.hlo_names import collective_family

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


@dataclass(frozen=True)
class OpChange:
    """An op present in both runs."""

    module: str
    name: str  # in the new run
    base_name: str  # differs from `name` when matched by fingerprint across a rename
    category: str
    shape: str
    matched_by: str  # "fingerprint" or "name"
    change: Change  # self time per step and core
    base_compiled: CompiledFacts | None = None  # None: no compiled facts joined in that run
    new_compiled: CompiledFacts | None = None

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
    """A finding present in both runs (same rule, ops and host), with its saving in each."""

    base: FindingRef
    new: FindingRef
    saving_changed: bool = False  # beyond min_relative of the base saving and min_step_share of the step


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
    return max(1, sum(h.device.n_cores for h in analysis.profile.hosts))


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


def hlo_fingerprint(hlo_text: str) -> str:
    """A short hash of the canonical HLO instruction: names, metadata and backend config removed.

    '' for an empty text. Two instructions doing the same thing on the same shapes share it.
    """
    if not hlo_text:
        return ""
    text = _DROP.sub("", hlo_text)
    text = _NAME.sub("%_", text)
    text = " ".join(text.split())
    return hashlib.sha1(text.encode()).hexdigest()[:16]


COMPILED_COLUMNS = ("logical_bytes", "padded_bytes", "spill_stores", "spill_fills")


def _op_table(analysis: Analysis, compiled: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (host, program, op) with module, category, shape, fingerprint and compiled facts."""
    ops = analysis.ops[["host", "program_id", "module", "name", "category", "shape_with_layout"]].copy()
    for col in COMPILED_COLUMNS:
        if compiled is not None and col in compiled.columns:
            ops[col] = compiled[col].reindex(ops.index).astype("Float64").to_numpy(dtype=np.float64,
                                                                                      na_value=np.nan)
        else:
            ops[col] = np.nan
    for col in ("host", "module", "name", "category"):
        ops[col] = ops[col].astype(str)
    ops["shape_with_layout"] = ops["shape_with_layout"].fillna("").astype(str)
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
    ops["name_key"] = ops["module"] + "\x00" + ops["name"] + "\x00" + ops["shape_with_layout"]
    return ops


def _per_step_op_times(analysis: Analysis, ops: pd.DataFrame) -> pd.DataFrame:
    """Rows: name_key; columns: the run's steps; values: self time per step and core (ps)."""
    steps = _steps(analysis)
    sums = analysis.per_step.op_step_sums  # summed over every host's cores
    inside = sums[sums["step"] >= 0]
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
    """Per name_key (ops merged over hosts): module, name, category, shape, fingerprint."""
    first = ops.groupby("name_key", sort=False).agg(module=("module", "first"), name=("name", "first"),
                                                    category=("category", "first"),
                                                    shape=("shape_with_layout", "first"),
                                                    fingerprint=("fingerprint", "first"),
                                                    **{c: (c, "first") for c in COMPILED_COLUMNS})
    return first


def _facts(ids: pd.DataFrame, key: str, known: bool) -> CompiledFacts | None:
    if not known:
        return None

    def num(col: str) -> int | None:
        v = ids.at[key, col]
        return None if pd.isna(v) else int(v)

    stores, fills = num("spill_stores"), num("spill_fills")
    spills = None if stores is None and fills is None else (stores or 0) + (fills or 0)
    return CompiledFacts(num("logical_bytes"), num("padded_bytes"), spills)


def _match(base_ids: pd.DataFrame, new_ids: pd.DataFrame) -> tuple[list[tuple[str, str, str]], set[str], set[str]]:
    """[(base key, new key, matched_by)], unmatched base keys, unmatched new keys."""
    pairs: list[tuple[str, str, str]] = []
    base_left, new_left = set(base_ids.index), set(new_ids.index)
    for key in sorted(base_left & new_left):
        pairs.append((key, key, "name"))
    base_left -= {p[0] for p in pairs}
    new_left -= {p[1] for p in pairs}

    def unique_fp(ids: pd.DataFrame, keys: set[str]) -> dict[str, str]:
        fps = ids["fingerprint"]
        counts = fps[fps != ""].value_counts()
        return {fps[k]: k for k in keys if fps[k] and counts.get(fps[k], 0) == 1}

    by_fp_base, by_fp_new = unique_fp(base_ids, base_left), unique_fp(new_ids, new_left)
    for fp in sorted(set(by_fp_base) & set(by_fp_new)):
        b, n = by_fp_base[fp], by_fp_new[fp]
        if base_ids.at[b, "module"] == new_ids.at[n, "module"]:
            pairs.append((b, n, "fingerprint"))
            base_left.discard(b)
            new_left.discard(n)
    return pairs, base_left, new_left


# ---------------------------------------------------------------------------------------------
# Findings


def _ref(f: Finding) -> FindingRef:
    return FindingRef(f.rule, f.code, f.severity.label(), f.host, tuple(f.ops), f.message, f.saving.ps)


def _finding_key(f: FindingRef) -> tuple:
    return (f.rule, f.host, tuple(sorted(f.ops)))


def _compare_findings(base: Sequence[Finding], new: Sequence[Finding], options: NoiseOptions, min_abs_ps: float):
    b = {_finding_key(r): r for r in map(_ref, base)}
    n = {_finding_key(r): r for r in map(_ref, new)}
    appeared = tuple(n[k] for k in n if k not in b)
    resolved = tuple(b[k] for k in b if k not in n)

    def moved(x: FindingRef, y: FindingRef) -> bool:
        return abs(y.saving_ps - x.saving_ps) > max(options.min_relative * x.saving_ps, min_abs_ps)

    persisting = tuple(FindingChange(b[k], n[k], moved(b[k], n[k])) for k in n if k in b)
    return appeared, resolved, persisting


# ---------------------------------------------------------------------------------------------
# The diff


def _family_times(ops: pd.DataFrame, per_step: pd.DataFrame) -> dict[str, np.ndarray]:
    ids = _op_identities(ops)
    fam = {k: collective_family(ids.at[k, "name"], ids.at[k, "category"]) for k in ids.index}
    out: dict[str, np.ndarray] = {}
    for key, row in per_step.iterrows():
        f = fam.get(key, "")
        if f:
            out[f] = out.get(f, 0) + row.to_numpy()
    return out


def _warnings(base: Analysis, new: Analysis) -> list[str]:
    out = []
    for label, a in (("base", base), ("new", new)):
        n = len(_steps(a))
        if n == 0:
            out.append(f"{label} run has no steps: only the op sets and findings are compared")
        elif n < MIN_STEPS_FOR_SPREAD:
            out.append(f"{label} run has {n} step{'s' * (n != 1)}: too few to measure noise; only the "
                       "relative floor applies")
        if a.profile.modelled:
            out.append(f"{label} run is modelled (`tpudiag simulate`), not measured")
    bt = sorted({h.device.device_type for h in base.profile.hosts})
    nt = sorted({h.device.device_type for h in new.profile.hosts})
    if bt != nt:
        out.append(f"the chips differ: base {', '.join(bt) or '(none)'}; new {', '.join(nt) or '(none)'} "
                   "(device types differ: times compare different hardware)")
    if _n_cores(base) != _n_cores(new):
        out.append(f"core counts differ (base {_n_cores(base)}, new {_n_cores(new)}): op times are per core")
    return out


def diff_analyses(base: Analysis, new: Analysis, base_findings: Sequence[Finding] | None = None,
                  new_findings: Sequence[Finding] | None = None,
                  options: NoiseOptions = NoiseOptions(), base_compiled: pd.DataFrame | None = None,
                  new_compiled: pd.DataFrame | None = None) -> Diff:
    """The noise-aware comparison of two analysed captures; findings are compared when both are given.

    `base_compiled`/`new_compiled`: compiled facts per op (`JoinResult.columns` of
    `tpudiag.analysis.join`, indexed like each analysis' ops table), for padding and spill changes.
    """
    b_times, _ = combined_step_times(base.steps, len(base.profile.hosts))
    n_times, _ = combined_step_times(new.steps, len(new.profile.hosts))
    step_time = None
    if len(b_times) and len(n_times):
        step_time = compare_steps(b_times, n_times, "median", options)
    base_step_ps = float(np.median(b_times)) if len(b_times) else 0.0
    min_abs = options.min_step_share * base_step_ps

    breakdown = []
    if not base.steps.empty and not new.steps.empty:
        host = ((("host transfers", "host_transfer_ps"),)
                if base.steps["host_transfer_ps"].any() or new.steps["host_transfer_ps"].any() else ())
        for label, col in (("compute", "compute_ps"), ("collectives", "collective_ps"), ("infeed/outfeed", "io_ps"),
                           *host, ("idle", "idle_ps")):
            breakdown.append(NamedChange(label, compare_steps(
                _per_step_mean_over_cores(base, col), _per_step_mean_over_cores(new, col), "mean", options, min_abs)))

    b_ops, n_ops = _op_table(base, base_compiled), _op_table(new, new_compiled)
    b_steps, n_steps = _per_step_op_times(base, b_ops), _per_step_op_times(new, n_ops)
    b_ids, n_ids = _op_identities(b_ops), _op_identities(n_ops)
    pairs, only_base, only_new = _match(b_ids, n_ids)

    def values(table: pd.DataFrame, key: str) -> np.ndarray:
        return table.loc[key].to_numpy() if key in table.index else np.zeros(table.shape[1])

    op_changes = []
    for bk, nk, how in pairs:
        ch = compare_steps(values(b_steps, bk), values(n_steps, nk), "mean", options, min_abs, lazy_ci=True)
        ident = n_ids.loc[nk]
        op_changes.append(OpChange(str(ident["module"]), str(ident["name"]), str(b_ids.at[bk, "name"]),
                                   str(ident["category"]), str(ident["shape"]), how, ch,
                                   _facts(b_ids, bk, base_compiled is not None),
                                   _facts(n_ids, nk, new_compiled is not None)))
    op_changes.sort(key=lambda o: (-abs(o.change.delta_ps), o.name))

    def presence(ids: pd.DataFrame, table: pd.DataFrame, keys: set[str]) -> tuple[OpPresence, ...]:
        rows = [OpPresence(str(ids.at[k, "module"]), str(ids.at[k, "name"]), str(ids.at[k, "category"]),
                           str(ids.at[k, "shape"]), float(values(table, k).mean()) if table.shape[1] else 0.0)
                for k in keys]
        return tuple(sorted(rows, key=lambda r: (-r.time_ps, r.name)))

    b_fam, n_fam = _family_times(b_ops, b_steps), _family_times(n_ops, n_steps)
    families = []
    for fam in sorted(set(b_fam) | set(n_fam)):
        bv = b_fam.get(fam, np.zeros(b_steps.shape[1]))
        nv = n_fam.get(fam, np.zeros(n_steps.shape[1]))
        families.append(NamedChange(fam, compare_steps(bv, nv, "mean", options, min_abs)))
    families.sort(key=lambda c: (-abs(c.change.delta_ps), c.name))

    rules_run = base_findings is not None and new_findings is not None
    appeared, resolved, persisting = (_compare_findings(base_findings or (), new_findings or (), options, min_abs)
                                      if rules_run else ((), (), ()))
    return Diff(base_input=base.profile.input_path, new_input=new.profile.input_path, base_run=base.profile.run,
                new_run=new.profile.run, options=options, step_time=step_time, breakdown=tuple(breakdown),
                collectives=tuple(families), ops=tuple(op_changes),
                appeared=presence(n_ids, n_steps, only_new), disappeared=presence(b_ids, b_steps, only_base),
                findings_rules_run=rules_run, findings_appeared=appeared, findings_resolved=resolved,
                findings_persisting=persisting, warnings=tuple(_warnings(base, new)))
