"""Program ids are unsigned 64-bit: every form a file stores them in reads to the same id."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpudiag.model.program_ids import as_int64, as_program_id

# jit_f in the real v6e capture (tests/fixtures/real): its `program_id` stat (uint64), the number
# in its module name, and its `/host:metadata` id (the same 64 bits read signed), read from the file.
JIT_F = 12190760917235803885
JIT_F_METADATA_ID = -6255983156473747731


def test_the_three_forms_of_a_real_id_agree():
    assert as_program_id(JIT_F) == JIT_F
    assert as_program_id(str(JIT_F)) == JIT_F
    assert as_program_id(JIT_F_METADATA_ID) == JIT_F
    assert as_program_id(np.uint64(JIT_F)) == JIT_F
    assert as_int64(JIT_F) == JIT_F_METADATA_ID


@given(st.integers(0, (1 << 64) - 1))
def test_signed_and_unsigned_readings_round_trip(pid):
    assert as_program_id(as_int64(pid)) == pid
    assert as_program_id(pid) == pid


@pytest.mark.parametrize("value", [1 << 64, -(1 << 63) - 1, "²", "1e3", True, float("nan"), 1.5, b"7", None])
def test_what_is_not_an_id(value):
    assert as_program_id(value) is None


@pytest.mark.parametrize(("value", "pid"), [(4242.0, 4242), (np.float64(0.0), 0), (np.float32(7.0), 7)])
def test_a_whole_double_is_the_id_it_holds(value, pid):
    # A double-valued stat holds a small id exactly (mutmut: the float branch was never taken).
    assert as_program_id(value) == pid


def test_the_signed_reading_turns_over_exactly_at_two_to_the_63():
    # Two's complement: the 64 bits of 2^63 read signed are -2^63 (INT64_MIN), of 2^63 - 1 the
    # largest int64. A round trip cannot see where the turn is (both readings move together), so
    # the edge is written out (mutmut: `>=` made `>`, and `_INT64_MIN <=` made `<`, survived it).
    assert as_int64(1 << 63) == -(1 << 63)
    assert as_int64((1 << 63) - 1) == (1 << 63) - 1
    assert as_program_id(-(1 << 63)) == 1 << 63
    assert as_program_id(-1) == (1 << 64) - 1
