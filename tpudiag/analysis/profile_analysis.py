"""One pass over a parsed profile: steps, per-op aggregates and the report's numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tpudiag.analysis.collective_windows import class_counts
from tpudiag.analysis.host_digest import digest_host, fold_step_tables
from tpudiag.analysis.limits import over_peak, over_peak_warnings
from tpudiag.model import schemas
from tpudiag.model.findings import Finding, rank_key
from tpudiag.model.profile import (CollectiveClasses, HostDigest, Platform, Profile, StepKind, StepSource,
                                   StepTables, WindowThresholds)
from tpudiag.model.report import (Breakdown, CategoryTime, CompiledJoin, Distribution, HostSummary, OpRow, Report,
                                  RuleSkip, Summary)

if TYPE_CHECKING:
    from tpudiag.analysis.join import JoinResult


@dataclass
class Analysis:
    """Tables derived from a profile; the input of rules and of the report builder."""

    profile: Profile
    digests: dict[str, HostDigest]  # per host: what its events reduce to (`analysis.host_digest`)
    per_step: StepTables  # every host's per-step tables, folded (max or sum over hosts)
    steps: pd.DataFrame  # schemas.STEPS, every host
    ops: pd.DataFrame  # schemas.OPS, every host
    step_sources: dict[str, StepSource]
    core_time_ps: dict[str, int]  # per host: sum over cores of each core's span
    # Compiled facts per op (`tpudiag.analysis.join`), indexed like `ops`; set by the caller that
    # has the dumps, before the rules run, so rules may read them too. None when not joined.
    join: JoinResult | None = None

    @property
    def platform(self) -> Platform:
        return self.profile.hosts[0].device.platform

    @property
    def n_events(self) -> int:
        return sum(d.n_events for d in self.digests.values())

    def collectives(self, thresholds: WindowThresholds) -> CollectiveClasses:
        """Every host's collective windows, stacked and classed with `thresholds` from the covered
        fractions their digests keep (no events needed). Per step, the exposed time per op on the
        worst core is `per_step.collective_op_steps`, which does not depend on the classes."""
        parts = [d.collectives for d in self.digests.values()]
        return CollectiveClasses(thresholds,
                                 _stacked([p.steps for p in parts], self.digests, schemas.COLLECTIVE_STEPS),
                                 _stacked([class_counts(p, thresholds) for p in parts], self.digests,
                                          schemas.COLLECTIVE_CLASSES))


def _stacked(frames: list[pd.DataFrame], digests: dict[str, HostDigest], schema) -> pd.DataFrame:
    """Per-host tables of one schema stacked, each host's `host` column set to its (final) name:
    hosts renamed after parsing (a duplicate hostname) keep their digest as it was made."""
    return schema.stack(frames, list(digests))


def analyze(profile: Profile, per_step: StepTables | None = None) -> Analysis:
    """The analysis of every host, from their digests (made here for hosts that come without one).

    `per_step` is the fold of the hosts whose per-step tables were folded as they arrived
    (`host_digest.StepFold`); the others fold here.
    """
    digests = {}
    for host in profile.hosts:
        digest = host.digest
        if digest is None:
            digest = host.digest = digest_host(host)
        digests[host.host] = digest
    unfolded = [d.per_step for d in digests.values() if d.per_step is not None]
    if per_step is None and len(unfolded) < len(digests):
        raise ValueError("some hosts' per-step tables were folded elsewhere: pass that fold as `per_step`")
    if unfolded or per_step is None:
        per_step = fold_step_tables(([per_step] if per_step is not None else []) + unfolded)
        for d in digests.values():
            d.per_step = None  # held once, in the fold
    analysis = Analysis(profile, digests, per_step,
                        steps=_stacked([d.steps for d in digests.values()], digests, schemas.STEPS),
                        ops=_stacked([d.ops for d in digests.values()], digests, schemas.OPS),
                        step_sources={h: d.step_source for h, d in digests.items()},
                        core_time_ps={h: d.core_span_ps for h, d in digests.items()})
    if profile.hosts:  # a rate above peak is an artefact: said once, as a warning, never as a finding
        for warning in over_peak_warnings(over_peak(analysis.ops, profile.hosts[0].device, profile.modelled)):
            if warning not in profile.warnings:
                profile.warnings.append(warning)
    return analysis


def _distribution(values: np.ndarray) -> Distribution | None:
    if len(values) == 0:
        return None
    return Distribution(count=len(values), mean_ps=float(values.mean()), p50_ps=float(np.percentile(values, 50)),
                        p90_ps=float(np.percentile(values, 90)), min_ps=int(values.min()), max_ps=int(values.max()))


def _breakdown(steps: pd.DataFrame) -> Breakdown | None:
    if steps.empty:
        return None
    m = steps[["dur_ps", "compute_ps", "collective_ps", "io_ps", "idle_ps"]].mean()
    return Breakdown(step_ps=float(m["dur_ps"]), compute_ps=float(m["compute_ps"]),
                     collective_ps=float(m["collective_ps"]), io_ps=float(m["io_ps"]), idle_ps=float(m["idle_ps"]))


def per_step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Step time per host and step: the slowest core's step (XProf: max over cores)."""
    return steps.groupby(["host", "step"], observed=True)["dur_ps"].max().reset_index()


def combined_step_times(steps: pd.DataFrame, n_hosts: int) -> tuple[np.ndarray, list[str]]:
    """Per step present on every host, the slowest host's step time; warnings when steps differ."""
    warnings: list[str] = []
    per_host = per_step_times(steps)
    if per_host.empty:
        return np.zeros(0, dtype=np.int64), warnings
    counts = per_host.groupby("step")["host"].nunique()
    common = counts[counts == n_hosts].index
    if len(common) < len(counts):
        warnings.append(f"{len(counts) - len(common)} step numbers are missing on some hosts; "
                        "the combined step time uses only the steps every host recorded")
    combined = per_host[per_host["step"].isin(common)].groupby("step")["dur_ps"].max()
    return combined.to_numpy(dtype=np.int64), warnings


def _host_summaries(analysis: Analysis) -> list[HostSummary]:
    out = []
    per_host = per_step_times(analysis.steps)
    for host in analysis.profile.hosts:
        hs = analysis.steps[analysis.steps["host"] == host.host]
        times = per_host.loc[per_host["host"] == host.host, "dur_ps"].to_numpy()
        slowest = ""
        if not hs.empty:
            slowest = str(hs.groupby("device", observed=True)["dur_ps"].mean().idxmax())
        numbers = per_host.loc[per_host["host"] == host.host, "step"].to_numpy()
        out.append(HostSummary(host=host.host, path=host.path, device_type=host.device.device_type,
                               n_chips=host.device.n_chips, n_cores=host.device.n_cores,
                               n_events=analysis.digests[host.host].n_events,
                               step_time=_distribution(times), breakdown=_breakdown(hs), slowest_core=slowest,
                               step_numbers=tuple(int(n) for n in numbers),
                               step_times_ps=tuple(int(t) for t in times)))
    return out


def _op_rows(analysis: Analysis, join: JoinResult | None = None) -> list[OpRow]:
    ops = analysis.ops.sort_values("self_time_ps", ascending=False, kind="stable")
    rows = []
    compiled = _compiled_facts(join, ops.index)
    for r, facts in zip(ops.itertuples(index=False), compiled):
        denom = analysis.core_time_ps.get(r.host, 0)
        rows.append(OpRow(
            host=r.host, program_id=int(r.program_id), program=r.module, name=r.name, category=r.category,
            occurrences=int(r.occurrences), total_time_ps=int(r.total_time_ps), self_time_ps=int(r.self_time_ps),
            time_share=r.self_time_ps / denom if denom else 0.0, flops=float(r.flops),
            bytes_accessed=float(r.bytes_accessed), hbm_bytes=float(r.hbm_bytes), flop_rate=float(r.flop_rate),
            hbm_bw=float(r.hbm_bw), operational_intensity=_finite(r.operational_intensity),
            flop_utilization=_finite(r.flop_utilization), hbm_utilization=_finite(r.hbm_utilization),
            bound_by=r.bound_by, family=r.family, shape_with_layout=r.shape_with_layout, source=r.source,
            tf_op=r.tf_op,
            **facts))
    return rows


_JOINED_FIELDS = ("logical_bytes", "padded_bytes", "spill_stores", "spill_fills", "estimated_cycles")


def _compiled_facts(join: JoinResult | None, index: pd.Index) -> list[dict]:
    """Per op (in `index` order) the OpRow fields the join fills; None where it does not tell."""
    if join is None:
        return [{}] * len(index)
    cols = join.columns.loc[index, list(_JOINED_FIELDS)]
    return [{k: (None if v is pd.NA else int(v)) for k, v in zip(_JOINED_FIELDS, row)}
            for row in cols.itertuples(index=False)]


def _category_times(analysis: Analysis) -> list[CategoryTime]:
    """Self time per HLO category over every host; shares are of the summed core-time of all hosts."""
    ops = analysis.ops
    if ops.empty:
        return []
    denom = sum(analysis.core_time_ps.values())
    cats = ops["category"].astype(str).replace("", "(none)")
    g = ops.assign(category=cats).groupby("category", observed=True).agg(
        n_ops=("name", "size"), self_time_ps=("self_time_ps", "sum"))
    g = g.sort_values("self_time_ps", ascending=False, kind="stable")
    return [CategoryTime(category=str(c), n_ops=int(r.n_ops), self_time_ps=int(r.self_time_ps),
                         time_share=float(r.self_time_ps / denom) if denom else 0.0) for c, r in g.iterrows()]


def _finite(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def build_report(analysis: Analysis, findings: tuple[Finding, ...] = (),
                 rules_skipped: tuple[RuleSkip, ...] = (), dumps: tuple[str, ...] = (),
                 join: JoinResult | None = None, extra_warnings: Sequence[str] = ()) -> Report:
    """The report of an analysis. Its warnings: each host's, the steps', the capture's, then
    `extra_warnings` (what the pipeline adds: the chip's, the dumps'), then the join's."""
    profile = analysis.profile
    join = join if join is not None else analysis.join
    hosts = _host_summaries(analysis)
    first = profile.hosts[0].device
    combined, step_warnings = combined_step_times(analysis.steps, len(profile.hosts))
    means = [h.step_time.mean_ps for h in hosts if h.step_time is not None]
    spread = float(max(means) - min(means)) if len(means) > 1 else 0.0
    slowest = max((h for h in hosts if h.step_time), key=lambda h: h.step_time.mean_ps, default=None)
    sources = {s.kind if s.kind is not StepKind.XLA_MODULES else f"{s.kind} ({s.module})"
               for s in analysis.step_sources.values()}
    warnings: list[str] = []
    for host in profile.hosts:
        prefix = f"{host.host}: " if len(profile.hosts) > 1 else ""
        warnings.extend(prefix + w for w in host.warnings)
    if StepKind.NONE in sources and first.platform is not Platform.CPU:
        warnings.append("no Steps line and no XLA Modules executions: step time is not available")
    if any(s.kind is StepKind.XLA_MODULES for s in analysis.step_sources.values()):
        warnings.append("no Steps line (an inference capture?): each execution of the busiest module counts as a step")
    warnings.extend(step_warnings)
    warnings.extend(profile.warnings)
    warnings.extend(extra_warnings)
    if join is not None:
        warnings.extend(join.warnings)
    device_types = sorted({h.device.device_type for h in profile.hosts})
    if len(device_types) > 1:
        warnings.append(f"hosts report different device types: {', '.join(device_types)}")
    summary = Summary(
        input_path=profile.input_path, run=profile.run, platform=first.platform, device_type=first.device_type,
        generation=first.chip.generation if first.chip else "", hosts=tuple(h.host for h in profile.hosts),
        n_chips=sum(h.device.n_chips for h in profile.hosts), n_cores=sum(h.device.n_cores for h in profile.hosts),
        peak_flops_per_s=first.peak_flops_per_s, hbm_bytes_per_s=first.hbm_bytes_per_s,
        peaks_source=first.peaks_source, step_source=", ".join(sorted(sources)),
        step_time=_distribution(combined), host_spread_ps=spread,
        slowest_host=slowest.host if slowest and len(hosts) > 1 else "", breakdown=_breakdown(analysis.steps),
        modelled=profile.modelled, dumps=dumps,
        compiled=None if join is None else CompiledJoin(
            n_ops=join.n_ops, with_layout=join.hlo_matched, with_llo=join.llo_matched,
            from_dumps=join.dump_matched, sources=join.sources,
            with_cycles=int(join.columns["estimated_cycles"].notna().sum())))
    return Report(summary=summary, hosts=tuple(hosts), ops=tuple(_op_rows(analysis, join)),
                  findings=tuple(sorted(findings, key=rank_key)),
                  rules_skipped=rules_skipped, warnings=tuple(dict.fromkeys(warnings)),
                  failures=tuple(f.message for f in profile.failures),
                  categories=tuple(_category_times(analysis)))
