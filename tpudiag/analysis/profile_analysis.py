"""One pass over a parsed profile: the hosts' digests stacked into steps, per-op aggregates and
per-step tables (`Analysis`), and the step times the report and the rules share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tpudiag.analysis.collective_windows import class_counts
from tpudiag.analysis.host_digest import digest_host, fold_step_tables
from tpudiag.analysis.limits import OverPeak, over_peak
from tpudiag.model import schemas
from tpudiag.model.profile import (CollectiveClasses, HostDigest, Platform, Profile, StepSource, StepTables,
                                   WindowThresholds)
from tpudiag.model.report import Breakdown

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
    host_transfers: pd.DataFrame  # schemas.HOST_TRANSFERS, every host (`analysis.host_transfers`)
    # The ops whose rates the ops table nulled as above their core's peak (`analysis.limits`), read
    # once here: the report warns about them, and no rule states a rate or a saving for them.
    over_peak: tuple[OverPeak, ...] = ()
    # Compiled facts per op (`tpudiag.analysis.join`), indexed like `ops`; set by the caller that
    # has the dumps, before the rules run, so rules may read them too. None when not joined.
    join: JoinResult | None = None

    @property
    def platform(self) -> Platform:
        return self.profile.hosts[0].device.platform

    @property
    def over_peak_names(self) -> frozenset[str]:
        """Names of the ops no rule may state a rate for (`over_peak`)."""
        return frozenset(o.op for o in self.over_peak)

    @property
    def n_events(self) -> int:
        return sum(d.n_events for d in self.digests.values())

    @property
    def n_cores_with_ops(self) -> int:
        """Cores (GPUs) that ran at least one op, over hosts: on a GPU capture planes without events
        are common (te-fused-attn: 1 of 8), and a mean over cores must not count them."""
        return sum(int(d.op_cores[["device", "core"]].drop_duplicates().shape[0]) for d in self.digests.values())

    @property
    def n_cores_of_ops(self) -> int:
        """The cores a per-core mean divides by: those that ran ops (all of them, on a TPU), at least 1."""
        active = self.n_cores_with_ops
        return (active if self.platform is Platform.GPU and active else
                sum(h.device.n_cores for h in self.profile.hosts)) or 1

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
    (`host_digest.StepFold`); the others fold here. The fold is kept on the profile
    (`Profile.step_fold`), so analysing the same profile again needs no `per_step`.
    """
    digests = {}
    for host in profile.hosts:
        digest = host.digest
        if digest is None:
            digest = host.digest = digest_host(host)
        digests[host.host] = digest
    unfolded = [d.per_step for d in digests.values() if d.per_step is not None]
    if per_step is None and len(unfolded) < len(digests):
        per_step = profile.step_fold  # an earlier `analyze` of this profile folded them
        if per_step is None:
            raise ValueError("some hosts' per-step tables were folded elsewhere: pass that fold as `per_step`")
    if unfolded or per_step is None:
        per_step = fold_step_tables(([per_step] if per_step is not None else []) + unfolded)
        for d in digests.values():
            d.per_step = None  # held once, in the fold
    profile.step_fold = per_step
    ops = _stacked([d.ops for d in digests.values()], digests, schemas.OPS)
    return Analysis(profile, digests, per_step,
                    steps=_stacked([d.steps for d in digests.values()], digests, schemas.STEPS),
                    ops=ops,
                    step_sources={h: d.step_source for h, d in digests.items()},
                    core_time_ps={h: d.core_span_ps for h, d in digests.items()},
                    host_transfers=_stacked([d.host_transfers for d in digests.values()], digests,
                                            schemas.HOST_TRANSFERS),
                    over_peak=over_peak(ops, {h.host: h.device for h in profile.hosts}, profile.modelled))


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


def mean_breakdown(steps: pd.DataFrame) -> Breakdown | None:
    """The step breakdown, mean per step and core (`Breakdown`); None without steps. Its step is the
    mean core's, which the step time (the slowest core's per step) exceeds when cores differ."""
    if steps.empty:
        return None
    m = steps[["dur_ps", "compute_ps", "collective_ps", "io_ps", "host_transfer_ps", "idle_ps"]].mean()
    return Breakdown(step_ps=float(m["dur_ps"]), compute_ps=float(m["compute_ps"]),
                     collective_ps=float(m["collective_ps"]), io_ps=float(m["io_ps"]), idle_ps=float(m["idle_ps"]),
                     host_transfer_ps=float(m["host_transfer_ps"]))
