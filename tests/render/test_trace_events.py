"""`report --trace-out` / `Diagnosis.write_trace`: the timeline as Chrome trace-event JSON for Perfetto.

The file is checked against the Trace Event Format (the JSON Object Format: a `traceEvents` array of
events whose `ph` decides the fields they need) by `check_trace_events` below, the counts against the
capture's own events (an op slice per event inside an analysed step), and every finding's slice is
found on the ops it names. Where Perfetto's trace processor runs, it loads the file too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_util import run_tpudiag
from tests.robustness.hostile import OP, OP2, write_hostile
from tpudiag.errors import UsageError
from tpudiag.pipeline import diagnose
from tpudiag.render.trace_events import FINDING_CATEGORY, STEP_CATEGORY, WINDOW_CATEGORY

PHASES = {"X", "M", "s", "f", "B", "E", "i", "I", "C"}


def check_trace_events(doc: dict) -> list[dict]:
    """The Trace Event Format's rules for the phases the export writes; returns the events."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
            assert isinstance(e["args"], dict) and e["args"], e
            continue
        assert isinstance(e["tid"], int) and isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["cat"], str) and isinstance(e.get("args", {}), dict), e
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["cat"], str), e
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    starts = {e["id"] for e in flows if e["ph"] == "s"}
    assert starts == {e["id"] for e in flows if e["ph"] == "f"}  # every arrow has both ends
    return doc["traceEvents"]


def slices(events: list[dict], cat: str | None = None, exclude: tuple[str, ...] = ()) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and (cat is None or e["cat"] == cat) and e["cat"] not in exclude]


@pytest.fixture(scope="module")
def example():
    return diagnose()  # the bundled example and its dumps


@pytest.fixture(scope="module")
def example_trace(example, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "example.json"
    summary = example.write_trace(path)
    return summary, check_trace_events(json.loads(path.read_text(encoding="utf-8")))


def test_one_slice_per_op_occurrence_of_the_analysed_steps(example, example_trace):
    summary, events = example_trace
    ops = slices(events, exclude=(FINDING_CATEGORY, STEP_CATEGORY, WINDOW_CATEGORY))
    # The capture's own events, counted apart: those its steps analysis put inside a step.
    expected = sum(int((h.events["step"] >= 0).sum()) for h in example.analysis.profile.hosts)
    assert len(ops) == summary.n_ops == expected > 0
    names = {str(n) for h in example.analysis.profile.hosts for n in h.events["name"].unique()}
    assert {e["name"] for e in ops} <= names
    assert len(slices(events, STEP_CATEGORY)) == len(example.analysis.steps)
    # Each op slice lies inside a step of its core: steps are on the thread two above the ops'.
    steps = {(e["pid"], e["tid"] - 2): [] for e in slices(events, STEP_CATEGORY)}
    for e in slices(events, STEP_CATEGORY):
        steps[(e["pid"], e["tid"] - 2)].append((e["ts"], e["ts"] + e["dur"]))
    for e in ops[:: max(1, len(ops) // 200)]:
        assert any(lo - 1e-6 <= e["ts"] < hi for lo, hi in steps[(e["pid"], e["tid"])]), e


def test_one_marked_slice_per_finding_on_the_ops_it_names(example, example_trace):
    summary, events = example_trace
    marks = slices(events, FINDING_CATEGORY)
    assert len(marks) == summary.n_findings == len(example.findings) > 0
    assert {m["args"]["message"] for m in marks} == {f.message for f in example.findings}
    ops = slices(events, exclude=(FINDING_CATEGORY, STEP_CATEGORY, WINDOW_CATEGORY))
    by_place = {}
    for e in ops:
        by_place.setdefault((e["pid"], e["tid"], round(e["ts"], 6)), []).append(e["name"])
    for m in marks:
        assert m["name"].startswith(m["args"]["code"])
        assert isinstance(m["args"]["saving_ps"], int) and m["args"]["fix"]
        if m["args"]["placed_on"].startswith("first occurrence"):
            # the op slice it marks: same start, on the core's ops thread (three below the findings')
            here = by_place[(m["pid"], m["tid"] - 3, round(m["ts"], 6))]
            assert set(here) & set(m["args"]["ops"]), m["name"]
    flows = [e for e in events if e["ph"] == "s"]
    assert len(flows) == sum(m["args"]["placed_on"].startswith("first occurrence") for m in marks)


def test_processes_are_hosts_and_threads_are_core_lines(example, example_trace):
    _, events = example_trace
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(h.host for h in example.analysis.profile.hosts)
    threads = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(t.endswith("XLA Ops") and "TPU:0" in t for t in threads)
    op = next(e for e in slices(events, "convolution fusion"))
    assert op["args"]["source"] and op["args"]["jax_op"] and op["args"]["module"]


def test_trace_names_are_escaped_as_json(tmp_path):
    """Op and host names with quotes' neighbours: controls, bidi overrides, markup (tests/robustness)."""
    run = write_hostile(tmp_path)
    d = diagnose(run)
    out = tmp_path / "out" / "hostile.json"
    d.write_trace(out)
    raw = out.read_text(encoding="utf-8")
    assert "\x1b" not in raw and "\u202e" not in raw  # json.dumps escapes them (\u001b, \u202e)
    events = check_trace_events(json.loads(raw))
    assert {OP, OP2} <= {e["name"] for e in slices(events)}  # the names round-trip exactly


def test_a_trace_inside_the_input_is_refused(example, tmp_path):
    with pytest.raises(UsageError, match="inside the input directory"):
        example.write_trace(Path(example.input_path) / "trace.json")
    assert not (Path(example.input_path) / "trace.json").exists()


def test_a_capture_without_steps_exports_every_event(tmp_path):
    from dataclasses import replace

    from tests.analysis.diff_designs import design, write

    d = diagnose(write(tmp_path, "a", replace(design(seed=1, n_steps=3), steps_line=False, modules_line=False)))
    assert d.analysis.steps.empty
    summary = d.write_trace(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    check_trace_events(doc)
    assert summary.whole_capture and doc["otherData"]["exported"] == "the whole capture (no steps)"
    assert summary.n_ops == sum(len(h.events) for h in d.analysis.profile.hosts) == 18  # 3 ops x 3 steps x 2 chips
    assert len(slices(doc["traceEvents"], FINDING_CATEGORY)) == len(d.findings)


def test_report_trace_out_on_the_command_line(tmp_path):
    out = tmp_path / "trace.json"
    env = {"NO_COLOR": "1"}
    r = run_tpudiag("report", "--format", "json", "--trace-out", out, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["findings"]  # the report still goes to stdout
    events = check_trace_events(json.loads(out.read_text(encoding="utf-8")))
    assert len(slices(events, FINDING_CATEGORY)) == len(json.loads(r.stdout)["findings"])
    assert "op slices" in r.stderr and "ui.perfetto.dev" in r.stderr
    bad = run_tpudiag("report", "--trace-out", "-", env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --trace-out needs a file name")


def test_perfetto_trace_processor_loads_the_file(example_trace, tmp_path):
    """Perfetto's own reader. The `perfetto` package fetches its trace_processor binary on first use."""
    try:
        from perfetto.trace_processor import TraceProcessor
    except ImportError:
        pytest.skip("the `perfetto` Python package is not installed")
    summary, events = example_trace
    try:
        tp = TraceProcessor(trace=str(summary.path))
    except Exception as exc:  # noqa: BLE001 - the binary download or start failing (offline): any of its errors
        pytest.skip(f"Perfetto's trace_processor cannot run here: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    try:
        rows = list(tp.query("select count(*) as n from slice where category = 'tpudiag.finding'"))
        assert rows[0].n == summary.n_findings
        total = list(tp.query("select count(*) as n from slice"))[0].n
        assert total == len(slices(events))
    finally:
        tp.close()


def test_timestamps_keep_picosecond_resolution(example, example_trace):
    _, events = example_trace
    ops = slices(events, exclude=(FINDING_CATEGORY, STEP_CATEGORY, WINDOW_CATEGORY))
    durs = np.array([e["dur"] for e in ops]) * 1e6
    evs = np.concatenate([h.events.loc[h.events["step"] >= 0, "dur_ps"].to_numpy()
                          for h in example.analysis.profile.hosts])
    assert sorted(np.round(durs).astype(np.int64)) == sorted(evs.astype(np.int64))
