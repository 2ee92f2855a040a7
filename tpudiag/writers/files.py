"""Where output files go: a guard for `-o` and a writer that never leaves a partial file.

Every command that writes a file (`report`, `diff`, `lab extract`, `simulate`, the markdown figures,
the TUI export) goes through here, so the rules hold everywhere:

- `-o -` means stdout (`resolve_output` returns None).
- The output is never an input, nor inside an input's trace directory (the input itself when it is
  a directory, else the directory holding it), symlinks resolved: tpudiag never writes into a trace.
- A missing parent directory is created.
- A regular file is written to a temporary file beside it and renamed into place, so a failure
  (ENOSPC, a full quota, an interrupt) leaves the old file or nothing, and a symlink at the target is
  replaced rather than followed. A special file the user names (`/dev/null`, `/dev/stdout`, a FIFO)
  is written in place: renaming over a device node would replace it.
- An OS failure is a one-line `UsageError` naming the file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from tpudiag.errors import UsageError

STDOUT = "-"


def trace_root(path: Path) -> Path:
    """The directory an input owns: the input itself when it is a directory, else its parent."""
    resolved = path.expanduser().resolve()
    return resolved if resolved.is_dir() else resolved.parent


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_not_input(output: Path, inputs: Iterable[Path | None], what: str = "the output") -> None:
    """Raise UsageError when `output` is an input or lies inside an input's directory (symlinks resolved)."""
    target = output.expanduser().resolve()
    for given in inputs:
        if given is None or str(given) == STDOUT:
            continue
        src = given.expanduser().resolve()
        if target == src:
            raise UsageError(f"refusing to overwrite the input with {what}", path=output,
                             hint="write somewhere else, e.g. `-o report.md`")
        root = trace_root(given)
        if _inside(target, root):
            raise UsageError(f"refusing to write {what} inside the input directory `{root}`", path=output,
                             hint="tpudiag never writes into a trace; write somewhere else, e.g. `-o ./report.md`")


def resolve_output(output: Path | None, inputs: Iterable[Path | None]) -> Path | None:
    """The file to write, or None for stdout; refused when it is an input, inside one, or a directory."""
    if output is None or str(output) == STDOUT:
        return None
    if output.is_dir():
        raise UsageError("the output is a directory", path=output, hint="give a file name, e.g. `-o report.md`")
    check_not_input(output, inputs)
    return output


def make_parent(path: Path) -> None:
    """Create `path`'s missing parent directories, or raise a one-line UsageError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the output's directory ({exc.strerror or exc})", path=path.parent) from exc


def is_special(path: Path) -> bool:
    """Whether `path` exists and is not a regular file (a device, a FIFO): written in place, nothing beside it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode)


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator[IO]:
    """Open `path` for writing; the content appears whole on success and not at all on failure."""
    make_parent(path)
    text = "b" not in mode
    kw = {"encoding": "utf-8"} if text else {}
    if is_special(path):  # a device or FIFO the user named: write through, never rename over it
        try:
            with open(path, mode, **kw) as fh:
                yield fh
        except OSError as exc:
            raise UsageError(f"cannot write ({exc.strerror or exc})", path=path) from exc
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write ({exc.strerror or exc})", path=path) from exc
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; a report is as readable as any new file
        with os.fdopen(fd, mode, **kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise UsageError(f"cannot write ({exc.strerror or exc})", path=path) from exc
    except BaseException:
        _unlink(tmp)
        raise


def _file_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777  # replacing a file keeps its permissions
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _unlink(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def write_text(path: Path, body: str) -> None:
    """Write `body` to `path` atomically (see `atomic_open`)."""
    with atomic_open(path) as fh:
        fh.write(body)


def write_output(output: Path | None, body: str | Iterable[str]) -> None:
    """`body` (a text, or a text in pieces written as they come) to stdout when `output` is None,
    else to the file, atomically."""
    pieces = (body,) if isinstance(body, str) else body
    if output is None:
        import sys

        for piece in pieces:
            sys.stdout.write(piece)
    else:
        with atomic_open(output) as fh:
            for piece in pieces:
                fh.write(piece)


def check_new_logdir(logdir: Path, own_run: str) -> None:
    """`simulate -o`: a logdir that is not a file and holds no run but `own_run` (a previous simulate).

    A modelled run beside real ones would become the newest run, which `tpudiag report LOGDIR` reads:
    it would shadow the real capture.
    """
    if logdir.exists() and not logdir.is_dir():
        raise UsageError("the output exists and is not a directory", path=logdir,
                         hint="give a new or empty directory as the logdir")
    runs_dir = logdir / "plugins" / "profile"
    others = sorted(p.name for p in runs_dir.iterdir() if p.name != own_run) if runs_dir.is_dir() else []
    if others:
        raise UsageError(f"the logdir already holds runs ({', '.join(others[:3])}); a modelled run there would "
                         "shadow the newest real one", path=logdir, hint="give a new or empty directory")
