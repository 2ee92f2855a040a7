"""`tpudiag simulate`: a modelled capture from a compiled program, checked against itself and xprof.

The compile output used is `tests/compiler/fixtures/v5e_mlp_compile/`: a real `tpudiag compile`
of a small FSDP x tensor-parallel MLP step for v5e:2x2 (async all-gather, reduce-scatter fusion,
sync all-reduces, MSA prefetch copies), so these tests need no libtpu.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tpudiag.parsers.compile_output import load_compile_output
from tpudiag.analysis.cost_model import IciModel
from tpudiag.compiler.simulate import build_timeline, simulate
from tpudiag.errors import UsageError
from tpudiag.parsers.capture import load_capture

COMPILED = Path(__file__).resolve().parent / "compiler" / "fixtures" / "v5e_mlp_compile"
NS = 1000  # ps


def estimates(rows: list[tuple[str, str, str, int, int]]) -> pd.DataFrame:
    """(name, async_role, partner, duration_ps, window_ps) rows -> the columns build_timeline reads."""
    return pd.DataFrame({
        "name": [r[0] for r in rows], "async_role": [r[1] for r in rows], "partner": [r[2] for r in rows],
        "family": ["all-gather" if r[1] else "" for r in rows],
        "duration_ps": [r[3] for r in rows], "window_ps": [r[4] for r in rows]})


def test_async_done_waits_only_for_the_part_of_the_transfer_not_covered():
    tl = build_timeline(estimates([
        ("ag-start", "start", "ag-done", 10 * NS, 100 * NS),  # transfer ready at 110 ns
        ("fusion.1", "", "", 30 * NS, 0),  # runs 10-40 ns, under the transfer
        ("fusion.2", "", "", 30 * NS, 0),  # 40-70 ns
        ("ag-done", "done", "ag-start", 10 * NS, 0),  # from 70 ns: waits until 110 ns
    ]))
    assert [(p.op, p.offset_ps, p.dur_ps) for p in tl.placed] == [
        ("ag-start", 0, 10 * NS), ("fusion.1", 10 * NS, 30 * NS), ("fusion.2", 40 * NS, 30 * NS),
        ("ag-done", 70 * NS, 40 * NS)]
    assert [(w.op, w.offset_ps, w.dur_ps) for w in tl.windows] == [("ag-start", 0, 110 * NS)]
    assert tl.step_ps == 110 * NS


def test_a_fully_hidden_transfer_costs_the_done_only_its_own_time():
    tl = build_timeline(estimates([
        ("cp-start", "start", "cp-done", 10 * NS, 20 * NS),
        ("fusion.1", "", "", 500 * NS, 0),  # longer than the transfer: it is hidden
        ("cp-done", "done", "cp-start", 10 * NS, 0),
    ]))
    assert tl.placed[-1].dur_ps == 10 * NS
    assert tl.windows[0].dur_ps == 520 * NS
    assert tl.step_ps == sum(p.dur_ps for p in tl.placed)


def test_ring_factors():
    assert IciModel.factor("all-reduce", 4) == pytest.approx(1.5)
    assert IciModel.factor("all-gather", 4) == pytest.approx(0.75)
    assert IciModel.factor("reduce-scatter", 2) == pytest.approx(0.5)
    assert IciModel.factor("collective-permute", 8) == 1.0
    assert IciModel.factor("all-reduce", 1) == 0.0  # one participant moves nothing
    model = IciModel(bytes_per_s=100e9, latency_ps=2_000_000)
    assert model.collective_ps("all-reduce", 1_000_000, 2) == 2_000_000 + 10_000_000  # 1 MB x 1 / 100 GB/s


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("sim") / "logdir"
    path, timeline, model = simulate(load_compile_output(COMPILED), logdir, steps=3)
    return path, timeline, model


def test_timeline_follows_the_compiled_schedule(simulated):
    _, timeline, _ = simulated
    output = load_compile_output(COMPILED)
    program = output.program
    positions = [program.instruction(p.op).position for p in timeline.placed]
    assert positions == sorted(positions)
    ends = [p.offset_ps + p.dur_ps for p in timeline.placed]
    assert [p.offset_ps for p in timeline.placed[1:]] == ends[:-1]  # back to back
    pairs = {(w.op) for w in timeline.windows}
    assert "async-collective-start" in pairs  # the v5e async all-gather overlaps its continuations
    assert any(op.startswith("copy-start") for op in pairs)


def test_op_times_follow_the_stated_model(simulated):
    _, timeline, model = simulated
    ops = timeline.ops.set_index("name")
    fusion = ops.loc["fusion.1"]  # a matmul fusion the static profile estimates
    assert fusion["cycles_source"] == "bundle_analysis_data"
    assert fusion["placed_ps"] == max(int(fusion["estimated_cycles"] / 1.5e9 * 1e12), int(fusion["hbm_ps"]))
    # v5e async_collective_fusion continuations get 0 cycles from the profile: the classic estimate is used
    continuation = ops.loc["fusion.49"]
    assert continuation["cycles_source"] == "window_config" and continuation["estimated_cycles"] > 0
    reduce = ops.loc["all-reduce"]  # sync: its whole modelled ICI time is on the timeline
    n, payload = int(reduce["group_size"]), int(reduce["payload_bytes"])
    assert reduce["placed_ps"] == model.ici.collective_ps("all-reduce", payload, n)
    assert (timeline.ops["placed_ps"] >= model.min_op_ps).all()


def test_capture_reads_back_as_modelled_with_the_designed_times(simulated):
    path, timeline, _ = simulated
    profile = load_capture(path.parent)
    assert profile.modelled
    host = profile.hosts[0]
    assert host.device.n_cores == 4 and host.device.device_type == "TPU v5 Lite"
    events = host.events
    per_op = events.groupby("name", observed=True)["dur_ps"].agg(["count", "sum"])
    for p in timeline.placed:
        assert per_op.loc[p.op, "count"] == 4 * 3  # 4 chips x 3 steps
        assert per_op.loc[p.op, "sum"] == 4 * 3 * p.dur_ps
    assert len(host.hlo_protos) == 1  # the optimised module is embedded for XProf's HLO tools
    assert len(host.async_windows) == 4 * 3 * len(timeline.windows)


def test_ordinary_designed_captures_are_not_modelled(small_capture):
    assert not load_capture(small_capture).modelled


def test_v6e_needs_a_stated_clock(tmp_path):
    copy = tmp_path / "v6e"
    shutil.copytree(COMPILED, copy)
    facts = json.loads((copy / "result.json").read_text())
    facts.update(generation="v6e", device_kind="TPU v6 lite")
    (copy / "result.json").write_text(json.dumps(facts))
    with pytest.raises(UsageError, match="v6e clock is not public") as info:
        simulate(load_compile_output(copy), tmp_path / "logdir")
    assert "--clock-ghz" in info.value.hint
    path, _, model = simulate(load_compile_output(copy), tmp_path / "logdir", clock_ghz=2.0)
    assert model.clock_hz == 2.0e9 and path.is_file()


@pytest.mark.xprof
def test_xprof_hlo_stats_report_the_times_tpudiag_wrote(simulated, tmp_path):
    path, timeline, _ = simulated
    run_copy = tmp_path / "run"
    shutil.copytree(path.parent, run_copy)  # xprof writes cache files next to the trace
    exe = Path(sys.executable).with_name("xprof")
    proc = subprocess.run([str(exe), "get_hlo_stats", str(run_copy), "--limit", "1000"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {r["op_name"]: r for r in json.loads(proc.stdout)["records"]}
    assert set(records) == {p.op for p in timeline.placed}
    for p in timeline.placed:
        rec = records[p.op]
        assert rec["occurrences"] == 12, p.op
        assert rec["total_time_us"] == pytest.approx(12 * p.dur_ps / 1e6, rel=1e-9, abs=1e-6), p.op
        assert rec["total_self_time_us"] == pytest.approx(12 * p.dur_ps / 1e6, rel=1e-9, abs=1e-6), p.op


@pytest.mark.parametrize(("name", "clock_ghz"), [("transformer_train_v5e", None), ("llm_decode_v6e", 2.6)])
def test_committed_example_captures_are_what_simulate_writes(name, clock_ghz, tmp_path):
    """examples/models/regenerate.py's captures are reproducible from the committed dumps."""
    models = Path(__file__).resolve().parents[1] / "examples" / "models"
    path, _, _ = simulate(load_compile_output(models / "dumps" / name), tmp_path / "logdir", clock_ghz=clock_ghz)
    committed = models / "captures" / name / "plugins" / "profile" / "modelled" / "modelled.xplane.pb"
    assert path.read_bytes() == committed.read_bytes()


@pytest.mark.parametrize("clock_hz", [None, 1.5e9, 1e12])
def test_no_op_is_timed_below_its_flops_roofline(clock_hz):
    """No clock (a plain `--xla_dump_to` dump has no cycles either), the public clock, and a clock so
    fast the compiler's cycles take almost no time: a matmul is never timed by its bytes alone nor
    faster than the core's peak, and the compiler's estimate stands where it is slower."""
    from tpudiag.analysis.cost_model import CostModel, op_estimates
    from tpudiag.model.hardware import chip_for

    output = load_compile_output(COMPILED)
    model = dataclasses.replace(CostModel.for_chip(chip_for("v5e")), clock_hz=clock_hz)
    ops = op_estimates(output.program, model, 4, output.group_sizes, output.spills, output.matmul_flops)
    plain = ops[ops["async_role"] == ""].set_index("name")
    assert (plain["flops_ps"] == (plain["flops"] / 197e12 * 1e12).astype("int64")).all()
    assert (plain["duration_ps"] >= plain["flops_ps"]).all()
    fusion = plain.loc["fusion.1"]  # a matmul fusion the static profile estimates
    assert fusion["flops"] > 0
    if clock_hz == 1.5e9:
        assert fusion["duration_ps"] == max(fusion["compute_ps"], fusion["hbm_ps"]) > fusion["flops_ps"]
    else:
        assert fusion["duration_ps"] == max(fusion["flops_ps"], fusion["hbm_ps"])
