"""Collective time that no compute on the same core hides.

What it does
------------
Measures, for every async collective window (start to done, from the `Async XLA Ops` line or
from start/done pairs) and every synchronous collective, the time not covered by compute ops on
the same core, and reports it per collective family, per op and per step. Each window is
classified with XProf's thresholds: hidden when at least `hidden_threshold` of it is covered,
exposed when at most `exposed_threshold` is, partial otherwise.

Why it matters
--------------
A TensorCore that waits for a collective does no work: every exposed microsecond is added to the
step. On v4, v5p and v6e XLA leaves collectives synchronous by default, so their whole duration
is exposed; async collectives are exposed when the scheduler finds nothing to run between the
start and the done.

Evidence
--------
Per family and per op: hidden/partial/exposed counts, covered fraction and exposed time per
step; the two worst steps. Windows whose names carry a double numeric suffix
(`all-gather-start.1.0`) are counted: XProf's `analyze_async_overlap` does not recognise them as
async ops and reports them as hidden. With the compiled HLO (`--dumps DIR` of an XLA dump, or
the program a capture embeds), each op also says what the schedule does: "adjacent in the
schedule" (nothing between start and done), "N ops scheduled inside", or "synchronous in the
compiled program".

How to fix
----------
Synchronous all-gathers on v6e: compile with `--xla_tpu_enable_async_collective_fusion=true
--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true
--xla_tpu_enable_async_collective_fusion_multiple_steps=true
--xla_tpu_overlap_compute_collective_tc=true` (in `LIBTPU_INIT_ARGS`) so XLA turns them into
async collective fusions that overlap compute; on v4 and v5p the same flags are worth trying
(verified on v6e only). Entry-level all-reduces and reduce-scatters (`all-reduce-scatter`
fusions) stay synchronous even on v5e, where all-gathers are async by default: make them smaller
(bf16 gradients, fewer larger buckets) or reduce less often (accumulate over microbatches). Exposed
async windows with no compute inside: give the scheduler independent work to place between
start and done (start the collective earlier, prefetch the next layer's weights, split it).

Bad: `all-gather-start.3` immediately followed by `all-gather-done.3`, 1.2 ms per step.
Good: the same all-gather overlapping the previous layer's matmul, 0.05 ms exposed.

Savings estimate
----------------
Measured: per step, the largest exposed time on any core (the step time is the slowest core's),
averaged over steps. An upper bound: hiding a collective can stretch the compute it overlaps
(shared HBM bandwidth), and it overlaps with savings other rules report.

Known limits
------------
Coverage counts compute ops on the same core only (not SparseCore or DMA engines) and excludes
other collectives, unlike XProf, which counts every non-async op. Deliberately unlike XProf's
`analyze_async_overlap`, a container op (`while`, `call`, `conditional`: any op with ops nested
in it) is not compute: its body is. XProf counts the enclosing `while` as covering every window
inside a loop, so a layer loop (`lax.scan`) hides all its collectives there; synchronous
collectives inside a loop are counted here too. The trace alone does not say
why a collective stayed synchronous: without the compiled HLO the advice follows from the op's
name, category and the device generation. Ops are matched to the HLO by instruction name.
Captures without steps count as one step. On a multi-host capture with a straggling host (as
straggler-host finds it, with its default options), the other hosts' extra collective time is
their wait for that host: it is taken out of this rule's saving and left to straggler-host.

Options
-------
- `hidden_threshold` (0.9): covered fraction at or above which a window is hidden.
- `exposed_threshold` (0.1): covered fraction at or below which a window is exposed.
- `min_exposed_fraction` (0.01): report synchronous collectives, or async windows, only when their
  exposed time per step is at least this fraction of the step time.
- `high_share` (0.15): saving, as a fraction of the step, from which a finding is high severity
  (XProf's overview calls a step highly bound from 15 %, moderately from 3 %).
- `medium_share` (0.03): saving fraction from which a finding is medium severity.
- `max_evidence_rows` (5): ops listed as evidence per finding (families and the two worst steps
  are always listed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tpudiag.analysis.host_compare import find_straggler, host_stats
from tpudiag.model.intervals import covered, merge
from tpudiag.model.findings import Evidence, Finding, Saving, Severity
from tpudiag.model.hlo_names import async_role, collective_family, has_double_suffix
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import (Rule, RuleContext, SeverityScale, StepBasis, assign_steps, per_step_worst_core,
                                per_step_worst_core_by, step_basis)
from tpudiag.rules.straggler_host import Options as StragglerOptions

CODE = "TPD101"
NAME = "exposed-collective"

ASYNC_FLAGS = ("--xla_tpu_enable_async_collective_fusion=true "
               "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
               "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
               "--xla_tpu_overlap_compute_collective_tc=true")
SYNC_BY_DEFAULT = ("v4", "v5p", "v6e")  # generations whose collectives XLA leaves synchronous by default


@dataclass(frozen=True)
class Options:
    hidden_threshold: float = 0.9
    exposed_threshold: float = 0.1
    min_exposed_fraction: float = 0.01
    high_share: float = 0.15
    medium_share: float = 0.03
    max_evidence_rows: int = 5

    def __post_init__(self):
        if not 0.0 <= self.exposed_threshold < self.hidden_threshold <= 1.0:
            raise ValueError("thresholds must satisfy 0 <= exposed_threshold < hidden_threshold <= 1, got "
                             f"exposed_threshold={self.exposed_threshold}, hidden_threshold={self.hidden_threshold}")
        if self.max_evidence_rows < 1:
            raise ValueError(f"max_evidence_rows must be at least 1, got {self.max_evidence_rows}")


WINDOW_COLUMNS = ("host", "device", "core", "step", "name", "family", "kind", "start_ps", "span_ps", "covered_ps",
                  "exposed_ps", "overlap_ratio", "klass", "double_suffix", "compute_inside", "source")


def classify(ratio: float, options: Options) -> str:
    if ratio >= options.hidden_threshold:
        return "hidden"
    if ratio <= options.exposed_threshold:
        return "exposed"
    return "partial"


def nesting_facts(device_codes: np.ndarray, start: np.ndarray, depth: np.ndarray,
                  is_coll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event: (has a nested event, lies inside a collective), from the `depth` of nesting.

    Events are walked in (device, start, depth) order, where a parent comes right before its
    first child: an event has a child when the next one on its device is deeper. The parent of
    an event at depth d is the last earlier event at depth d - 1 on its device, found level by
    level with one searchsorted each, so the cost is per level, not per event.
    """
    n = len(start)
    has_child = np.zeros(n, dtype=bool)
    in_coll = np.zeros(n, dtype=bool)
    if n == 0 or depth.max(initial=0) == 0:
        return has_child, in_coll
    order = np.lexsort((depth, start, device_codes))
    dev, dep = device_codes[order], depth[order]
    has_child[order[:-1]] = (dev[:-1] == dev[1:]) & (dep[1:] > dep[:-1])
    # Key = (device, position) in one int64 so a searchsorted stays on the event's own device.
    pos = np.arange(n, dtype=np.int64)
    key = dev.astype(np.int64) * (n + 1) + pos
    coll_or_inside = is_coll[order].copy()  # a collective, or nested in one
    for level in range(1, int(dep.max()) + 1):
        parents = np.flatnonzero(dep == level - 1)
        children = np.flatnonzero(dep == level)
        if not len(parents) or not len(children):
            continue
        at = np.searchsorted(key[parents], key[children], side="right") - 1
        ok = at >= 0
        ok[ok] = dev[parents[at[ok]]] == dev[children[ok]]
        inside = np.zeros(len(children), dtype=bool)
        inside[ok] = coll_or_inside[parents[at[ok]]]
        in_coll[order[children]] = inside
        coll_or_inside[children] |= inside
    return has_child, in_coll


def collective_windows(analysis, options: Options | None = None) -> pd.DataFrame:
    """One row per async collective window and per synchronous collective, with its coverage.

    Columns: `WINDOW_COLUMNS`. `kind` is "async" or "sync"; `klass` hidden/partial/exposed.
    Whole arrays per host; only the interval union and the coverage go device by device.
    """
    options = options or Options()
    frames = []
    for host in analysis.profile.hosts:
        frame = _host_windows(host, analysis.steps, options)
        if frame is not None:
            frames.append(frame)
    if not frames:
        return pd.DataFrame({c: [] for c in WINDOW_COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    return out[list(WINDOW_COLUMNS)].sort_values(["host", "device", "start_ps"], kind="stable").reset_index(drop=True)


def _category_strings(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, category names as an object array) of a categorical column."""
    return column.cat.codes.to_numpy(), np.asarray(column.cat.categories.astype(str), dtype=object)


def _host_windows(host, steps: pd.DataFrame, options: Options) -> pd.DataFrame | None:
    ev = host.events
    if ev.empty:
        return None
    # Per distinct name and category, not per event: traces hold millions of events.
    name_codes, names = _category_strings(ev["name"])
    cat_codes, cats = _category_strings(ev["category"])
    is_async_op = np.array([async_role(n) is not None for n in names], dtype=bool)[name_codes]
    fam_by_name = np.array([collective_family(n) for n in names] or [""], dtype=object)[name_codes]
    # A category names the family when the name does not (e.g. an `all-reduce fusion` named `fusion.12`).
    fam_by_cat = np.array([collective_family("", c) if "fusion" not in c or "all-" in c else ""
                           for c in cats] + [""], dtype=object)[cat_codes]
    fam = np.where(fam_by_name != "", fam_by_name, fam_by_cat)
    is_coll = fam != ""
    start = ev["start_ps"].to_numpy()
    end = start + ev["dur_ps"].to_numpy()
    device_codes, devices = _category_strings(ev["device"])
    cores = ev["core"].to_numpy()
    depth = ev["depth"].to_numpy()
    has_child, in_coll = nesting_facts(device_codes, start, depth, is_coll)
    # A container (`while`, `call`, `conditional`) spans its body: counting it as compute would
    # hide every window inside a loop. Its children are what runs, so only leaves cover.
    compute = ~is_async_op & ~is_coll & ~has_child & ~in_coll
    sync_all = is_coll & ~is_async_op & ~in_coll & ~np.isin(fam, ["send", "recv"])
    windows = host.async_windows
    if len(windows):
        w_dev_codes, w_devices = _category_strings(windows["device"])
        w_name_codes, w_names = _category_strings(windows["name"])
        w_fam_codes, w_fams = _category_strings(windows["family"])
        w_src_codes, w_srcs = _category_strings(windows["source"])
        w_keep = ~np.isin(np.append(w_fams, "nan"), ["copy", "other"])[w_fam_codes]  # code -1 reads "nan"
        w_start, w_end = windows["start_ps"].to_numpy(), windows["end_ps"].to_numpy()
        w_device_index = {d: i for i, d in enumerate(w_devices)}
    cols: dict[str, list] = {k: [] for k in ("name", "family", "kind", "start_ps", "end_ps", "source", "covered",
                                             "compute_inside", "device", "core")}
    for code in np.unique(device_codes):
        if code < 0:
            continue
        device = devices[code]
        on = device_codes == code
        core = int(cores[on][0])
        ms, me = merge(start[on & compute], end[on & compute])
        comp_starts = np.sort(start[on & compute])
        parts = []  # (name, family, kind, start, end, source): async windows first, then sync collectives
        if len(windows):
            wsel = np.flatnonzero((w_dev_codes == w_device_index.get(device, -2)) & w_keep)
            if len(wsel):
                parts.append((np.append(w_names, "nan")[w_name_codes[wsel]], np.append(w_fams, "nan")[w_fam_codes[wsel]],
                              "async", w_start[wsel], w_end[wsel], np.append(w_srcs, "nan")[w_src_codes[wsel]]))
        sync = np.flatnonzero(on & sync_all)
        if len(sync):
            parts.append((names[name_codes[sync]], fam[sync], "sync", start[sync], end[sync], "XLA Ops"))
        if not parts:
            continue
        ws = np.concatenate([p[3] for p in parts])
        we = np.concatenate([p[4] for p in parts])
        keep = we > ws
        ws, we = ws[keep], we[keep]
        n = len(ws)
        for key, i in (("name", 0), ("family", 1), ("kind", 2), ("source", 5)):
            cols[key].append(np.concatenate([np.asarray(p[i], dtype=object) if not isinstance(p[i], str)
                                             else np.full(len(p[3]), p[i], dtype=object) for p in parts])[keep])
        cols["start_ps"].append(ws)
        cols["end_ps"].append(we)
        cols["covered"].append(covered(ws, we, ms, me))
        # Any compute op starting strictly inside the window: none means start and done are adjacent.
        cols["compute_inside"].append((np.searchsorted(comp_starts, we, side="left")
                                       - np.searchsorted(comp_starts, ws, side="right")) > 0)
        cols["device"].append(np.full(n, device, dtype=object))
        cols["core"].append(np.full(n, core, dtype=np.int64))
    if not cols["start_ps"]:
        return None
    ws, we = np.concatenate(cols["start_ps"]), np.concatenate(cols["end_ps"])
    cov = np.concatenate(cols["covered"])
    span = we - ws
    ratio = cov / span
    name = np.concatenate(cols["name"])
    suffix = {n: has_double_suffix(n) for n in pd.unique(name)}
    core = np.concatenate(cols["core"])
    return pd.DataFrame({
        "name": name, "family": np.concatenate(cols["family"]), "kind": np.concatenate(cols["kind"]),
        "start_ps": ws, "end_ps": we, "source": np.concatenate(cols["source"]), "span_ps": span,
        "covered_ps": cov, "exposed_ps": span - cov, "overlap_ratio": ratio,
        "klass": np.select([ratio >= options.hidden_threshold, ratio <= options.exposed_threshold],
                           ["hidden", "exposed"], "partial").astype(object),
        "double_suffix": np.fromiter((suffix[n] for n in name), dtype=bool, count=len(name)),
        "compute_inside": np.concatenate(cols["compute_inside"]),
        "host": host.host, "device": np.concatenate(cols["device"]), "core": core,
        "step": assign_steps(steps, host.host, core, ws),
    })


@dataclass(frozen=True)
class ScheduleFacts:
    """What the compiled program says about collectives, by instruction name."""

    between: dict[str, int]  # async start name -> instructions scheduled between start and done
    synchronous: set[str]  # collectives issued synchronously at entry level
    programs: int

    def reason(self, name: str, kind: str) -> str:
        if kind == "async" and name in self.between:
            n = self.between[name]
            return "adjacent in the schedule" if n == 0 else f"{n} op{'s' * (n != 1)} scheduled inside"
        if kind == "sync" and name in self.synchronous:
            return "synchronous in the compiled program"
        return ""


def compiled_programs(ctx: RuleContext) -> tuple:
    """The compiled HLO programs this rule reads (the one place it reaches compiled inputs)."""
    return ctx.compiled.programs


def schedule_facts(programs) -> ScheduleFacts | None:
    """Facts from compiled programs (`CompiledProgram`s); None without any."""
    if not programs:
        return None
    between: dict[str, int] = {}
    sync: set[str] = set()
    for program in programs:
        for pair in program.async_pairs:
            if pair.kind == "collective":
                between[pair.start] = len(pair.scheduled_between)
        for (computation, name), inst in program.instructions.items():
            if (computation == program.entry and inst.collective_family and not inst.async_role
                    and not inst.is_continuation):
                sync.add(name)
    return ScheduleFacts(between, sync, len(programs))


def _generation(analysis) -> str:
    chip = analysis.profile.hosts[0].device.chip
    return chip.generation if chip else ""


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


REDUCING = ("all-reduce", "reduce-scatter")  # synchronous at entry level even on v5e (async all-gathers)


def _fix(kind: str, families: str, frame: pd.DataFrame, generation: str) -> str:
    if kind == "sync":
        present = set(frame["family"])
        parts = []
        if "all-gather" in present:
            if generation == "v6e":
                parts.append(f"make the all-gathers asynchronous: compile with `{ASYNC_FLAGS}` (in LIBTPU_INIT_ARGS; "
                             "verified to turn v6e all-gathers into async collective fusions)")
            elif generation in SYNC_BY_DEFAULT:
                parts.append(f"XLA leaves all-gathers synchronous on {generation} by default: try `{ASYNC_FLAGS}` "
                             "(verified on v6e only)")
            else:
                parts.append("overlap the all-gathers with independent compute (async collectives or a collective "
                             "matmul)")
        others = sorted(present - {"all-gather", *REDUCING})
        if others:
            parts.append(f"overlap the {' and '.join(f + 's' for f in others)} with independent compute or make them "
                         "smaller")
        reducing = [f for f in REDUCING if f in present]
        if reducing:
            parts.append(f"{' and '.join(f + 's' for f in reducing)} stay synchronous at entry level even on v5e, "
                         "where all-gathers are async: shrink them (bf16 gradients, fewer and larger buckets) or "
                         "reduce less often (accumulate over microbatches)")
        return "; ".join(parts)
    adjacent = int((~frame["compute_inside"] & (frame["klass"] != "hidden")).sum())
    if adjacent:
        return ("no compute is scheduled between start and done in "
                f"{adjacent} window{'s' * (adjacent != 1)}: start the {families} earlier or give the scheduler "
                "independent work to place inside (e.g. prefetch the next layer's weights)")
    return f"start the {families} earlier or split it so more compute overlaps it"


def _evidence(frame: pd.DataFrame, basis: StepBasis, options: Options,
              facts: ScheduleFacts | None) -> tuple[Evidence, ...]:
    rows = []
    fam_labels, fam_exposed = per_step_worst_core_by(frame, "exposed_ps", basis, "family")
    fam_exposed = dict(zip(fam_labels.tolist(), fam_exposed.tolist()))
    for family, g in frame.groupby("family", sort=True):
        counts = g["klass"].value_counts()
        rows.append(Evidence(f"family {family}", (
            ("ops", str(g["name"].nunique())),
            ("hidden/partial/exposed", f"{counts.get('hidden', 0)}/{counts.get('partial', 0)}/"
                                       f"{counts.get('exposed', 0)}"),
            ("exposed/step", fmt_time(fam_exposed[family])))))
    # Every op's exposed time per step in one pass; only the ops shown as evidence are sliced out.
    labels, exposed_by_op = per_step_worst_core_by(frame, "exposed_ps", basis, "name")
    per_op = sorted(zip(exposed_by_op.tolist(), (str(n) for n in labels)), key=lambda t: (-t[0], t[1]))
    names = frame["name"].to_numpy()
    for exposed, name in per_op[:options.max_evidence_rows]:
        g = frame[names == name]
        counts = g["klass"].value_counts()
        values = [("family", str(g["family"].iloc[0])),
                  ("hidden/partial/exposed", f"{counts.get('hidden', 0)}/{counts.get('partial', 0)}/"
                                             f"{counts.get('exposed', 0)}"),
                  ("covered", fmt_pct(float(g["covered_ps"].sum() / g["span_ps"].sum()))),
                  ("exposed/step", fmt_time(exposed))]
        if g["double_suffix"].any():
            values.append(("double suffix", "yes (XProf: hidden)"))
        reason = facts.reason(name, str(g["kind"].iloc[0])) if facts is not None else ""
        if reason:
            values.append(("schedule", reason))
        rows.append(Evidence(name, tuple(values)))
    if not basis.whole_capture:
        inside = frame[frame["step"] >= 0]
        per_step = (inside.groupby(["step", "host", "core"])["exposed_ps"].sum()
                    .groupby(level="step").max().sort_values(ascending=False, kind="stable"))
        for step, ps in per_step.head(2).items():
            rows.append(Evidence(f"step {step}", (("exposed (worst core)", fmt_time(float(ps))),)))
    return tuple(rows)


def straggler_of(analysis):
    """The straggling host, if any, with the collective time the others spend waiting for it."""
    defaults = StragglerOptions()  # the straggler-host rule's default noise band
    return find_straggler(host_stats(analysis), defaults.min_lag_fraction, defaults.noise_sigmas)


def check(ctx: RuleContext, options: Options) -> list[Finding]:
    analysis = ctx.analysis
    windows = collective_windows(analysis, options)
    if windows.empty:
        return []
    basis = step_basis(analysis)
    scale = SeverityScale(options.high_share, options.medium_share)
    generation = _generation(analysis)
    facts = schedule_facts(compiled_programs(ctx))
    hosts = analysis.profile.hosts
    findings = []
    # Other hosts waiting in collectives for a straggler is the straggler's problem (straggler-host).
    straggler = straggler_of(analysis)
    waiting = straggler.others_wait_ps if straggler is not None else 0.0
    for kind in ("sync", "async"):
        g = windows[windows["kind"] == kind]
        if g.empty:
            continue
        exposed = per_step_worst_core(g, "exposed_ps", basis)
        wait_here = min(waiting, exposed)
        waiting -= wait_here
        exposed -= wait_here
        share = exposed / basis.step_ps if basis.step_ps else 0.0
        if exposed <= 0 or share < options.min_exposed_fraction:
            continue
        fam_labels, fam_exposed = per_step_worst_core_by(g, "exposed_ps", basis, "family")
        fams = sorted(zip(fam_exposed.tolist(), (str(f) for f in fam_labels)), key=lambda t: (-t[0], t[1]))
        fams = [(ps, name) for ps, name in fams if ps > 0]
        per = "" if basis.whole_capture else " per step"
        step_text = "the capture" if basis.whole_capture else f"the {fmt_time(basis.step_ps)} step"
        by_family = ", ".join(f"{name} {fmt_time(ps)}" for ps, name in fams)
        families = ", ".join(name for _, name in fams)
        if kind == "sync":
            message = (f"synchronous collectives leave {fmt_time(exposed)}{per} exposed ({fmt_pct(share)} of "
                       f"{step_text}): {by_family}")
            confirmed = sorted(n for n in g["name"].unique() if facts is not None and facts.reason(n, "sync"))
            if confirmed:
                message += (f"; the compiled program issues {_names(confirmed)} synchronously"
                            + (f" (the default on {generation})" if generation in SYNC_BY_DEFAULT else ""))
            elif generation in SYNC_BY_DEFAULT:
                message += f"; XLA leaves collectives synchronous on {generation} by default"
        else:
            counts = g["klass"].value_counts()
            message = (f"async collective windows leave {fmt_time(exposed)}{per} exposed ({fmt_pct(share)} of "
                       f"{step_text}): {by_family}; {len(g)} windows: {counts.get('exposed', 0)} exposed, "
                       f"{counts.get('partial', 0)} partial, {counts.get('hidden', 0)} hidden")
            exposed_names = g.loc[g["klass"] != "hidden", "name"].unique()
            adjacent = sorted(n for n in exposed_names
                              if facts is not None and facts.reason(n, "async") == "adjacent in the schedule")
            if adjacent:
                message += f"; {_names(adjacent)} start and finish with nothing scheduled between"
            doubles = int(g["double_suffix"].sum())
            if doubles:
                message += (f"; {doubles} have double-suffix names that XProf's analyze_async_overlap reports as "
                            "hidden")
        if wait_here > 0:
            message += (f"; {fmt_time(wait_here)} more per step is the other hosts waiting for straggler "
                        f"`{straggler.host}`, left to straggler-host")
        explanation = ("largest exposed collective time on any core per step, averaged over "
                       f"{basis.n_steps} step{'s' * (basis.n_steps != 1)}"
                       + (" (no steps: whole capture)" if basis.whole_capture else ""))
        top_ops = tuple(g.groupby("name")["exposed_ps"].sum().sort_values(ascending=False, kind="stable").head(
            options.max_evidence_rows).index.astype(str))
        findings.append(Finding(
            rule=NAME, code=CODE, severity=scale.of(share, RULE.severity), message=message,
            saving=Saving(int(round(exposed)), "measured", explanation),
            fix=_fix(kind, families, g, generation), evidence=_evidence(g, basis, options, facts),
            host=hosts[0].host if len(hosts) == 1 else "", ops=top_ops))
    return findings


RULE = Rule(code=CODE, name=NAME, severity=Severity.HIGH, inputs=("trace",), options_type=Options, check=check,
            doc=__doc__, uses=("hlo",), tables=("events", "steps", "async_windows"))
