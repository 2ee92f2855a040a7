"""The bundled example: a capture of the transformer training step on v5e and its compiler dumps.

One place says where they are, so `report`, `tui` and `diagnose()` with no path agree, and a
packaged install can point these two functions at package data instead of the checkout.
"""

from __future__ import annotations

from pathlib import Path

from tpudiag.errors import UsageError

_ROOT = Path(__file__).resolve().parents[1] / "examples" / "models"
EXAMPLE_CAPTURE = _ROOT / "captures" / "transformer_train_v5e"
# The compiler dumps the example capture was simulated from: joined by default so the bundled
# example shows every rule, spills included.
EXAMPLE_DUMPS = _ROOT / "dumps" / "transformer_train_v5e"


def bundled_capture() -> Path:
    """The bundled example capture; UsageError when this install does not have it."""
    if not EXAMPLE_CAPTURE.exists():
        raise UsageError("no PATH given and the bundled example is not here", path=EXAMPLE_CAPTURE,
                         hint="run from a checkout of tpudiag, or pass a capture PATH")
    return EXAMPLE_CAPTURE


def bundled_dumps() -> tuple[Path, ...]:
    """The compiler dumps of the bundled example capture (empty when this install lacks them)."""
    return (EXAMPLE_DUMPS,) if EXAMPLE_DUMPS.exists() else ()
