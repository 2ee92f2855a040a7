"""`analysis.programs.program_times` on hand-made `XLA Modules` tables: each program's executions,
cores, device time, mean and share, the step program marked, SparseCore planes left out, the
order by device time. Expected values are the module lines' own arithmetic, worked by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpudiag.analysis.programs import program_times
from tpudiag.model import schemas
from tpudiag.model.profile import StepKind, StepSource
from tpudiag.model.report import ProgramTime


def _host(host: str, rows: list[tuple[str, int, int, str, int]]) -> SimpleNamespace:
    """A host whose `XLA Modules` lines hold (device, core, program_id, module, dur_ps) executions."""
    cols = list(zip(*rows)) if rows else [[]] * 5
    n = len(rows)
    modules = schemas.MODULES.frame({"host": [host] * n, "device": list(cols[0]), "core": list(cols[1]),
                                     "program_id": list(cols[2]), "module": list(cols[3]),
                                     "start_ps": list(range(n)), "dur_ps": list(cols[4])}, length=n)
    return SimpleNamespace(host=host, modules=modules)


TPU0, TPU1 = "/device:TPU:0", "/device:TPU:1"


def test_programs_over_hosts_and_cores_by_device_time():
    h0 = _host("h0", [
        (TPU0, 0, 7, "jit_train", 100), (TPU0, 0, 7, "jit_train", 110), (TPU0, 0, 7, "jit_train", 90),
        (TPU1, 1, 7, "jit_train", 100), (TPU1, 1, 7, "jit_train", 100),
        (TPU0, 0, 3, "jit_init", 50),
        ("/device:TPU:0 SparseCore 0", 2, 7, "jit_train", 10_000),  # SparseCore planes are left out
    ])
    h1 = _host("h1", [(TPU0, 0, 7, "jit_train", 100), (TPU0, 0, 9, "jit_eval", 50)])
    steps = [StepSource(StepKind.XLA_MODULES, module="jit_train", program_id=7),
             StepSource(StepKind.STEPS_LINE, module="jit_eval", program_id=9)]  # not a module-line step
    train, init, eval_ = program_times([h0, h1], steps)
    # jit_train: 3 executions on h0's core 0 (the most), 2 on core 1, 1 on h1: 3 cores, 600 ps of 700
    assert train == ProgramTime(module="jit_train", program_id=7, executions=3, cores=3, time_ps=600,
                                mean_ps=100.0, share=pytest.approx(600 / 700), step=True)
    # equal device time (50): by program id
    assert init == ProgramTime("jit_init", 3, 1, 1, 50, 50.0, pytest.approx(50 / 700), False)
    assert eval_ == ProgramTime("jit_eval", 9, 1, 1, 50, 50.0, pytest.approx(50 / 700), False)
    assert all(isinstance(v, int) for v in (train.program_id, train.executions, train.cores, train.time_ps))


def test_one_core_per_host_counts_as_two_cores():
    # core 0 on two hosts is two cores
    p, = program_times([_host("h0", [(TPU0, 0, 1, "m", 10)]), _host("h1", [(TPU0, 0, 1, "m", 30)])], [])
    assert (p.cores, p.executions, p.time_ps, p.mean_ps, p.share) == (2, 1, 40, 20.0, 1.0)


def test_one_module_name_under_two_program_ids_is_two_programs():
    a, b = program_times([_host("h0", [(TPU0, 0, 1, "m", 10), (TPU0, 0, 2, "m", 30), (TPU0, 0, 2, "m", 30)])],
                         [StepSource(StepKind.XLA_MODULES, module="m", program_id=1)])
    assert (a.program_id, a.executions, a.step) == (2, 2, False)
    assert (b.program_id, b.step) == (1, True)


def test_equal_time_and_id_go_by_module_name():
    names = [p.module for p in program_times([_host("h0", [(TPU0, 0, 1, "b", 10), (TPU0, 0, 1, "a", 10)])], [])]
    assert names == ["a", "b"]


def test_large_program_ids_stay_unsigned():
    big = 2 ** 63 + 5
    p, = program_times([_host("h0", [(TPU0, 0, big, "m", 10)])], [StepSource(StepKind.XLA_MODULES, "m", big)])
    assert p.program_id == big and p.step


def test_no_module_lines_no_programs():
    assert program_times([], []) == ()
    assert program_times([_host("h0", [])], []) == ()
    assert program_times([_host("h0", [("/device:TPU:0 SparseCore 1", 0, 1, "m", 10)])], []) == ()


def test_executions_of_zero_time_share_nothing():
    p, = program_times([_host("h0", [(TPU0, 0, 1, "m", 0)])], [])
    assert (p.time_ps, p.share, p.executions) == (0, 0.0, 1)
