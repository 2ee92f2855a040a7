"""An op's FLOP rate and HBM bandwidth are over its total time, not its self time (XProf's
definition, `op_metrics_to_record.h`), checked by design arithmetic alone: no xprof needed
(`tests/test_xprof_agreement.py` checks the same op against xprof where it is installed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import SMALL_OPS, small_design
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.parsers.capture import load_capture
from tpudiag.writers.tpu_design import write_capture


def test_a_parent_op_with_flops_and_a_nested_child_has_its_rates_over_total_time(tmp_path):
    # `while.1` (1,000 µs per step, on 2 chips x 5 steps) holds `fusion.5` (990 µs): its self time is
    # 10 µs. Given 2e11 FLOP and 4e8 B per occurrence, over its total time that is 200 TFLOP/s and
    # 400 GB/s; over its self time it would be 100x more, above the 918 TFLOP/s peak.
    ops = tuple(replace(op, flops=2.0e11, bytes_accessed=4.0e8) if op.name == "while.1" else op for op in SMALL_OPS)
    run = write_capture(small_design(ops=ops), tmp_path / "run")
    table = analyze(load_capture(run, jobs=1)).ops
    op = table[table["name"].astype(str) == "while.1"].iloc[0]
    assert op["occurrences"] == 10 and op["total_time_ps"] == 10 * 1000 * 10**6
    assert op["self_time_ps"] == 10 * 10 * 10**6
    assert op["flop_rate"] == pytest.approx(2.0e11 / 1e-3)
    assert op["hbm_bw"] == pytest.approx(4.0e8 / 1e-3)
    assert op["flop_utilization"] == pytest.approx(200 / 918)
