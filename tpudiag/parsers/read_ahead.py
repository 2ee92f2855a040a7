"""A host file read and parsed in a background thread while its command is still importing.

`tpudiag report PATH` spends its first half second importing pandas, numpy and the analysis and
rule modules, all on one core and holding the GIL. Meanwhile the file can be read and parsed on
the other core: reading it, the C reader's decoding of its events (`event_wire`) and numpy's
large array operations run without the GIL. `start` finds the host files PATH names (a logdir,
a run directory or a `.xplane.pb` file, by `parsers.capture_files`, the rules `load_capture`
follows; standard library only) and, for a capture of one local host file, begins that in a
daemon thread. The thread reads the file before it imports anything more, and the parse imports
pandas only to build the host's tables at its end (`parsers.capture`), so that the decoding is
not held up behind the command's own import of pandas. The host's task (`analysis.host_digest.
parse_and_digest`) `take`s the parsed host when it comes to that file, waiting for the thread if
it is still running. A file nothing was started for, or one changed since (its inode, size or
modification time), is parsed where it is asked for, as before.

The parse is `parsers.capture.parse_file_or_failure`, the same call with the same result and the
same errors (a damaged file is the host's failure; anything else is raised where it is taken).
Captures of several hosts (parsed in a pool) and URLs are not read ahead.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.parsers.capture_files import HostUrl, find_capture
from tpudiag.parsers.input_files import TRACE_SUFFIX, read_input_bytes

_lock = threading.Lock()
_pending: dict[str, _ReadAhead] = {}


class _ReadAhead:
    """One file's parse in its thread: the result (HostTrace or HostFailure) or what it raised."""

    def __init__(self, path: Path, plane_jobs: int, version: tuple):
        self.path = path
        self.plane_jobs = plane_jobs
        self.version = version  # the file's identity when started: a file changed since is parsed again
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            try:
                # the same read as `capture.read_location_bytes`'; the parse empties the list
                data = [read_input_bytes(self.path)]
            except InputError:
                data = None  # read again by the parse below, which makes it the host's failure
            from tpudiag.parsers.capture import parse_file_or_failure

            self.result = parse_file_or_failure(self.path, self.plane_jobs, data=data)
        except BaseException as exc:  # raised again in the thread that takes the result
            self.error = exc
        finally:
            self.done.set()


def _key(path) -> str | None:
    if not isinstance(path, (str, os.PathLike)):
        return None  # a URL (`parsers.capture_files.HostUrl`)
    return os.path.realpath(os.fspath(path))


def _version(key: str) -> tuple | None:
    """(device, inode, size, modification time) of the file, None when it is not a regular file."""
    try:
        st = os.stat(key)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def single_host_file(path: Path | str) -> Path | None:
    """The one local `.xplane.pb` host file of the capture at `path` (a logdir, a run directory or
    the file itself), as `load_capture` finds it; None for several hosts, a URL or no capture
    (whose errors `load_capture` reports)."""
    try:
        files = find_capture(path).files
    except (InputError, OSError):
        return None
    if len(files) != 1 or isinstance(files[0], HostUrl) or not str(files[0]).endswith(TRACE_SUFFIX):
        return None
    return files[0]


def start(path: Path | str, plane_jobs: int | None = None) -> bool:
    """Begin reading and parsing the host file of `path` in a background thread when `path` names
    a capture of one local host file (`single_host_file`; `plane_jobs`: as `load_capture` gives a
    single host, None for one per CPU; with one job nothing is started, there being no other core
    to read on). Whether a thread was started."""
    jobs = plane_jobs or os.cpu_count() or 1
    file = single_host_file(path) if jobs > 1 else None
    key = _key(file) if file is not None else None
    version = _version(key) if key is not None else None
    if version is None:
        return False
    job = _ReadAhead(file, jobs, version)
    with _lock:
        _pending[key] = job  # replaces one never taken (its command stopped before parsing)
    threading.Thread(target=job.run, name="tpudiag-read-ahead", daemon=True).start()
    return True


def take(path):
    """The host parsed ahead for `path` (a HostTrace or HostFailure), waiting for its thread; what
    the parse raised is raised here. None when nothing was started for it. Taken once."""
    key = _key(path)
    if key is None:
        return None
    with _lock:
        job = _pending.pop(key, None)
    if job is None or _version(key) != job.version:
        return None
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.result
