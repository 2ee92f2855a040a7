"""The device timeline of the analysed steps as Chrome trace-event JSON, for Perfetto and chrome://tracing.

`tpudiag report PATH --trace-out FILE.json` and `Diagnosis.write_trace(path)` write it; open it at
ui.perfetto.dev or with Perfetto's `trace_processor`. The format (the "JSON Object Format" of the
Trace Event Format) is a `traceEvents` array:

- one process per host (`pid` 1, 2, ... in the capture's host order, named by its hostname), and
  per core line (a device plane, e.g. `/device:TPU:0`) up to four threads: its ops, its async
  collective windows (start to done), its steps, and the findings on its ops;
- each op occurrence inside an analysed step is a complete slice (`ph: X`) named by the op, with
  its category as `cat` and `args` holding the module, the step, the self time, the source line and
  the JAX op name; nesting is kept (a nested op is a slice inside its parent's);
- each step is a slice `step N` on the core's steps thread;
- each finding is one slice on the findings thread of the core where the first op it names first
  runs, spanning that occurrence (a finding naming no op spans the first analysed step of its host),
  `cat` `tpudiag.finding`, named `CODE rule: op`, with the message, saving, its basis, the fix and
  the ops in `args`, and a flow arrow (`ph: s` / `f`) to the op's slice.

Times are microseconds (`ts`, `dur`, fractional: picosecond resolution kept), each host from its first
exported event: hosts' clocks are not aligned (docs/time-axis.md). Without steps the whole capture is
exported. Events are written host by host in chunks, never held as one list, so the export of a
2 M-event capture stays within the report's memory; names from the trace reach the file only through
`json.dumps`. The file is written through `writers.files` (atomically, never inside a trace).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.analysis.timeline import host_events
from tpudiag.model.findings import Finding
from tpudiag.version import __version__
from tpudiag.writers.files import atomic_open, check_not_input

FINDING_CATEGORY = "tpudiag.finding"
STEP_CATEGORY = "step"
WINDOW_CATEGORY = "async window"
_CHUNK = 50_000  # events formatted and written at a time
# threads of one core line: ops, async windows, steps, findings
_OPS, _WINDOWS, _STEPS, _FINDINGS = range(4)
_THREAD_NAMES = ("XLA Ops", "async windows", "Steps", "tpudiag findings")


@dataclass(frozen=True)
class TraceSummary:
    """What was written: counts per kind of event (tests and the CLI's stderr line read them)."""

    path: Path
    n_hosts: int
    n_ops: int  # op slices: one per op occurrence of the analysed steps
    n_steps: int
    n_windows: int
    n_findings: int
    whole_capture: bool  # no steps: every event was exported


@dataclass(frozen=True)
class _Mark:
    """Where one finding's slice goes."""

    finding: Finding
    index: int
    device: str
    start_ps: int
    dur_ps: int
    op_found: bool  # False: placed over a step (the finding names no op that ran there)


def _q(text: str) -> str:
    return json.dumps(text)


def _us(ps: np.ndarray | int) -> np.ndarray:
    return np.asarray(ps, dtype=np.float64) / 1e6


def write_trace(analysis: Analysis, findings: Sequence[Finding], path: Path,
                inputs: Iterable[Path | None] = ()) -> TraceSummary:
    """Write the trace-event JSON of `analysis`' analysed steps and `findings` to `path` (never an
    input nor inside one: `inputs`)."""
    check_not_input(path, inputs, "the trace")
    with atomic_open(path) as out:
        return _write(analysis, findings, out, path)


def _write(analysis: Analysis, findings: Sequence[Finding], out: IO, path: Path) -> TraceSummary:
    whole = analysis.steps.empty
    meta = {"tool": "tpudiag", "version": __version__, "input": analysis.profile.input_path,
            "run": analysis.profile.run, "modelled": bool(analysis.profile.modelled),
            "time_origin": "each host from its first exported event",
            "exported": "the whole capture (no steps)" if whole else "the analysed steps"}
    out.write('{"displayTimeUnit":"ns","otherData":' + json.dumps(meta) + ',"traceEvents":[\n')
    first = [True]

    def emit(lines: Iterable[str]) -> None:
        body = ",\n".join(lines)
        if not body:
            return
        out.write(body if first[0] else ",\n" + body)
        first[0] = False

    n_ops = n_steps = n_windows = 0
    placed: set[int] = set()
    sources = _op_sites(analysis.ops)
    for pid, host in enumerate(analysis.profile.hosts, 1):
        events, windows = host_events(host)
        steps = analysis.steps[analysis.steps["host"].astype(str) == host.host]
        if not whole and steps.empty:
            continue
        events = _in_steps(events, steps) if not whole else events
        origin = int(events["start_ps"].min()) if len(events) else (int(steps["start_ps"].min()) if len(steps) else 0)
        devices = sorted(set(events["device"].astype(str)) | set(steps["device"].astype(str)), key=_device_key)
        tid_of = {d: i * 4 for i, d in enumerate(devices)}
        emit(_metadata(pid, host.host, devices, tid_of))
        n_ops += _write_ops(emit, pid, events, tid_of, origin, sources.get(host.host, {}))
        if windows is not None and not windows.empty:
            n_windows += _write_windows(emit, pid, windows, steps, tid_of, origin, whole)
        emit(_step_lines(pid, steps, tid_of, origin))
        n_steps += len(steps)
        marks = _marks(findings, host.host, pid == 1, events, steps, placed)
        emit(_finding_lines(pid, marks, tid_of, origin))
        placed |= {m.index for m in marks}
    out.write("\n]}\n")
    return TraceSummary(path, len(analysis.profile.hosts), n_ops, n_steps, n_windows, len(placed), whole)


def _device_key(device: str) -> tuple:
    digits = "".join(c if c.isdigit() else " " for c in device).split()
    return (device.split(":")[0], int(digits[0]) if digits else -1, device)


def _op_sites(ops: pd.DataFrame) -> dict[str, dict[tuple[int, str], str]]:
    """Per host, (program id, op) -> the `args` text of its module, source line and JAX op name."""
    out: dict[str, dict[tuple[int, str], str]] = {}
    cols = [ops[c].astype(str).to_numpy() if c in ops else np.full(len(ops), "") for c in
            ("host", "module", "name", "source", "tf_op")]
    for host, module, name, source, tf_op, pid in zip(*cols, ops["program_id"].to_numpy()):
        parts = [f'"module":{_q(module)}']
        if source and source != "nan":
            parts.append(f'"source":{_q(source)}')
        if tf_op and tf_op != "nan":
            parts.append(f'"jax_op":{_q(tf_op)}')
        out.setdefault(host, {})[(int(pid), name)] = ",".join(parts)
    return out


def _in_steps(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The events that start inside an analysed step of their core line."""
    keep = np.zeros(len(events), dtype=bool)
    dev = events["device"].astype(str).to_numpy()
    start = events["start_ps"].to_numpy()
    for device, s in steps.groupby(steps["device"].astype(str), observed=True):
        s = s.sort_values("start_ps")
        lo = s["start_ps"].to_numpy()
        hi = lo + s["dur_ps"].to_numpy()
        on = np.flatnonzero(dev == device)
        k = np.searchsorted(lo, start[on], side="right") - 1
        ok = k >= 0
        ok[ok] = start[on][ok] < hi[k[ok]]
        keep[on[ok]] = True
    return events[keep]


def _metadata(pid: int, host: str, devices: list[str], tid_of: dict[str, int]) -> list[str]:
    lines = [f'{{"ph":"M","pid":{pid},"name":"process_name","args":{{"name":{_q(host)}}}}}',
             f'{{"ph":"M","pid":{pid},"name":"process_sort_index","args":{{"sort_index":{pid}}}}}']
    for device in devices:
        for k, label in enumerate(_THREAD_NAMES):
            tid = tid_of[device] + k
            lines.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_name",'
                         f'"args":{{"name":{_q(f"{device} {label}")}}}}}')
            lines.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_sort_index",'
                         f'"args":{{"sort_index":{tid}}}}}')
    return lines


def _write_ops(emit, pid: int, events: pd.DataFrame, tid_of: dict[str, int], origin: int,
               sites: dict[tuple[int, str], str]) -> int:
    """One slice per event. What repeats per (program, op, category, line) - its name, category and
    site - is formatted once; per event only the numbers are."""
    if events.empty:
        return 0
    # integer codes per column (the table's categories; program ids factorized), one key per combination
    columns = [pd.factorize(events["program_id"].to_numpy())] + [
        _codes(events[c]) for c in ("name", "category", "device")]
    key = np.zeros(len(events), dtype=np.int64)
    for codes_c, uniques_c in columns:
        key = key * max(1, len(uniques_c)) + codes_c.astype(np.int64)
    first, codes = np.unique(key, return_index=True, return_inverse=True)[1:]
    heads, tails = [], []
    for i in first:
        program, name, category, device = (uniques_c[codes_c[i]] for codes_c, uniques_c in columns)
        site = sites.get((int(program), str(name)), "")
        heads.append(f'{{"ph":"X","pid":{pid},"tid":{tid_of[str(device)]},"ts":')
        tails.append(f'{"," + site if site else ""}}},"name":{_q(str(name))},"cat":{_q(str(category))}}}')
    steps = events["step"].to_numpy() if "step" in events else np.full(len(events), -1)
    ts, dur = _us(events["start_ps"].to_numpy() - origin), _us(events["dur_ps"].to_numpy())
    self_us = _us(events["self_ps"].to_numpy())
    for lo in range(0, len(events), _CHUNK):
        hi = min(lo + _CHUNK, len(events))
        emit([f'{heads[c]}{t:.6f},"dur":{d:.6f},"args":{{"step":{st},"self_us":{su:.6f}{tails[c]}'
              for c, t, d, st, su in zip(codes[lo:hi].ravel().tolist(), ts[lo:hi].tolist(), dur[lo:hi].tolist(),
                                         steps[lo:hi].tolist(), self_us[lo:hi].tolist())])
    return len(events)


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of a column, from its categories when it has them (no string per row)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        if not (codes < 0).any():  # a missing value has no category: spelled out below instead
            return codes, np.asarray(column.cat.categories)
    return pd.factorize(column.astype(str).to_numpy())


def _write_windows(emit, pid: int, windows: pd.DataFrame, steps: pd.DataFrame, tid_of: dict[str, int],
                   origin: int, whole: bool) -> int:
    w = windows if whole else _in_steps(windows, steps)
    w = w[w["device"].astype(str).isin(tid_of)]
    lines = [f'{{"ph":"X","pid":{pid},"tid":{tid_of[str(r.device)] + _WINDOWS},"ts":{(r.start_ps - origin) / 1e6:.6f},'
             f'"dur":{(r.end_ps - r.start_ps) / 1e6:.6f},"name":{_q(str(r.name))},"cat":"{WINDOW_CATEGORY}",'
             f'"args":{{"family":{_q(str(r.family))}}}}}' for r in w.itertuples(index=False)]
    emit(lines)
    return len(lines)


def _step_lines(pid: int, steps: pd.DataFrame, tid_of: dict[str, int], origin: int) -> list[str]:
    return [f'{{"ph":"X","pid":{pid},"tid":{tid_of[str(r.device)] + _STEPS},"ts":{(r.start_ps - origin) / 1e6:.6f},'
            f'"dur":{r.dur_ps / 1e6:.6f},"name":"step {int(r.step)}","cat":"{STEP_CATEGORY}",'
            f'"args":{{"step":{int(r.step)},"busy_us":{r.busy_ps / 1e6:.6f},"idle_us":{r.idle_ps / 1e6:.6f}}}}}'
            for r in steps.itertuples(index=False) if str(r.device) in tid_of]


def _marks(findings: Sequence[Finding], host: str, first_host: bool, events: pd.DataFrame, steps: pd.DataFrame,
           placed: set[int]) -> list[_Mark]:
    """The findings this host shows: those of this host (or of no host, on the first host) not placed yet."""
    marks = []
    names = events["name"].astype(str) if len(events) else None
    for i, f in enumerate(findings):
        if i in placed or not (f.host == host or (not f.host and first_host)):
            continue
        mark = None
        if f.ops and names is not None:
            on = events[names.isin(f.ops).to_numpy()]
            if len(on):
                e = on.loc[on["start_ps"].idxmin()]
                mark = _Mark(f, i, str(e["device"]), int(e["start_ps"]), int(e["dur_ps"]), True)
        if mark is None:
            if steps.empty and events.empty:
                continue
            if not steps.empty:
                s = steps.sort_values(["step", "core"]).iloc[0]
                mark = _Mark(f, i, str(s["device"]), int(s["start_ps"]), int(s["dur_ps"]), False)
            else:
                e = events.loc[events["start_ps"].idxmin()]
                span = int((events["start_ps"] + events["dur_ps"]).max()) - int(e["start_ps"])
                mark = _Mark(f, i, str(e["device"]), int(e["start_ps"]), span, False)
        marks.append(mark)
    return marks


def _finding_lines(pid: int, marks: list[_Mark], tid_of: dict[str, int], origin: int) -> list[str]:
    lines = []
    for m in marks:
        f = m.finding
        tid = tid_of[m.device]
        ts, dur = (m.start_ps - origin) / 1e6, m.dur_ps / 1e6
        label = f"{f.code} {f.rule}" + (f": {f.ops[0]}" if f.ops else "") + (
            f" and {len(f.ops) - 1} more" if len(f.ops) > 1 else "")
        args = {"rule": f.rule, "code": f.code, "severity": f.severity.label(), "message": f.message,
                "saving_ps": f.saving.ps, "saving_basis": str(f.saving.basis), "saving": f.saving.explanation,
                "fix": f.fix, "ops": list(f.ops), "placed_on": "first occurrence of its op" if m.op_found
                else "the first analysed step (no op it names ran there)"}
        lines.append(f'{{"ph":"X","pid":{pid},"tid":{tid + _FINDINGS},"ts":{ts:.6f},"dur":{dur:.6f},'
                     f'"name":{_q(label)},"cat":"{FINDING_CATEGORY}","args":{json.dumps(args)}}}')
        if m.op_found:
            flow = f'"cat":"{FINDING_CATEGORY}","name":"finding","id":{m.index + 1}'
            lines.append(f'{{"ph":"s","pid":{pid},"tid":{tid + _FINDINGS},"ts":{ts:.6f},{flow}}}')
            lines.append(f'{{"ph":"f","bp":"e","pid":{pid},"tid":{tid},"ts":{ts:.6f},{flow}}}')
    return lines
