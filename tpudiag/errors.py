"""The one exception family. The CLI catches these and only these."""

from __future__ import annotations

from pathlib import Path


class TpudiagError(Exception):
    """An error the user can act on: a one-line message, the file it concerns, an optional hint."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.hint = hint

    def one_line(self) -> str:
        """The message as printed: `path`: cause, without a trailing period."""
        text = self.message.rstrip(".")
        if self.path is not None:
            text = f"`{self.path}`: {text}"
        return " ".join(text.split())


class InputError(TpudiagError):
    """The input (a trace, a dump, a config) is missing, unreadable or malformed."""


class UsageError(TpudiagError):
    """The command line asks for something that cannot be done."""
