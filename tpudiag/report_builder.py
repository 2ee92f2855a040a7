"""The `Report` of a diagnosis, built once from what the stages made: every renderer reads it.

`build_report` turns an analysis, the rules' findings and skips, and the compiled join into the
report's summary, host and op rows; `dump_only_report` is the report of compiler dumps no timeline
could be modelled from. Both gather the warnings in one place, `_warnings`, in one order, so every
command shows the same ones for the same input. Findings keep the order they come in: the rule
engine ranks them once (`model.findings.rank_key`, `rules.run_rules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tpudiag.analysis.core_balance import core_work, slowest_core
from tpudiag.analysis.host_transfers import transfer_rates
from tpudiag.analysis.limits import over_peak_warnings
from tpudiag.analysis.op_bytes import COLUMNS as BYTE_COLUMNS
from tpudiag.analysis.idle import idle_tables
from tpudiag.analysis.profile_analysis import Analysis, combined_step_times, mean_breakdown, per_step_times
from tpudiag.analysis.programs import program_times
from tpudiag.model.findings import Finding
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.profile import PeaksSource, Platform, StepKind
from tpudiag.model.report import (CategoryTime, CompiledJoin, Distribution, HostSummary, Mode, OpRow,
                                  OpRows, Report, RuleSkip, Summary)

if TYPE_CHECKING:
    from tpudiag.analysis.join import JoinResult


def build_report(analysis: Analysis, findings: Sequence[Finding] = (),
                 rules_skipped: tuple[RuleSkip, ...] = (), dumps: tuple[str, ...] = (),
                 join: JoinResult | None = None, extra_warnings: Sequence[str] = (),
                 config_warnings: Sequence[str] = (), mode: Mode = Mode.TRACE) -> Report:
    """The report of an analysis, its findings in the order given; `mode` is `Mode.STATIC` for a
    compiler dump's modelled timeline. Its warnings (`_warnings`): `config_warnings` (a skipped
    config file), the capture's, `extra_warnings` (what the pipeline adds: the chip's, the dumps',
    the static report's), then the join's."""
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
    summary = Summary(
        input_path=profile.input_path, run=profile.run, platform=first.platform, device_type=first.device_type,
        generation=first.chip.generation if first.chip else "", hosts=tuple(h.host for h in profile.hosts),
        n_chips=sum(h.device.n_chips for h in profile.hosts), n_cores=sum(h.device.n_cores for h in profile.hosts),
        n_cores_with_ops=analysis.n_cores_with_ops,
        gpu_peaks_source=first.gpu.peaks_source() if first.gpu is not None else "",
        peak_flops_per_s=first.peak_flops_per_s, hbm_bytes_per_s=first.hbm_bytes_per_s,
        peaks_source=first.peaks_source, step_source=", ".join(sorted(sources)),
        step_time=_distribution(combined), host_spread_ps=spread,
        slowest_host=slowest.host if slowest and len(hosts) > 1 else "", breakdown=mean_breakdown(analysis.steps),
        step_program=", ".join(sorted({s.module for s in analysis.step_sources.values()
                                       if s.kind is StepKind.XLA_MODULES})),
        modelled=profile.modelled, dumps=dumps, mode=mode,
        host_transfers=transfer_rates(analysis.host_transfers, analysis.steps,
                                      first.chip.host_link_bytes_per_s if first.chip else None),
        compiled=None if join is None else CompiledJoin(
            n_ops=join.n_ops, with_layout=join.hlo_matched, with_llo=join.llo_matched,
            from_dumps=join.dump_matched, sources=join.sources,
            with_cycles=int(join.columns["estimated_cycles"].notna().sum())),
        busy_share=_busy_share(analysis), vmem=first.vmem)
    steps = {h.host: h.step_time.mean_ps for h in hosts if h.step_time is not None}
    return Report(summary=summary, hosts=tuple(hosts), ops=_op_rows(analysis, join, steps),
                  findings=tuple(findings), rules_skipped=rules_skipped,
                  warnings=_warnings(config_warnings, analysis, step_warnings, extra_warnings, join),
                  failures=tuple(f.text() for f in profile.failures),
                  categories=tuple(_category_times(analysis)),
                  programs=program_times(profile.hosts, analysis.step_sources.values()))


def _busy_share(analysis: Analysis) -> float | None:
    """For a capture without steps: Σ over cores of the time some top-level op runs / Σ their spans."""
    if not analysis.steps.empty:
        return None
    tables = idle_tables(analysis.digests)
    period = float(tables.steps["period_ps"].sum()) if tables.whole_capture else 0.0
    if period <= 0:
        return None
    return 1.0 - float(tables.steps["idle_ps"].sum()) / period


def dump_only_report(path: Path, compiled: CompiledInputs, findings: Sequence[Finding],
                     skipped: Sequence[RuleSkip], warnings: Sequence[str],
                     config_warnings: Sequence[str] = ()) -> Report:
    """The report of dumps no timeline could be modelled from: findings and warnings, no ops."""
    summary = Summary(
        input_path=str(path), run="", platform=Platform.TPU, device_type="", generation="", hosts=(), n_chips=0,
        n_cores=0, peak_flops_per_s=None, hbm_bytes_per_s=None, peaks_source=PeaksSource.NONE, step_source="none",
        step_time=None, host_spread_ps=0.0, slowest_host="", breakdown=None, modelled=True,
        dumps=compiled.labels, mode=Mode.STATIC)
    return Report(summary=summary, hosts=(), ops=(), findings=tuple(findings), rules_skipped=tuple(skipped),
                  warnings=_warnings(config_warnings, None, (), warnings, None))


def _warnings(config: Sequence[str], analysis: Analysis | None, steps: Sequence[str], extra: Sequence[str],
              join: JoinResult | None) -> tuple[str, ...]:
    """Every warning of a report, once each, in one order: the rule configuration's; each host's
    (prefixed with its name when there are several), the steps' (`steps`: steps missing on some
    hosts) and the capture's, with rates above the chip's peak (an artefact: said as a warning,
    never as a finding); then `extra`, the join's, and hosts of different device types."""
    out = list(config)
    profile = analysis.profile if analysis is not None else None
    if profile is not None:
        first = profile.hosts[0].device
        for host in profile.hosts:
            prefix = f"{host.host}: " if len(profile.hosts) > 1 else ""
            out.extend(prefix + w for w in host.warnings)
        kinds = {s.kind for s in analysis.step_sources.values()}
        if StepKind.NONE in kinds and first.platform is not Platform.CPU:
            out.append("no Steps line and no XLA Modules executions: step time is not available")
        if StepKind.XLA_MODULES in kinds:
            out.append("no Steps line (an inference capture?): each execution of the program that repeats and holds "
                       "the most device time counts as a step; the other programs are listed beside it")
        for host, source in analysis.step_sources.items():
            if source.left_out:
                prefix = f"{host}: " if len(profile.hosts) > 1 else ""
                out.append(f"{prefix}{source.left_out} executions of `{source.module}` are not steps: they ran on "
                           "some of its cores only (a step counts when every core that runs the program ran it)")
        out.extend(steps)
        out.extend(profile.warnings)
        out.extend(over_peak_warnings(analysis.over_peak))
    out.extend(extra)
    if join is not None:
        out.extend(join.warnings)
    if profile is not None:
        device_types = sorted({h.device.device_type for h in profile.hosts})
        if len(device_types) > 1:
            out.append(f"hosts report different device types: {', '.join(device_types)}")
    return tuple(dict.fromkeys(out))


def _distribution(values: np.ndarray) -> Distribution | None:
    if len(values) == 0:
        return None
    return Distribution(count=len(values), mean_ps=float(values.mean()), p50_ps=float(np.percentile(values, 50)),
                        p90_ps=float(np.percentile(values, 90)), min_ps=int(values.min()), max_ps=int(values.max()))


def _host_summaries(analysis: Analysis) -> list[HostSummary]:
    out = []
    per_host = per_step_times(analysis.steps)
    for host in analysis.profile.hosts:
        hs = analysis.steps[analysis.steps["host"] == host.host]
        times = per_host.loc[per_host["host"] == host.host, "dur_ps"].to_numpy()
        slowest_work = slowest_core(core_work(hs))
        slowest = slowest_work.device if slowest_work is not None else ""
        numbers = per_host.loc[per_host["host"] == host.host, "step"].to_numpy()
        out.append(HostSummary(host=host.host, path=host.path, device_type=host.device.device_type,
                               n_chips=host.device.n_chips, n_cores=host.device.n_cores,
                               n_events=analysis.digests[host.host].n_events,
                               step_time=_distribution(times), breakdown=mean_breakdown(hs), slowest_core=slowest,
                               step_numbers=tuple(int(n) for n in numbers),
                               step_times_ps=tuple(int(t) for t in times)))
    return out


def _op_rows(analysis: Analysis, join: JoinResult | None = None,
             step_ps: dict[str, float] | None = None) -> OpRows:
    """One row per op, by self time; `step_ps`: each host's mean step, for the per-step figure.
    The rows are made from `analysis.ops` when read (`OpRows`), so the report holds no copy of them."""
    step_ps = dict(step_ps or {})
    step_programs = {host: (s.program_id, s.module) for host, s in analysis.step_sources.items()
                     if s.kind is StepKind.XLA_MODULES}
    core_time_ps = dict(analysis.core_time_ps)
    ops = analysis.ops
    # The positions in self-time order (descending; ties keep their order), not a sorted copy.
    order = np.argsort(-ops["self_time_ps"].to_numpy(dtype=np.int64), kind="stable")

    def make(start: int, stop: int) -> list[OpRow]:
        block = ops.iloc[order[start:stop]]
        return [_op_row(r, core_time_ps, step_ps, step_programs.get(r.host), facts)
                for r, facts in zip(block.itertuples(index=False), _compiled_facts(join, block.index))]

    return OpRows(len(ops), make)


def _op_row(r, core_time_ps: dict[str, int], step_ps: dict[str, float], step_program: tuple[int, str] | None,
            facts: dict) -> OpRow:
    """The report's row of one op (a row of `analysis.ops`); `step_program`: the (id, module) whose
    executions are its host's steps, where no Steps line gave them."""
    denom = core_time_ps.get(r.host, 0)
    share = r.self_time_ps / denom if denom else 0.0
    outside = step_program is not None and (int(r.program_id), str(r.module)) != step_program
    step = None if outside else step_ps.get(r.host)
    return OpRow(
        host=r.host, program_id=int(r.program_id), program=r.module, name=r.name, category=r.category,
        occurrences=int(r.occurrences), total_time_ps=int(r.total_time_ps), self_time_ps=int(r.self_time_ps),
        time_share=share, flops=float(r.flops),
        bytes_accessed=float(r.bytes_accessed), hbm_bytes=float(r.hbm_bytes), flop_rate=_finite(r.flop_rate),
        hbm_bw=_finite(r.hbm_bw), operational_intensity=_finite(r.operational_intensity),
        flop_utilization=_finite(r.flop_utilization), hbm_utilization=_finite(r.hbm_utilization),
        bound_by=r.bound_by, family=r.family, shape_with_layout=r.shape_with_layout, source=r.source,
        tf_op=r.tf_op, group_size=int(r.group_size), group_source=str(r.group_source),
        ici_bytes=float(r.ici_bytes), ici_bw=_finite(r.ici_bw), ici_utilization=_finite(r.ici_utilization),
        ici_latency_bound=bool(r.ici_latency_bound),
        step_self_time_ps=share * step if step else None, outside_steps=outside,
        **{c: float(getattr(r, c)) for c in BYTE_COLUMNS}, moves=str(r.moves),
        hbm_intensity=_finite(r.hbm_intensity), vmem_utilization=_finite(r.vmem_utilization),
        vmem_intensity=_finite(r.vmem_intensity), bound_basis=str(r.bound_basis), **facts)


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
