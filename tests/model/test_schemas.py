"""`TableSchema.frame`: an `owned` frame keeps its new columns as they are, and equals the frame
pandas' constructor builds from the same columns, dtypes and categories included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpudiag.model import schemas


def _columns(n: int) -> dict[str, object]:
    rng = np.random.default_rng(5)
    return {"step": rng.integers(-1, 50, n), "program_id": rng.integers(0, 2**63, n).astype(np.uint64),
            "name": pd.Categorical.from_codes(rng.integers(0, 3, n), categories=["a", "b", "c"]),
            "self_ps": rng.integers(0, 10**9, n)}


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_owned_frame_equals_the_constructors(n):
    owned = schemas.OP_STEP_SUMS.frame(_columns(n), owned=True)
    pd.testing.assert_frame_equal(owned, schemas.OP_STEP_SUMS.frame(_columns(n)), check_exact=True)
    schemas.OP_STEP_SUMS.require(owned)


def test_owned_frame_does_not_copy_its_columns():
    cols = _columns(1000)
    owned = schemas.OP_STEP_SUMS.frame(cols, owned=True)
    if schemas._blocks_constructor() is None:
        pytest.skip("pandas without pandas.api.internals (before 3.0) copies, as the constructor does")
    for name in ("step", "program_id", "self_ps"):
        assert np.shares_memory(owned[name].to_numpy(), cols[name])


def test_only_numeric_and_categorical_columns_are_kept_as_blocks():
    # An object array of strings is inferred by the constructor (pandas 3: `str`), and a string
    # array is an extension array of its own: frames with either take the constructor.
    n = np.arange(3)
    assert schemas._blockable({"a": n, "b": pd.Categorical(["x", "y", "x"])})
    assert not schemas._blockable({"a": n, "b": np.array(["x", "y", "x"], dtype=object)})
    assert not schemas._blockable({"a": n, "b": pd.array(["x", "y", "x"], dtype="string")})
    assert not schemas._blockable({"a": n, "b": np.arange(4)})  # lengths differ: the constructor says so
