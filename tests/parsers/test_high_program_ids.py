"""Regression (issue 35): program ids of 2^63 or more were read as 0, so executions of different
programs merged into one step sequence, embedded HLO got negative ids and joins failed."""

from __future__ import annotations

from tests.programs_capture import HIGH_ID, OTHER_HIGH_ID, US, Execution, write_programs_capture
from tpudiag.parsers.capture import load_capture


def _two_programs(tmp_path):
    chip = [Execution("jit_f", HIGH_ID, i * 1000 * US, 900 * US) for i in range(4)]
    chip += [Execution("jit_g", OTHER_HIGH_ID, 5000 * US, 100 * US, op="other")]
    return load_capture(write_programs_capture(tmp_path, [chip])).hosts[0]


def test_ids_above_int64_are_kept_on_ops_modules_and_embedded_hlo(tmp_path):
    host = _two_programs(tmp_path)
    assert set(host.events["program_id"].tolist()) == {HIGH_ID, OTHER_HIGH_ID}
    assert set(host.modules["program_id"].tolist()) == {HIGH_ID, OTHER_HIGH_ID}
    assert set(host.op_metadata["program_id"].tolist()) == {HIGH_ID, OTHER_HIGH_ID}
    assert sorted(host.hlo_protos) == sorted([HIGH_ID, OTHER_HIGH_ID])  # keyed -6255... in the file
    assert not any("program_id" in w or "lack program_id" in w for w in host.warnings), host.warnings


def test_executions_of_different_programs_do_not_merge(tmp_path):
    host = _two_programs(tmp_path)
    per_program = host.modules.groupby("program_id")["module"].agg(lambda m: set(m.astype(str)))
    assert per_program.to_dict() == {HIGH_ID: {"jit_f"}, OTHER_HIGH_ID: {"jit_g"}}
