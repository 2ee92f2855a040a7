"""Collective windows per core: how much of each async window and synchronous collective compute hides.

Every async collective window (start to done, from the `Async XLA Ops` line or from start/done
pairs) and every synchronous collective is measured against the union of compute ops on the same
core. A container op (`while`, `call`, `conditional`: any op with ops nested in it) is not
compute; its body is, so a layer loop does not hide the collectives inside it. Collectives, and
ops nested inside a collective, are not compute either. On a GPU the core is the GPU, all its
streams together, and a collective is the library's kernel (NCCL, RCCL): its own span is its window,
async (an XLA `*-start` op, on a stream of its own) or not, covered by compute kernels on the others.

`collective_windows` gives one row per window (it needs the host's events);
`summarize_windows` folds one host's rows into what its digest keeps (a `CollectiveDigest` and a
per-step table). The digest applies no thresholds: it keeps each window's covered fraction, and
`class_counts` classes them with whatever thresholds the exposed-collective rule asks, on the
driver, long after the events are gone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.model import schemas
from tpudiag.model.grouping import dense_unique, group_sums, heads, reordering, sorted_groups, sums_by_group
from tpudiag.model.hlo_names import async_role, event_families, has_double_suffix, library_collective
from tpudiag.model.intervals import covered, merge
from tpudiag.model.profile import CollectiveDigest, HostTrace, Platform, WindowThresholds
from tpudiag.parsers import event_wire

GPU_KERNEL_SOURCE = "kernel"  # a GPU collective's window: its kernel, on whichever stream ran it
WINDOW_COLUMNS = ("host", "device", "core", "step", "name", "family", "kind", "start_ps", "span_ps", "covered_ps",
                  "exposed_ps", "overlap_ratio", "klass", "double_suffix", "compute_inside", "source")


def classify(ratio, thresholds: WindowThresholds) -> np.ndarray:
    """"hidden", "partial" or "exposed" per covered fraction (an array, or one value): hidden at or
    above `thresholds.hidden`, exposed at or below `thresholds.exposed`."""
    ratio = np.asarray(ratio)
    return np.select([ratio >= thresholds.hidden, ratio <= thresholds.exposed], ["hidden", "exposed"],
                     "partial").astype(object)


def nesting_facts(device_codes: np.ndarray, start: np.ndarray, depth: np.ndarray,
                  is_coll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event: (has a nested event, lies inside a collective), from the `depth` of nesting.

    Events are walked in (device, start, depth) order, where a parent comes right before its
    first child: an event has a child when the next one on its device is deeper. The parent of
    an event at depth d is the last earlier event at depth d - 1 on its device. The compiled
    reader walks the events once in that order (`event_wire.nesting`); without it the parents are
    found level by level with one running maximum each, so the cost is per level, not per event.
    """
    n = len(start)
    has_child = np.zeros(n, dtype=bool)
    in_coll = np.zeros(n, dtype=bool)
    if n == 0 or depth.max(initial=0) == 0:
        return has_child, in_coll
    order = reordering((depth, start, device_codes))  # None: already in that order, as events mostly are
    walked = event_wire.nesting(device_codes, depth, is_coll, order)  # the same, in one compiled walk
    if walked is not None:
        return walked
    dev, dep = (device_codes, depth) if order is None else (device_codes[order], depth[order])
    child_next = (dev[:-1] == dev[1:]) & (dep[1:] > dep[:-1])
    if order is None:
        has_child[:-1] = child_next
    else:
        has_child[order[:-1]] = child_next
    pos = np.arange(n, dtype=np.int64)
    coll_or_inside = is_coll.copy() if order is None else is_coll[order]  # a collective, or nested in one
    for level in range(1, int(dep.max()) + 1):
        children = np.flatnonzero(dep == level)
        if not len(children):
            continue
        # The last event at depth level - 1 before each position (-1: none), one running maximum;
        # it is the parent when it is on the child's own device.
        at = np.maximum.accumulate(np.where(dep == level - 1, pos, -1))[children]
        ok = at >= 0
        ok[ok] = dev[at[ok]] == dev[children[ok]]
        inside = np.zeros(len(children), dtype=bool)
        inside[ok] = coll_or_inside[at[ok]]
        in_coll[children if order is None else order[children]] = inside
        coll_or_inside[children] |= inside
    return has_child, in_coll


def collective_windows(analysis, thresholds: WindowThresholds | None = None) -> pd.DataFrame:
    """One row per async collective window and per synchronous collective, with its coverage.

    Columns: `WINDOW_COLUMNS`. `kind` is "async" or "sync"; `klass` hidden/partial/exposed with
    `thresholds` (the exposed-collective rule's defaults when None).
    Whole arrays per host; only the interval union and the coverage go device by device.
    """
    thresholds = thresholds or WindowThresholds()
    frames = []
    for host in analysis.profile.hosts:
        if host.events is None:
            raise ValueError(f"host {host.host}: its events were digested away; read the folded windows "
                             "(`Analysis.collectives`) instead")
        frame = host_windows(host, analysis.steps)
        if frame is not None:
            frames.append(frame)
    if not frames:
        return pd.DataFrame({c: [] for c in WINDOW_COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    for column in ("name", "family", "kind", "source", "device"):  # strings, as the rows read them
        out[column] = out[column].astype(object)
    out["klass"] = classify(out["overlap_ratio"].to_numpy(), thresholds)
    return out[list(WINDOW_COLUMNS)].sort_values(["host", "device", "start_ps"], kind="stable").reset_index(drop=True)


def _category_strings(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, category names as an object array) of a categorical column."""
    return column.cat.codes.to_numpy(), np.asarray(column.cat.categories.astype(str), dtype=object)


def host_windows(host: HostTrace, steps: pd.DataFrame) -> pd.DataFrame | None:
    """`collective_windows` of one host, not classed: no `klass` (None when it has no windows)."""
    ev = host.events
    if ev.empty:
        return None
    # Per distinct name and category, not per event: traces hold millions of events.
    name_codes, names = _category_strings(ev["name"])
    cat_codes, cats = _category_strings(ev["category"])
    is_async_op = np.array([async_role(n) is not None for n in names], dtype=bool)[name_codes]
    # Families as integer ids (0: none) per event, their strings looked up only where kept; a few,
    # so int16 ids: the per-event takes move 2 bytes, not 8. The same verdict as the steps table's.
    fam, family_names = event_families(names, cats, name_codes, cat_codes)
    family_ids = {f: i for i, f in enumerate(family_names)}
    families = np.array(family_names, dtype=object)
    is_coll = fam != 0
    start = ev["start_ps"].to_numpy()
    end = start + ev["dur_ps"].to_numpy()
    device_codes, devices = _category_strings(ev["device"])
    cores = ev["core"].to_numpy()
    depth = ev["depth"].to_numpy()
    has_child, in_coll = nesting_facts(device_codes, start, depth, is_coll)
    # A container (`while`, `call`, `conditional`) spans its body: counting it as compute would
    # hide every window inside a loop. Its children are what runs, so only leaves cover.
    compute = ~is_async_op & ~is_coll & ~has_child & ~in_coll
    sync_all = is_coll & ~is_async_op & ~in_coll & ~np.isin(fam, [family_ids.get(f, -1) for f in ("send", "recv")])
    # On a GPU a collective is a kernel (NCCL's, RCCL's), the start op of an async one included: it runs
    # on its own stream while the compute kernels of the other streams of that GPU may cover it, so the
    # kernel's own span is the window. Its `done` launches nothing.
    # A kernel named by its library (no HLO op: TensorFlow's, or launched outside XLA) is on the
    # library's stream too.
    gpu = host.device.platform is Platform.GPU
    gpu_async = np.zeros(len(start), dtype=bool)
    if gpu:
        library = np.array([library_collective(n) for n in names], dtype=bool)[name_codes]
        gpu_async = is_coll & (is_async_op | library) & ~in_coll
        sync_all &= ~gpu_async
    windows = host.async_windows
    w_names = w_fams = w_srcs = np.empty(0, dtype=object)
    if len(windows):
        w_dev_codes, w_devices = _category_strings(windows["device"])
        w_name_codes, w_names = _category_strings(windows["name"])
        w_fam_codes, w_fams = _category_strings(windows["family"])
        w_src_codes, w_srcs = _category_strings(windows["source"])
        w_keep = ~np.isin(np.append(w_fams, "nan"), ["copy", "other"])[w_fam_codes]  # code -1 reads "nan"
        w_start, w_end = windows["start_ps"].to_numpy(), windows["end_ps"].to_numpy()
        w_device_index = {d: i for i, d in enumerate(w_devices)}
    # Strings as codes into one vocabulary per column: the windows' categories, "nan" for a missing
    # one, then the events' (names, families) or constants. Categories are made once, at the end.
    vocab = {"name": np.concatenate([w_names, ["nan"], names]).astype(object),
             "family": np.concatenate([w_fams, ["nan"], families]).astype(object),
             "kind": np.array(["async", "sync"], dtype=object),
             "source": np.concatenate([w_srcs, ["nan", "XLA Ops", GPU_KERNEL_SOURCE]]).astype(object),
             "device": np.asarray(devices, dtype=object)}
    xla_ops_source, gpu_kernel_source = len(w_srcs) + 1, len(w_srcs) + 2

    def event_part(rows: np.ndarray, kind: int, source: int) -> tuple:
        event_names = name_codes[rows].astype(np.int64)
        event_names[event_names < 0] += len(names)  # read as `names[code]` reads a -1 code
        return (len(w_names) + 1 + event_names, len(w_fams) + 1 + fam[rows].astype(np.int64), kind,
                start[rows], end[rows], source)

    cols: dict[str, list] = {k: [] for k in ("name", "family", "kind", "start_ps", "end_ps", "source", "covered",
                                             "compute_inside", "device", "core")}
    for code in dense_unique(device_codes):
        if code < 0:
            continue
        device = devices[code]
        on = device_codes == code
        core = int(cores[np.argmax(on)])  # its first event's (not a copy of every event's)
        covering = on & compute
        comp_starts, comp_ends = start[covering], end[covering]
        ms, me = merge(comp_starts, comp_ends)
        comp_starts = np.sort(comp_starts, kind="stable")  # events come in time order: one linear pass
        parts = []  # (name, family, kind, start, end, source) codes: async windows first, then sync collectives
        if len(windows):
            wsel = np.flatnonzero((w_dev_codes == w_device_index.get(device, -2)) & w_keep)
            if len(wsel):
                parts.append((_or_nan(w_name_codes[wsel], len(w_names)), _or_nan(w_fam_codes[wsel], len(w_fams)),
                              0, w_start[wsel], w_end[wsel], _or_nan(w_src_codes[wsel], len(w_srcs))))
        sync = np.flatnonzero(on & sync_all)
        if len(sync):
            parts.append(event_part(sync, 1, gpu_kernel_source if gpu else xla_ops_source))
        kernels = np.flatnonzero(on & gpu_async)
        if len(kernels):
            parts.append(event_part(kernels, 0, gpu_kernel_source))
        if not parts:
            continue
        ws = np.concatenate([p[3] for p in parts])
        we = np.concatenate([p[4] for p in parts])
        keep = we > ws
        ws, we = ws[keep], we[keep]
        n = len(ws)
        for key, i in (("name", 0), ("family", 1), ("kind", 2), ("source", 5)):
            cols[key].append(np.concatenate([np.asarray(p[i], dtype=np.int64) if np.ndim(p[i])
                                             else np.full(len(p[3]), p[i], dtype=np.int64) for p in parts])[keep])
        cols["start_ps"].append(ws)
        cols["end_ps"].append(we)
        cols["covered"].append(covered(ws, we, ms, me))
        # Any compute op starting strictly inside the window: none means start and done are adjacent.
        cols["compute_inside"].append((np.searchsorted(comp_starts, we, side="left")
                                       - np.searchsorted(comp_starts, ws, side="right")) > 0)
        cols["device"].append(np.full(n, code, dtype=np.int64))
        cols["core"].append(np.full(n, core, dtype=np.int64))
    if not cols["start_ps"]:
        return None
    ws, we = np.concatenate(cols["start_ps"]), np.concatenate(cols["end_ps"])
    cov = np.concatenate(cols["covered"])
    span = we - ws
    ratio = cov / span
    coded = {k: _coded(np.concatenate(cols[k]), vocab[k]) for k in vocab}
    name = coded["name"]
    double_suffix = np.array([has_double_suffix(n) for n in name.categories], dtype=bool)[name.codes]
    core = np.concatenate(cols["core"])
    return pd.DataFrame({
        "name": name, "family": coded["family"], "kind": coded["kind"],
        "start_ps": ws, "end_ps": we, "source": coded["source"], "span_ps": span,
        "covered_ps": cov, "exposed_ps": span - cov, "overlap_ratio": ratio,
        "double_suffix": double_suffix,
        "compute_inside": np.concatenate(cols["compute_inside"]),
        "host": host.host, "device": coded["device"], "core": core,
        "step": _assign_steps(steps, host.host, core, ws),
    })


def _or_nan(codes: np.ndarray, nan: int) -> np.ndarray:
    """Category codes with -1 (a missing value) as `nan`, the vocabulary's "nan" after the categories."""
    return np.where(codes < 0, nan, codes).astype(np.int64)


def _coded(codes: np.ndarray, vocab: np.ndarray) -> pd.Categorical:
    """`pd.Categorical(vocab[codes])` without a string per row: the strings used, sorted, as its
    categories (a vocabulary may hold one string twice)."""
    present = np.flatnonzero(np.bincount(codes, minlength=len(vocab)))
    strings = [str(v) for v in vocab[present]]
    categories = sorted(set(strings))
    position = {c: i for i, c in enumerate(categories)}
    remap = np.full(len(vocab), -1, dtype=np.int32)
    remap[present] = [position[v] for v in strings]
    return pd.Categorical.from_codes(remap[codes], categories=categories)


def _assign_steps(steps: pd.DataFrame, host: str, core: np.ndarray, start_ps: np.ndarray) -> np.ndarray:
    """Step number containing each (core, start) on `host`; -1 outside every step."""
    out = np.full(len(start_ps), -1, dtype=np.int64)
    hs = steps[steps["host"] == host]
    for c, m in hs.groupby("core"):
        idx = np.flatnonzero(core == c)
        if not len(idx):
            continue
        m = m.sort_values("start_ps")
        s = m["start_ps"].to_numpy()
        e = s + m["dur_ps"].to_numpy()
        k = np.searchsorted(s, start_ps[idx], side="right") - 1
        ok = (k >= 0) & (start_ps[idx] < e[np.clip(k, 0, None)])
        out[idx[ok]] = m["step"].to_numpy()[k[ok]]
    return out


def summarize_windows(windows: pd.DataFrame | None, host: str) -> tuple[CollectiveDigest, pd.DataFrame]:
    """One host's per-window rows (`host_windows`) folded three ways: exposed time per (core, step,
    family), and per op its windows' summed times and distinct covered fractions over the capture
    (`CollectiveDigest`), and exposed time per (step, op) on the worst core
    (`schemas.COLLECTIVE_OP_STEPS`, one of the host's `StepTables`). These answer every per-step
    worst-core sum the exposed-collective rule takes, by kind, family or op, as the rows did, and
    its class counts under any thresholds (`class_counts`)."""
    if windows is None or windows.empty:
        return (CollectiveDigest(schemas.COLLECTIVE_STEPS.empty(), schemas.COLLECTIVE_OPS.empty(),
                                 schemas.COLLECTIVE_COVERAGE.empty()),
                schemas.COLLECTIVE_OP_STEPS.empty())
    # Strings as categories first: grouping tens of thousands of rows by string keys is the cost.
    windows = windows.astype({k: "category" for k in ("device", "kind", "family", "name", "source")})
    coded = _summary_by_codes(windows)
    if coded is not None:
        by_family, by_op, ops, coverage = coded
        return (CollectiveDigest(schemas.COLLECTIVE_STEPS.of_host(by_family, host),
                                 schemas.COLLECTIVE_OPS.of_host(ops, host), schemas.COLLECTIVE_COVERAGE.of_host(coverage)),
                schemas.COLLECTIVE_OP_STEPS.of_host(by_op))
    by_family = (windows.groupby(["device", "core", "step", "kind", "family"], sort=True, observed=True)
                 ["exposed_ps"].sum().reset_index())
    by_op = _worst_core_per_op_step(windows)
    frame = pd.DataFrame({k: windows[k] for k in _OP_KEYS})
    frame["n"] = 1
    for col in ("span_ps", "covered_ps", "exposed_ps"):
        frame[col] = windows[col].to_numpy().astype(np.int64)
    per_op = frame.groupby(_OP_KEYS, sort=True, observed=True)
    ops = per_op.sum().reset_index()
    # Windows of one op often share their fraction (a synchronous collective covers nothing: 0):
    # one row per distinct (op, fraction, compute inside) keeps the digest small and exact.
    coverage = (pd.DataFrame({"op": per_op.ngroup().to_numpy().astype(np.int32),
                              "covered_fraction": windows["overlap_ratio"].to_numpy(),
                              "compute_inside": windows["compute_inside"].to_numpy()})
                .groupby(["op", "covered_fraction", "compute_inside"], sort=True).size().rename("n").reset_index())
    return (CollectiveDigest(schemas.COLLECTIVE_STEPS.of_host(by_family, host),
                             schemas.COLLECTIVE_OPS.of_host(ops, host), schemas.COLLECTIVE_COVERAGE.of_host(coverage)),
            schemas.COLLECTIVE_OP_STEPS.of_host(by_op))


def _summary_by_codes(windows: pd.DataFrame) -> tuple[pd.DataFrame, ...] | None:
    """`summarize_windows`' four tables (exposed per (device, core, step, kind, family), worst core
    per (kind, op, step), per op sums, coverage per (op, fraction, compute inside)) from integer
    codes, as its groupbys (sorted, observed) give them: one packed key and one table of sums per
    grouping instead of a pandas groupby each. None where a key is missing (a -1 code, a core
    below 0, a fraction that is NaN) or the keys do not pack densely: pandas' rules then apply."""
    code = {k: windows[k].cat.codes.to_numpy().astype(np.int64) for k in ("device", "kind", "family", "name", "source")}
    core = windows["core"].to_numpy().astype(np.int64)
    step = windows["step"].to_numpy().astype(np.int64)
    fraction = windows["overlap_ratio"].to_numpy()
    if any((c < 0).any() for c in code.values()) or (core < 0).any() or np.isnan(fraction).any():
        return None
    lowest_step = int(step.min())
    exposed = windows["exposed_ps"].to_numpy().astype(np.int64)
    (dev, cr, st, kd, fm), exposed_sums = group_sums([code["device"], core, step - lowest_step, code["kind"],
                                                      code["family"]], exposed)
    by_family = pd.DataFrame({"device": _from_codes(dev, windows["device"]), "core": cr, "step": st + lowest_step,
                              "kind": _from_codes(kd, windows["kind"]), "family": _from_codes(fm, windows["family"]),
                              "exposed_ps": exposed_sums})
    double = windows["double_suffix"].to_numpy()
    op_keys = [code["kind"], code["family"], code["name"], code["source"], double.astype(np.int64)]
    grouped = sorted_groups(op_keys)
    if grouped is None:
        return None
    (kd, fm, nm, sc, ds), op = grouped
    n_ops = len(kd)
    ops = pd.DataFrame({"kind": _from_codes(kd, windows["kind"]), "family": _from_codes(fm, windows["family"]),
                        "name": _from_codes(nm, windows["name"]), "source": _from_codes(sc, windows["source"]),
                        "double_suffix": ds.astype(bool), "n": np.bincount(op, minlength=n_ops).astype(np.int64),
                        **{col: sums_by_group(op, n_ops, windows[col].to_numpy().astype(np.int64))
                           for col in ("span_ps", "covered_ps", "exposed_ps")}})
    inside = windows["compute_inside"].to_numpy()
    order = np.lexsort((inside, fraction, op))
    keys = (op[order], fraction[order], inside[order])
    first = heads(list(keys))
    coverage = pd.DataFrame({"op": keys[0][first].astype(np.int32), "covered_fraction": keys[1][first],
                             "compute_inside": keys[2][first],
                             "n": np.diff(np.append(first, len(order))).astype(np.int64)})
    return by_family, _worst_core_per_op_step(windows), ops, coverage


def _from_codes(codes: np.ndarray, column: pd.Series) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, dtype=column.dtype)


def _worst_core_per_op_step(windows: pd.DataFrame) -> pd.DataFrame:
    """Exposed time per (kind, op, step) on its worst core, rows in key order (categories' order),
    from integer codes: one sum per (kind, op, step, core), then the largest over the cores."""
    kind, name = windows["kind"], windows["name"]
    kind_codes, name_codes = kind.cat.codes.to_numpy(), name.cat.codes.to_numpy()
    if (kind_codes < 0).any() or (name_codes < 0).any():  # a missing key: pandas' rules for it
        per_core = windows.groupby(["kind", "name", "step", "core"], sort=True, observed=True)["exposed_ps"].sum()
        return per_core.groupby(level=["kind", "name", "step"], sort=True, observed=True).max().reset_index()
    step = windows["step"].to_numpy().astype(np.int64)
    (k, nm, s, _), sums = group_sums([kind_codes, name_codes, step - step.min(), windows["core"].to_numpy()],
                                     windows["exposed_ps"].to_numpy())
    first = heads([k, nm, s])
    return pd.DataFrame({"kind": pd.Categorical.from_codes(k[first], dtype=kind.dtype),
                         "name": pd.Categorical.from_codes(nm[first], dtype=name.dtype),
                         "step": s[first] + step.min(), "exposed_ps": np.maximum.reduceat(sums, first)})


def class_counts(digest: CollectiveDigest, thresholds: WindowThresholds) -> pd.DataFrame:
    """`schemas.COLLECTIVE_CLASSES` of one host: its digest's ops with their windows counted per
    class under `thresholds` (`classify`), as the windows themselves would be classed."""
    coverage = digest.coverage
    op = coverage["op"].to_numpy()
    n = coverage["n"].to_numpy()
    klass = classify(coverage["covered_fraction"].to_numpy(), thresholds)
    adjacent = ~coverage["compute_inside"].to_numpy() & (klass != "hidden")

    def count(where: np.ndarray) -> np.ndarray:
        return np.bincount(op[where], weights=n[where], minlength=len(digest.ops)).astype(np.int64)

    data = {c: digest.ops[c].array for c in schemas.COLLECTIVE_OPS.names}
    for name in ("hidden", "partial", "exposed"):
        data[f"n_{name}"] = count(klass == name)
    data["n_adjacent"] = count(adjacent)
    return schemas.COLLECTIVE_CLASSES.frame(data)


_OP_KEYS = ["kind", "family", "name", "source", "double_suffix"]
