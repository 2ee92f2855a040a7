"""The CLI's consoles: data on stdout, diagnostics on stderr; `NO_COLOR` honoured.

Both are `SafeConsole`s: whatever trace text reaches them prints with its control characters escaped.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

from tpudiag.render.console import SafeConsole


def _plain() -> bool:
    # NO_COLOR (no-color.org) wins over FORCE_COLOR; rich alone would still emit bold and dim.
    return bool(os.environ.get("NO_COLOR"))


def stdout_console() -> Console:
    # When piped, keep lines long enough for the tables.
    return SafeConsole(width=None if sys.stdout.isatty() else 140, soft_wrap=False,
                       color_system=None if _plain() else "auto")


def stderr_console() -> Console:
    return SafeConsole(stderr=True, width=None if sys.stderr.isatty() else 140,
                       color_system=None if _plain() else "auto")
