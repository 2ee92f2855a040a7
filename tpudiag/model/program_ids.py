"""XLA program ids: unsigned 64-bit fingerprints, however a file stores them.

XProf writes a program's id as the `program_id` stat (`uint64_value`), as the number in a module
name (`jit_f(12190760917235803885)`) and as the id of its `/host:metadata` event metadata, an
int64 that holds the same 64 bits read signed (`-6255983156473747731` for the id above). Half of
all fingerprints are 2^63 or more, so an id is never a signed int64: each of these forms reads to
the same non-negative int below 2^64, which the tables keep as `uint64`.
"""

from __future__ import annotations

import numpy as np

UINT64_LIMIT = 1 << 64
_INT64_MIN = -(1 << 63)


def as_program_id(value) -> int | None:
    """The program id (0 <= id < 2^64) a stat value, module-name number or metadata id holds; None
    when it holds none. A negative int64 is the id's 64 bits read signed and reads back unsigned.

    Strings must be ASCII digits: `str.isdigit` also accepts `²`, which `int()` rejects.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, (float, np.floating)):
        if not np.isfinite(value) or value != int(value):
            return None
        v = int(value)  # a double holds small ids exactly; a 64-bit fingerprint only approximately
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        v = int(value.strip())
    else:
        return None
    if _INT64_MIN <= v < 0:
        return v + UINT64_LIMIT
    return v if 0 <= v < UINT64_LIMIT else None


def as_int64(program_id: int) -> int:
    """The id as XProf keys `/host:metadata` (the same 64 bits read as a signed int64)."""
    return program_id - UINT64_LIMIT if program_id >= 1 << 63 else program_id
