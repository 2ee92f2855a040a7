"""The static report and its pieces, on committed compile outputs (no libtpu needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from tpudiag.compiler.driver import compiler_error_line
from tpudiag.parsers.compile_output import load_compile_output
from tpudiag.model.collectives import replica_group_size
from tpudiag.compiler.static_report import build_static_report
from tpudiag.render.static_report import render_static_terminal, static_report_dict

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps"


@pytest.fixture(scope="module")
def mlp_report():
    return build_static_report(load_compile_output(FIXTURES / "v5e_mlp_compile"))


def test_clock_and_cycles_on_v5e(mlp_report):
    assert mlp_report.clock_hz == 1.5e9 and "public v5e peaks" in mlp_report.clock_note
    ops = mlp_report.ops
    estimated = ops[ops["estimated_cycles"].notna() & (ops["estimated_cycles"] > 0)]
    assert len(estimated) >= 5
    assert (estimated["compute_ps"] == (estimated["estimated_cycles"] / 1.5e9 * 1e12).astype(int)).all()
    assert mlp_report.total_cycles == int(ops["estimated_cycles"].fillna(0).sum())


def test_a_given_clock_is_called_given_through_the_pipeline():
    """`report DUMPS --clock-ghz 1.2` on v5e: the note must not call the user's 1.2 GHz the public one."""
    import tpudiag

    given = tpudiag.diagnose(FIXTURES / "v5e_mlp_compile", clock_ghz=1.2).static
    assert given.clock_hz == 1.2e9 and given.clock_note == "1.2 GHz (given with --clock-ghz)"
    default = tpudiag.diagnose(FIXTURES / "v5e_mlp_compile").static
    assert default.clock_note == "1.5 GHz (implied by public v5e peaks)"


def test_collective_schedule_on_v5e(mlp_report):
    steps = {c.name: c for c in mlp_report.collectives}
    ag = steps["async-collective-start"]  # v5e: async all-gather with continuations between
    assert (ag.mode, ag.family, ag.done) == ("async", "all-gather", "async-collective-done")
    assert ag.ops_between > 0 and ag.modelled_ps > 0
    assert steps["fusion"].family == "reduce-scatter" and steps["fusion"].mode == "sync"
    assert steps["all-reduce"].mode == "sync" and steps["all-reduce"].group_size == 2
    positions = [c.start_position for c in mlp_report.collectives]
    assert positions == sorted(positions)


def test_v6e_shows_cycles_only_and_says_why():
    report = build_static_report(load_compile_output(MODELS / "transformer_train_v6e"))
    assert report.clock_hz is None and "not public" in report.clock_note
    assert report.total_compute_ps is None and report.ops["compute_ps"].isna().all()
    assert report.total_cycles > 0
    given = build_static_report(load_compile_output(MODELS / "transformer_train_v6e"), clock_ghz=2.0)
    assert given.total_compute_ps == pytest.approx(given.total_cycles / 2.0e9 * 1e12, rel=1e-3)


def test_padding_lists_only_real_waste_worst_first():
    report = build_static_report(load_compile_output(MODELS / "llm_decode_v5e"))
    waste = [p.padded_bytes - p.logical_bytes for p in report.padding]
    assert waste and all(w >= 4096 for w in waste) and waste == sorted(waste, reverse=True)


def test_json_and_terminal_render(mlp_report):
    doc = json.loads(json.dumps(static_report_dict(mlp_report)))
    assert doc["kind"] == "tpudiag.static_report" and doc["basis"].startswith("modelled")
    assert len(doc["ops"]) == len(mlp_report.ops) and doc["collectives"]
    console = Console(width=160, record=True, color_system=None)
    render_static_terminal(mlp_report, console, top=5)
    text = console.export_text()
    assert "Clock: 1.5 GHz (implied by public v5e peaks)" in text
    assert "Collective schedule" in text and "`async-collective-start`" in text


@pytest.mark.parametrize(("line", "size"), [
    ("  %ar = f32[8]{0} all-reduce(%x), replica_groups={{0,1},{2,3}}, to_apply=%add", 2),
    ("  %ag = f32[8]{0} all-gather(%x), replica_groups=[2,4]<=[8], dimensions={0}", 4),
    ("  %ar = f32[8]{0} all-reduce(%x), replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, to_apply=%a", 4),
    ("  %ar = f32[8]{0} all-reduce(%x), replica_groups=mesh['a'=2,'b'=4] {'a','b'}, to_apply=%a", 8),
])
def test_replica_group_sizes_in_every_printed_form(line, size):
    assert replica_group_size(line) == size


def test_compiler_error_line_prefers_the_glog_fatal_line():
    stderr = ("I1129 22:10:00.000001  123 foo.cc:1] starting\n"
              "F1129 22:10:00.123456  1234 llo_dumper.cc:1585] Static LLO profiling of fusion.3 failed: "
              "INVALID_ARGUMENT: Dma latency model is currently only supported on VF/VL/GF/GL.\n"
              "*** Check failure stack trace: ***\n")
    assert compiler_error_line(stderr) == ("Static LLO profiling of fusion.3 failed: INVALID_ARGUMENT: Dma latency "
                                           "model is currently only supported on VF/VL/GF/GL. (llo_dumper.cc:1585)")
    assert compiler_error_line("E... RESOURCE_EXHAUSTED: out of vmem\n") == "E... RESOURCE_EXHAUSTED: out of vmem"
    assert compiler_error_line("nothing useful\n") is None


@pytest.mark.parametrize("dump", [FIXTURES / "v5e_mlp_compile", MODELS / "transformer_train_v5e",
                                  MODELS / "transformer_train_v6e"])
def test_matmul_flops_agree_with_the_compilers_cost_analysis(dump):
    """Dots and convolutions (batched dots written as lhs-dilated windows included) carry the
    FLOPs of these matmul-dominated programs: within 5 % of XLA's own per-device count, and not above
    it, since XLA counts elementwise work too (counting padding taps of a batched dot's window put the
    transformer 2 % above it)."""
    output = load_compile_output(dump)
    report = build_static_report(output)
    assert report.ops["flops"].sum() == pytest.approx(output.facts["flops"], rel=0.05)
    assert report.ops["flops"].sum() <= output.facts["flops"]
