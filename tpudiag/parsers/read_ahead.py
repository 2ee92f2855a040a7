"""A host file read and parsed in a background thread while its command is still importing.

`tpudiag report FILE` spends its first half second importing pandas, numpy and the analysis and
rule modules, all on one core and holding the GIL. Meanwhile the file can be read and parsed on
the other core: reading it, the C reader's decoding of its events (`event_wire`) and numpy's
large array operations run without the GIL. `start` begins that in a daemon thread, importing
only the standard library until the file is read; the host's task (`analysis.host_digest.
parse_and_digest`) `take`s the parsed host when it comes to that file, waiting for the thread if
it is still running. A file nothing was started for, or one changed since (its inode, size or
modification time), is parsed where it is asked for, as before.

The parse is `parsers.capture.parse_file_or_failure`, the same call with the same result and the
same errors (a damaged file is the host's failure; anything else is raised where it is taken).
Only a single local `.xplane.pb` file is read ahead: a directory's files and URLs are found by
`parsers.capture`, which the thread would have to import first.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from tpudiag.parsers.input_files import TRACE_SUFFIX

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
        from tpudiag.errors import InputError
        from tpudiag.parsers.input_files import read_input_bytes

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
        return None  # a URL (`parsers.capture.HostUrl`)
    return os.path.realpath(os.fspath(path))


def _version(key: str) -> tuple | None:
    """(device, inode, size, modification time) of the file, None when it is not a regular file."""
    try:
        st = os.stat(key)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def start(path: Path | str, plane_jobs: int | None = None) -> bool:
    """Begin reading and parsing `path` in a background thread when it names a local `.xplane.pb`
    regular file (`plane_jobs`: as `load_capture` gives a single host, None for one per CPU; with
    one job nothing is started, there being no other core to read on). Whether a thread was started."""
    jobs = plane_jobs or os.cpu_count() or 1
    key = _key(path)
    version = _version(key) if jobs > 1 and key is not None and key.endswith(TRACE_SUFFIX) else None
    if version is None:
        return False
    job = _ReadAhead(Path(path), jobs, version)
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
