"""Where the bundled example lives: inside the installed package, or in a checkout's `examples/`.

The example is the modelled v5e transformer training step (`examples/models/`): its capture and
the compiler dumps it was simulated from. A wheel carries both as package data under
`tpudiag/_bundled/` (setup.py copies them at build time, so the checkout keeps one copy);
an editable install or a plain checkout reads them where they are.
"""

from __future__ import annotations

from pathlib import Path

from tpudiag.errors import UsageError

EXAMPLE_NAME = "transformer_train_v5e"
_PACKAGED = Path(__file__).resolve().parent / "_bundled"
_CHECKOUT = Path(__file__).resolve().parents[1] / "examples" / "models"


def _root() -> Path:
    return _PACKAGED if (_PACKAGED / "captures" / EXAMPLE_NAME).is_dir() else _CHECKOUT


def bundled_capture() -> Path:
    """The bundled example's capture (a logdir); a usage error when this install has none."""
    path = _root() / "captures" / EXAMPLE_NAME
    if not path.is_dir():
        raise UsageError("no PATH given and the bundled example is not here", path=path,
                         hint="reinstall tpudiag, or pass a capture PATH")
    return path


def bundled_dumps() -> Path | None:
    """The compiler dumps the bundled capture was simulated from, when this install has them."""
    path = _root() / "dumps" / EXAMPLE_NAME
    return path if path.is_dir() else None
