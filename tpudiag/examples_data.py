"""Where the bundled example lives: inside the installed package, or in a checkout's `examples/`.

The example is the modelled v5e transformer training step (`examples/models/`): its capture and
the compiler dumps it was simulated from. One place says where they are, so `report`, `tui`, the
lab and `diagnose()` with no path agree. A wheel carries both as package data under
`tpudiag/_bundled/` (setup.py copies them at build time, so the checkout keeps one copy); an
editable install or a plain checkout reads them where they are.
"""

from __future__ import annotations

from pathlib import Path

from tpudiag.errors import UsageError

EXAMPLE_NAME = "transformer_train_v5e"
_PACKAGED = Path(__file__).resolve().parent / "_bundled"
_CHECKOUT = Path(__file__).resolve().parents[1] / "examples" / "models"
_ROOT = _PACKAGED if (_PACKAGED / "captures" / EXAMPLE_NAME).is_dir() else _CHECKOUT
EXAMPLE_CAPTURE = _ROOT / "captures" / EXAMPLE_NAME
# The compiler dumps the example capture was simulated from: joined by default so the bundled
# example shows every rule, spills included.
EXAMPLE_DUMPS = _ROOT / "dumps" / EXAMPLE_NAME


def bundled_capture() -> Path:
    """The bundled example capture; UsageError when this install does not have it."""
    if not EXAMPLE_CAPTURE.is_dir():
        raise UsageError("no PATH given and the bundled example is not here", path=EXAMPLE_CAPTURE,
                         hint="reinstall tpudiag, or pass a capture PATH")
    return EXAMPLE_CAPTURE


def bundled_dumps() -> tuple[Path, ...]:
    """The compiler dumps of the bundled example capture (empty when this install lacks them)."""
    return (EXAMPLE_DUMPS,) if EXAMPLE_DUMPS.is_dir() else ()
