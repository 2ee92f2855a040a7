"""VMEM out-of-memory compile errors, parsed into a budget table (real v5e texts, see
`tests/fixtures/llo/make_fixtures.py`), plus the near misses: other errors parse to None."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tpudiag.model.llo import VmemBudget
from tpudiag.parsers.llo import parse_vmem_oom
from tpudiag.parsers.llo.vmem_oom import size_bytes

OOM = Path(__file__).resolve().parent.parent / "fixtures" / "llo" / "vmem_oom"
MiB = 1 << 20


def test_scoped_limit_exceeded_by_f32_1024_blocks():
    """f32 1024^3 matmul blocks: 28 MiB of stack against v5e's default 16 MiB scoped limit."""
    budget = parse_vmem_oom((OOM / "scoped_v5e.txt").read_text())
    assert budget == VmemBudget(kind="scoped", hlo="f.1", limit_bytes=16 * MiB, used_bytes=28 * MiB,
                                exceeded_by_bytes=12 * MiB, message=budget.message)
    assert budget.used_bytes - budget.limit_bytes == budget.exceeded_by_bytes
    assert "Scoped allocation with size 28.00M" in budget.message


def test_capacity_exceeded_by_double_buffered_windows_lists_the_largest_allocations():
    """x + y with f32 (2048, 4096) blocks: three double-buffered 32 MiB windows, 192 MiB > 128 MiB."""
    budget = parse_vmem_oom((OOM / "window_capacity_v5e.txt").read_text())
    assert (budget.kind, budget.hlo) == ("capacity", "f.1")
    assert (budget.used_bytes, budget.limit_bytes, budget.exceeded_by_bytes) == (192 * MiB, 128 * MiB, 64 * MiB)
    assert budget.scoped_bytes == 192 * MiB
    assert [a.rank for a in budget.allocations] == [1, 2, 3]
    assert sum(a.size_bytes for a in budget.allocations) == budget.used_bytes
    first = budget.allocations[0]
    assert first.size_bytes == first.unpadded_size_bytes == 64 * MiB
    assert first.shape == "u8[67108864]{0}" and first.allocation_type == "scoped"
    assert first.operator == 'op_name="jit(f)/pallas_call"'
    assert first.tag.startswith("input window allocation for operator input 0.")
    assert "2 buffering levels" in first.tag
    assert budget.allocations[2].tag.startswith("output window allocation")
    assert first.xla_label.startswith("f.1 = custom-call(x.1, y.1)")


def test_single_allocation_over_capacity():
    """A 160 MiB scratch operand: libtpu reports exact byte sizes and the allocation itself."""
    budget = parse_vmem_oom((OOM / "scratch_capacity_v5e.txt").read_text())
    assert (budget.kind, budget.hlo) == ("allocation", "f.1")
    assert (budget.used_bytes, budget.limit_bytes) == (160 * MiB, 128 * MiB)
    assert budget.exceeded_by_bytes == 32 * MiB
    [alloc] = budget.allocations
    assert alloc.shape == "f32[40960,1024]{1,0:T(8,128)}" and alloc.tag == "scratch operand"


def test_other_errors_are_not_vmem_budgets():
    assert parse_vmem_oom("") is None
    # Near misses: an HBM OOM and a scoped message without the numbers.
    assert parse_vmem_oom("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.00G of 16.00G hbm.") is None
    assert parse_vmem_oom("E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem") is None


def test_size_units_are_binary():
    assert size_bytes("28.00", "M") == 28 * MiB
    assert size_bytes("1.50", "G") == 3 * (1 << 29)
    assert size_bytes("512", "") == 512
    assert size_bytes("2", "K") == 2048


@given(st.text(max_size=400))
def test_random_text_parses_to_none_or_a_budget(text):
    result = parse_vmem_oom(text)
    assert result is None or isinstance(result, VmemBudget)


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_numbers_round_trip_through_the_scoped_message(used_cents, limit_cents):
    used, limit = used_cents / 100, limit_cents / 100
    text = (f"Scoped allocation with size {used:.2f}M and limit {limit:.2f}M exceeded scoped vmem limit by "
            f"{max(used - limit, 0):.2f}M.")
    budget = parse_vmem_oom(text)
    assert budget.used_bytes == round(used * MiB) and budget.limit_bytes == round(limit * MiB)
