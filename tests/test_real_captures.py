"""Real captures made by others (`tests/fixtures/real/`): what tpudiag derives from them is true.

Two kinds of assertion per capture: (a) numbers the installed `xprof` also computes, with its CLI
run on a scratch copy as the oracle; (b) facts established by hand from the file, each with a
comment saying how. Issue 35: program ids >= 2^63 were dropped on this capture, its steps merged
four programs, and a device-idle finding was false.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import run_tpudiag
from tests.conftest import REPO, US
from tests.rules.scenarios import run_rules
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.parsers.capture import load_capture
from tpudiag.render.json_format import render_json
from tpudiag.report_builder import build_report

V6E = REPO / "tests" / "fixtures" / "real" / "tpu-v6e-hostoffload-inference" / "trace" / "plugins" / "profile" / "run"
MS = 1000 * US


@pytest.fixture(scope="module")
def v6e():
    analysis = analyze(load_capture(V6E, jobs=1))
    return analysis, build_report(analysis)


def _xprof(tool: str, run: Path, *args: str) -> dict:
    exe = Path(sys.executable).with_name("xprof")
    if not exe.exists():
        pytest.skip("the xprof CLI is not installed")
    out = subprocess.run([str(exe), tool, str(run), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def v6e_scratch(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("real-v6e") / "plugins" / "profile" / "run"
    shutil.copytree(V6E, run)  # xprof writes ALL_HOSTS.op_stats_v2.pb beside the trace
    return run


# -- (a) what xprof computes too ----------------------------------------------------------------------

@pytest.mark.xprof
def test_v6e_ops_equal_xprof_op_by_op_with_their_program_ids(v6e, v6e_scratch):
    analysis, _ = v6e
    theirs = {r["op_name"]: r for r in _xprof("get_hlo_stats", v6e_scratch, "--limit", "1000")["records"]}
    ours = analysis.ops.groupby("name", observed=True).agg(
        occurrences=("occurrences", "sum"), total=("total_time_ps", "sum"), self_ps=("self_time_ps", "sum"),
        program_id=("program_id", "first"))
    assert len(theirs) == 17 and set(theirs) == set(ours.index)
    for name, rec in theirs.items():
        op = ours.loc[name]
        assert op["occurrences"] == rec["occurrences"], name
        assert op["total"] / US == pytest.approx(rec["total_time_us"], rel=1e-9), name
        assert op["self_ps"] / US == pytest.approx(rec["total_self_time_us"], rel=1e-9), name
        # Unsigned ids (3 of 4 are >= 2^63), read from the uint64 column, not the float row.
        assert int(ours.at[name, "program_id"]) == int(rec["program_id"]), name


@pytest.mark.xprof
def test_v6e_programs_device_and_steps_as_xprof_sees_them(v6e, v6e_scratch):
    _, report = v6e
    modules = _xprof("list_hlo_modules", v6e_scratch)["modules"]
    assert sorted(f"{p.module}({p.program_id})" for p in report.programs) == sorted(modules)
    env = _xprof("get_overview", v6e_scratch)["run_environment"]
    assert (env["device_type"], int(env["device_core_count"])) == (report.summary.device_type, report.summary.n_cores)
    # xprof derives no steps without a Steps line (NO_DATA): the step facts below are established by hand.
    assert _xprof("get_step_trace", v6e_scratch)["step_breakdown"] == []


# -- (b) facts established by hand from the file ---------------------------------------------------------

def test_v6e_the_step_is_jit_f_100_times(v6e):
    # By hand: the four `XLA Modules` lines hold jit_f 100 times on each chip, jit__psum 3 times on
    # each, jit_broadcast_in_dim and jit_convert_element_type once on TPU:0; jit_f holds 99.4 % of
    # module time. Per step, the slowest chip's jit_f execution (XProf's max over cores), over the
    # 100 steps: mean 850.188 ms, median 784.368 ms (numpy over the events' duration_ps).
    _, report = v6e
    s = report.summary
    assert (s.step_program, s.step_time.count) == ("jit_f", 100)
    assert s.step_time.mean_ps / MS == pytest.approx(850.19, abs=0.005)
    assert s.step_time.p50_ps / MS == pytest.approx(784.37, abs=0.005)
    assert (s.device_type, s.n_chips, s.n_cores) == ("TPU v6 Lite", 4, 4)


def test_v6e_other_programs_are_listed_beside_the_step(v6e):
    # By hand, as above: (module, executions on the chip that ran it most, chips that ran it).
    _, report = v6e
    rows = [(p.module, p.executions, p.cores, p.step) for p in report.programs]
    assert rows == [("jit_f", 100, 4, True), ("jit__psum", 3, 4, False), ("jit_broadcast_in_dim", 1, 1, False),
                    ("jit_convert_element_type", 1, 1, False)]


def test_v6e_ops_of_other_programs_have_no_per_step_time(v6e):
    # By hand from the XLA Ops line: `all-reduce` runs only inside `jit__psum` (3 executions) and
    # `broadcast.2` only inside `jit_broadcast_in_dim` (1): neither runs in any of jit_f's 100 steps,
    # so a per-step figure (its share of core time x jit_f's step) would be a time it never takes there.
    _, report = v6e
    rows = {op.name: op for op in report.ops}
    for name, program in (("all-reduce", "jit__psum"), ("broadcast.2", "jit_broadcast_in_dim")):
        op = rows[name]
        assert op.program == program and op.outside_steps and op.step_self_time_ps is None, name
        assert op.time_cell == "outside steps"
    inside = [op for op in report.ops if op.program == "jit_f"]
    assert inside and not any(op.outside_steps for op in inside)
    assert all(op.step_self_time_ps is not None for op in inside)


def test_v6e_header_names_the_step_program(v6e):
    from rich.console import Console

    from tpudiag.render.terminal import render_terminal

    console = Console(width=110, record=True, color_system=None)
    render_terminal(v6e[1], console)
    out = console.export_text()
    assert "Steps: 100 (jit_f) · step time mean 850.19 ms, p50 784.37 ms" in out
    assert "jit__psum" in out and "jit_broadcast_in_dim" in out and "jit_convert_element_type" in out
    from tpudiag.render.markdown import render_markdown

    md = render_markdown(v6e[1])
    assert "## Programs" in md and "| `jit_f` | 12190760917235803885 | 100 | 4 |" in md
    assert "A step is one execution of `jit_f`" in md


def test_v6e_jit_f_runs_back_to_back_so_no_device_idle(v6e):
    # By hand: consecutive jit_f executions on a chip are 0 to 1.37 µs apart (median ~1.1 µs), and
    # each is covered by its ops; the device is not idle between steps.
    analysis, _ = v6e
    findings, _ = run_rules(analysis, None)
    assert "device-idle" not in {f.rule for f in findings}


def test_v6e_busiest_core_is_tpu1(v6e):
    # By hand: summed `device_duration_ps` of each chip's `XLA Ops` events: TPU:0 78,783.72 ms,
    # TPU:1 78,788.30 ms, TPU:2 78,780.80 ms, TPU:3 78,765.08 ms; TPU:1's mean jit_f (784.244 ms)
    # is the longest too.
    analysis, _ = v6e
    per_core = analysis.digests["tpu_inference_2"].op_cores.groupby("device", observed=True)["self_ps"].sum()
    assert per_core.idxmax() == "/device:TPU:1"
    mean_step = analysis.steps.groupby("device", observed=True)["dur_ps"].mean()
    assert mean_step.idxmax() == "/device:TPU:1"


def test_v6e_no_program_id_is_negative_or_dropped(v6e):
    analysis, report = v6e
    doc = json.loads(render_json(report))
    ids = {o["program_id"] for o in doc["ops"]} | {p["program_id"] for p in doc["programs"]}
    # By hand: the four ids in the module names, e.g. jit_f(12190760917235803885).
    assert ids == {12190760917235803885, 9646411105960254074, 11287434908481120160, 2433868464432466958}
    assert not any("program_id" in w for w in report.warnings), report.warnings
    assert 0 not in set(analysis.ops["program_id"].tolist())


def test_v6e_memory_view_prints_no_negative_program_id():
    proc = run_tpudiag("memory", V6E, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # Output that is not a terminal is 140 columns wide: a long checkout path wraps "program N".
    flat = " ".join(proc.stdout.split())
    ids = [int(m) for m in re.findall(r"program (-?\d+)", flat)]
    assert ids and all(i > 0 for i in ids)
    assert "program 12190760917235803885" in flat  # jit_f, its /host:metadata id read unsigned


def test_v6e_embedded_hlo_joins_every_op_by_its_unsigned_program_id():
    # Regression: with ids >= 2^63 read as 0 (ops) and negative (embedded HLO), the programs could
    # not join by id. By hand: the file embeds the four programs' HloProtos in `/host:metadata`.
    import tpudiag

    d = tpudiag.diagnose(V6E, jobs=1)
    assert d.join is not None and d.join.n_ops == 17
    assert set(d.join.columns["hlo_match"].astype(str)) == {"program_id"}
    assert sorted(h.program.program_id for h in d.compiled.embedded) == sorted(
        [12190760917235803885, 9646411105960254074, 11287434908481120160, 2433868464432466958])


def test_v6e_host_offload_copies_are_not_reproduced_as_hbm_copies():
    # By hand from the embedded HLO: copy-start.4's operand is `f32[5,1024,1024,256]{...S(5)}` (host
    # memory) and its result in HBM; each copy moves 5 GiB at ~27 GB/s over the host link. A repro on
    # one chip would copy HBM -> HBM at ~1.6 TB/s: not the op.
    import tpudiag
    from tpudiag.kernels_lab.spec import NotReproducible, spec_from_diagnosis

    d = tpudiag.diagnose(V6E)
    for op in ("copy-start.4", "copy-done.4"):
        with pytest.raises(NotReproducible, match="host link"):
            spec_from_diagnosis(d, op)
    assert spec_from_diagnosis(d, "broadcast_add_fusion").family == "elementwise"
