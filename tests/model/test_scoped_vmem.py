"""Issue 32: the two readings of an op's scoped VMEM come from one function, each named for its consumer.

Every committed LLO fixture has one SCOPED block per op, where the two agree; an op with two blocks
(built here, in the VMEM report's table form) is where they used to be computed apart and now differ by
name: the memory view compares the largest with the limit, the LLO ops table carries the sum.
"""

from __future__ import annotations

import dataclasses

from tests.parsers.test_llo_fixtures import _dump
from tpudiag.analysis.device_memory import vmem_from_llo
from tpudiag.model.llo import VMEM_ALLOCATIONS, scoped_vmem_per_op
from tpudiag.parsers.llo.ops import build_ops

MIB = 1 << 20


def _table():
    # (hlo, block, type, block bytes, allocation bytes): block 0 of fusion.7 holds two allocations
    # (2 and 1 MiB) and counts once, at its block size, though its two rows differ.
    rows = [("fusion.7", 0, "SCOPED", 3 * MIB, 2 * MIB), ("fusion.7", 0, "SCOPED", 3 * MIB, 1 * MIB),
            ("fusion.7", 1, "SCOPED", 1 * MIB, MIB), ("fusion.7", 2, "HLO_TEMPORARY", 5 * MIB, 5 * MIB),
            ("<top-inlining-caller>", 0, "SCOPED", 64 * MIB, 64 * MIB)]
    return VMEM_ALLOCATIONS.frame({
        "hlo": [r[0] for r in rows], "block": [r[1] for r in rows], "block_type": [r[2] for r in rows],
        "block_bytes": [r[3] for r in rows], "size_bytes": [r[4] for r in rows], "padding_bytes": [0] * len(rows),
        "shape": [""] * len(rows), "tag": [""] * len(rows), "is_spill": [False] * len(rows)})


def test_two_blocks_give_the_largest_to_the_limit_check_and_the_sum_to_the_ops_table():
    table = _table()
    scoped = scoped_vmem_per_op(table)
    assert set(scoped) == {"fusion.7"}  # the whole program's entry is not an op
    assert (scoped["fusion.7"].largest_bytes, scoped["fusion.7"].total_bytes) == (3 * MIB, 4 * MIB)

    dump = dataclasses.replace(_dump("v5e_mlp"), vmem_allocations=table)
    (use,) = vmem_from_llo(None, [dump])
    assert (use.op, use.scoped_bytes) == ("fusion.7", 3 * MIB)

    empty = dump.bundle_profile.iloc[0:0]
    ops = build_ops(programs=set(), bundle_profile=empty, static_profile=dump.static_profile.iloc[0:0],
                    spill_instructions=dump.spill_instructions.iloc[0:0], spill_slots=dump.spill_slots.iloc[0:0],
                    slot_programs=set(), bundle_programs=set(), schedule=dump.schedule.iloc[0:0],
                    vmem_allocations=table, has_vmem_report=True, utilization=(), schedules=(), register_pressure=())
    row = ops[ops["name"] == "fusion.7"].iloc[0]
    assert row["vmem_scoped_bytes"] == 4 * MIB and row["vmem_temporary_bytes"] == 5 * MIB
