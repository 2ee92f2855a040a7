"""Which host files a user's PATH names: a logdir (the newest run under `plugins/profile/`), a
run directory (every `*.xplane.pb` in it, one per host) or a single `.xplane.pb` file, as XProf
accepts them; or the same behind an fsspec URL.

Standard library only, so that `parsers.read_ahead` can find a run's host file and start reading
it before the command has imported numpy, pandas or the parsers (`parsers.capture` re-exports
these names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.parsers.input_files import TRACE_SUFFIX


@dataclass(frozen=True)
class CaptureFiles:
    input_path: Path | str  # a local path, or the URL the user gave
    run: str
    files: tuple[Path | HostUrl, ...]


class HostUrl(str):
    """A host file behind an fsspec URL (`gs://bucket/.../host.xplane.pb`, `memory://...`).

    A string, so it pickles to Dask workers and process pools as itself; `.name` and `.stem` read
    like `Path`'s so the parser can name the host from the file.
    """

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def stem(self) -> str:
        return self.name.rsplit(".", 1)[0]


_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")
_COLLAPSED_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*):/(?!/)")


def as_location(path: Path | str) -> Path | HostUrl:
    """A local Path, or a HostUrl for `scheme://...` (also when a Path collapsed it to `scheme:/...`).

    Windows drive letters (`C:\\`) stay paths; `file://` URLs become local paths.
    """
    text = str(path)
    if not _URL.match(text) and isinstance(path, Path) and not path.exists():
        m = _COLLAPSED_URL.match(text)
        if m and len(m.group("scheme")) > 1:
            text = f"{m.group('scheme')}://{text[m.end():]}"
    m = _URL.match(text)
    if m is None:
        return Path(path)
    if m.group("scheme") == "file":
        return Path(text[m.end():])
    return HostUrl(text)


def _find_remote(url: HostUrl) -> CaptureFiles:
    """`find_capture` for an fsspec URL: the same three forms (logdir, run directory, one file)."""
    from tpudiag.parsers.remote import find_remote

    run, files = find_remote(url, TRACE_SUFFIX)
    return CaptureFiles(url, run, tuple(HostUrl(f) for f in files))


def _runs_dir(path: Path) -> Path | None:
    candidate = path / "plugins" / "profile"
    return candidate if candidate.is_dir() else None


def find_capture(path: Path | str) -> CaptureFiles:
    """The host files PATH (a local path or an fsspec URL) names, or InputError saying why there are none."""
    path = as_location(path)
    if isinstance(path, HostUrl):
        return _find_remote(path)
    if not path.exists():
        raise InputError("no such file or directory", path=path)
    if path.is_file():
        return CaptureFiles(path, path.parent.name, (path,))
    if not path.is_dir():
        raise InputError("not a file or directory", path=path)
    try:
        runs_root = _runs_dir(path)
        if runs_root is not None:
            runs = sorted((d for d in runs_root.iterdir() if d.is_dir() and any(d.glob(f"*{TRACE_SUFFIX}"))),
                          key=lambda d: (d.name, d.stat().st_mtime))
            if not runs:
                raise InputError(f"no run with `*{TRACE_SUFFIX}` files under plugins/profile", path=path)
            run_dir = runs[-1]  # XProf names runs by timestamp, so the last in order is the newest
        else:
            run_dir = path
        files = tuple(sorted(run_dir.glob(f"*{TRACE_SUFFIX}")))
    except PermissionError as exc:
        raise InputError("permission denied", path=path) from exc
    if not files:
        raise InputError(f"no `*{TRACE_SUFFIX}` trace files here (expected a logdir, a run directory "
                         "or a trace file)", path=path, hint=_logdir_hint(path))
    return CaptureFiles(path, run_dir.name, files)


def _logdir_hint(path: Path) -> str:
    """Where to point instead: a logdir one level below PATH (a capture kept in a `trace/` folder
    beside its licence, say) is named; only PATH's own entries are looked at, not a whole tree."""
    try:
        below = sorted(d.name for d in path.iterdir() if d.is_dir() and _runs_dir(d) is not None)
    except OSError:
        below = []
    if below:
        shown = ", ".join(f"`{path / name}`" for name in below[:3])
        return f"a logdir is one level down: pass {shown}"
    return "pass the directory jax.profiler wrote to, or a `.xplane.pb` file"
