"""Resolve a user's PATH to host files and parse them, in parallel processes for several hosts.

PATH may be a logdir (the newest run under `plugins/profile/` is used), a run directory (every
`*.xplane.pb` in it, one per host) or a single `.xplane.pb` file, as XProf accepts them. A bad
host file is reported and the others are analysed; only when no host can be read is it an error.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.errors import InputError, TpudiagError, UsageError
from tpudiag.model.profile import HostFailure, HostTrace, Profile
from tpudiag.parsers.device_trace import (AUX_PLANES, PlaneRef, assemble_host, device_planes, host_name,
                                          parse_device_plane)
from tpudiag.parsers import event_wire
from tpudiag.parsers.event_wire import RawLine
from tpudiag.parsers.input_files import default_limits, size_error
from tpudiag.parsers.xspace import check_trace_bytes, parse_message, read_trace_bytes
from tpudiag.proto import XPlane, XPlaneHead, XPlaneRawLines, XSpaceRawPlanes

TRACE_SUFFIX = ".xplane.pb"


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


def _filesystem(url: str):
    """(fsspec filesystem, path inside it) for a URL; InputError when fsspec or the backend is missing."""
    try:
        import fsspec
    except ImportError as exc:
        raise InputError("reading URLs needs fsspec", path=url,
                         hint="install the cloud extra: `pip install 'tpudiag[cloud]'`") from exc
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise InputError(f"no filesystem for this URL ({exc})", path=url,
                         hint="`gs://` needs gcsfs: `pip install 'tpudiag[cloud]'`") from exc


def _find_remote(url: HostUrl) -> CaptureFiles:
    """`find_capture` for an fsspec URL: the same three forms (logdir, run directory, one file)."""
    fs, root = _filesystem(url)
    root = root.rstrip("/")
    try:
        if fs.isfile(root):
            return CaptureFiles(url, root.rsplit("/", 1)[0].rsplit("/", 1)[-1], (url,))
        if not fs.isdir(root):
            raise InputError("no such file or directory", path=url)
        run_dir = root
        runs_root = f"{root}/plugins/profile"
        if fs.isdir(runs_root):
            runs = sorted(d for d in fs.ls(runs_root, detail=False)
                          if fs.isdir(d) and fs.glob(f"{d.rstrip('/')}/*{TRACE_SUFFIX}"))
            if not runs:
                raise InputError(f"no run with `*{TRACE_SUFFIX}` files under plugins/profile", path=url)
            run_dir = runs[-1].rstrip("/")  # runs are named by timestamp: the last is the newest
        files = sorted(fs.glob(f"{run_dir}/*{TRACE_SUFFIX}"))
    except InputError:
        raise
    except (OSError, ValueError) as exc:  # fsspec backends report missing buckets, auth and I/O this way
        raise InputError(f"cannot list ({exc})", path=url) from exc
    if not files:
        raise InputError(f"no `*{TRACE_SUFFIX}` trace files here (expected a logdir, a run directory "
                         "or a trace file)", path=url)
    return CaptureFiles(url, run_dir.rsplit("/", 1)[-1], tuple(HostUrl(fs.unstrip_protocol(f)) for f in files))


def read_location_bytes(location: Path | HostUrl) -> bytes:
    """A host file's bytes, local or behind a URL (read by whichever process parses it).

    A local file goes through `read_trace_bytes` (regular files only, checked on the open
    descriptor). A URL has no such thing as a FIFO, but the same size cap holds: the listed size
    is checked first, and the read stops one byte past the cap should the object lie about it.
    """
    if not isinstance(location, HostUrl):
        return read_trace_bytes(location)
    cap = default_limits().max_file_bytes
    fs, inner = _filesystem(location)
    try:
        size = fs.size(inner)
        if size is not None and size > cap:
            raise size_error(location, size, cap)
        with fs.open(inner, "rb") as f:
            data = f.read(cap + 1)
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError("no such file", path=location) from exc
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read ({exc})", path=location) from exc
    if len(data) > cap:
        raise size_error(location, len(data), cap)
    return data


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
                         "or a trace file)", path=path,
                         hint="pass the directory jax.profiler wrote to, or a `.xplane.pb` file")
    return CaptureFiles(path, run_dir.name, files)


def _pool(workers: int) -> ProcessPoolExecutor:
    """A process pool that does not fork the caller: forking a process whose other threads hold
    locks (JAX, a TUI, a test runner) can deadlock the child. Forkserver children start from a
    clean server that has imported only the parsers."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tpudiag.parsers.capture"])
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


# A host file at least this big, with several device planes, parses its planes in parallel
# when at least this many processes are allowed. On 2 cores it does not pay: a 2M-event host took
# 3.8 s either way and 0.5 GB more with two plane workers (benchmarks/bench_report.py).
PARALLEL_PLANES_MIN_BYTES = 16 << 20
PARALLEL_PLANES_MIN_JOBS = 3
_OVERFLOW = "implausible event times (beyond the int64 picosecond range)"


def _parse_file(path: Path | HostUrl, plane_jobs: int = 1) -> HostTrace:
    """One host file (a local path or a URL) to its HostTrace, or InputError naming the file and the cause.

    Damage that Python reports with its own exceptions (timestamps past int64, nesting past the
    recursion limit) is input damage too, so it becomes InputError here, at the host boundary.
    """
    try:
        return _parse_file_unchecked(path, plane_jobs)
    except InputError as exc:
        if exc.path is not None:
            raise
        # Raised deep in a value decoder that does not know the file: name it here.
        raise InputError(exc.message, path=path, hint=exc.hint) from exc
    except OverflowError as exc:
        # A timestamp or duration beyond int64 ps: the file is damaged (or not a device trace).
        raise InputError(_OVERFLOW, path=path) from exc
    except RecursionError as exc:
        raise InputError("nesting too deep to parse (a damaged or hostile trace)", path=path) from exc


def _parse_file_unchecked(path: Path | HostUrl, plane_jobs: int) -> HostTrace:
    data = [read_location_bytes(path)]  # in a list, so that `_parse_planes` can drop the only reference
    check_trace_bytes(data[0], path)
    big = len(data[0]) >= PARALLEL_PLANES_MIN_BYTES
    return _parse_planes(path, data, plane_jobs if plane_jobs >= PARALLEL_PLANES_MIN_JOBS and big else 1)


def _plane_job(job: tuple[bytes, PlaneRef, str, int]):
    """Parse one device plane from its bytes (in a worker with `jobs`); a string result is the
    error's cause. The plane's lines stay serialized: their events are decoded from the wire."""
    plane_bytes, ref, platform, origin = job
    try:
        plane, lines = split_lines(plane_bytes, ref.name)
        return parse_device_plane(plane, ref, platform, origin, lines)
    except InputError as exc:
        return exc.message
    except OverflowError:
        return _OVERFLOW
    except RecursionError:
        return "nesting too deep to parse (a damaged or hostile trace)"


def _parse_planes(path: Path | HostUrl, data: list[bytes], jobs: int) -> HostTrace:
    """Parse a host file (`data`, its bytes, which this takes over) plane by plane, the device
    planes in `jobs` worker processes when above 1.

    Only the plane list and the plane and line headers are read first. Planes and lines are views
    into the file's bytes where the compiled reader splits them (`event_wire.split_field`), else
    copies by the shadow schemas, dropped once parsed; either way memory stays near one copy of
    the file plus the plane being parsed. The framing of every plane and line is checked, and
    planes tpudiag does not read are parsed whole, so damage there is an error as when the file
    is read as one XSpace; the events of a device-plane line tpudiag does not read are not decoded.
    """
    planes, name = split_planes(data.pop(), path)
    if not planes:
        raise InputError("XSpace has no planes: not a trace, or an empty capture", path=path)
    platform, refs, origin = _plane_roles(planes, path)
    jobs_in = [(planes[r.index], r, platform, origin) for r in refs]
    for r in refs:
        planes[r.index] = b""  # held by its job only
    if jobs > 1:
        with _pool(min(jobs, max(1, len(refs)))) as pool:
            parts = list(pool.map(_plane_job, [(bytes(pb), *rest) for pb, *rest in jobs_in]))
    else:
        parts = []
        for i, job in enumerate(jobs_in):
            jobs_in[i] = None  # the job alone holds this plane's bytes, dropped once it is parsed
            parts.append(_plane_job(job))
            del job
            if isinstance(parts[-1], str):
                break
    errors = [p for p in parts if isinstance(p, str)]
    if errors:
        raise InputError(errors[0], path=path)
    on_device = {r.index for r in refs}
    others = [parse_message(XPlane(), pb, path) for i, pb in enumerate(planes) if i not in on_device]
    aux = [p for p in others if p.name in AUX_PLANES]
    return assemble_host(name, path, platform, refs, parts, aux, origin)


def split_planes(data: bytes, path) -> tuple[list[bytes | memoryview], str]:
    """(the XSpace's planes, views into `data` where the compiled reader splits it, the host name)."""
    split = event_wire.split_field(data, 1)  # XSpace.planes
    if split is None:
        space = parse_message(XSpaceRawPlanes(), data, path)
        return list(space.planes), host_name(space, Path(path))
    planes, rest = split
    return planes, host_name(parse_message(XSpaceRawPlanes(), rest, path), Path(path))


def split_lines(plane_bytes, path) -> tuple[object, list[RawLine]]:
    """(the plane without its lines, as `XPlaneRawLines`; its lines) from a serialized XPlane."""
    split = event_wire.split_field(plane_bytes, 3)  # XPlane.lines
    plane = XPlaneRawLines()
    if split is None:
        parse_message(plane, plane_bytes, path)
        return plane, [RawLine(line) for line in plane.lines]
    lines, rest = split
    parse_message(plane, rest, path)
    return plane, [RawLine(line) for line in lines]


def _plane_roles(planes: list[bytes | memoryview], path) -> tuple[str, list[PlaneRef], int]:
    """(platform, device planes, time origin) from the planes' headers, read one at a time."""
    names, stamps = [], []
    for pb in planes:
        split = event_wire.split_field(pb, 3)
        if split is None:
            head = parse_message(XPlaneHead(), pb, path)
            name, lines = head.name, list(head.lines)
        else:
            name, lines = parse_message(XPlaneHead(), split[1], path).name, [RawLine(v) for v in split[0]]
        names.append(name)
        stamps.append(min(line.timestamp_ns for line in lines) if lines else None)
    platform, refs = device_planes(names)
    origin = min((stamps[r.index] for r in refs if stamps[r.index] is not None), default=0)
    return platform, refs, origin


def parse_file_or_failure(path: Path | HostUrl, plane_jobs: int = 1,
                          keep_events: bool = True) -> HostTrace | HostFailure:
    """The worker boundary (a pool process or a Dask task): any project error becomes this host's
    failure, so the others go on. `keep_events` is for tasks that reduce a host where it is parsed
    (`load_capture`'s `per_host`); the parsed host always has its events."""
    try:
        return _parse_file(path, plane_jobs)
    except TpudiagError as exc:
        if exc.path is None:
            exc = InputError(exc.message, path=path, hint=exc.hint)
        return HostFailure(str(path), exc.one_line())


def _map_on_dask(task: HostTask, files: tuple, keep_events: bool, scheduler,
                 arrived: Callable[[HostTrace | HostFailure], None]) -> list[HostTrace | HostFailure]:
    """Parse every host file as one task on a Dask distributed cluster.

    `scheduler` is an address (`tcp://host:8786`) or a `distributed.Client`. Only the file names go
    to the workers, which read the files themselves (a shared filesystem or a URL); each task
    returns its parsed host or its one-line failure, so a bad host stays a per-host warning.
    """
    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise UsageError("`--scheduler` needs Dask distributed",
                         hint="install the dask extra: `pip install 'tpudiag[dask]'`") from exc
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, set_as_default=False) if own else scheduler
    except (OSError, ValueError, TimeoutError) as exc:
        raise UsageError(f"cannot reach the Dask scheduler at `{scheduler}` ({exc})") from exc
    try:
        futures = client.map(task, list(files), plane_jobs=1, keep_events=keep_events, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[HostTrace | HostFailure | None] = [None] * len(futures)
        for future in as_completed(futures):  # each host as it finishes, so the caller can fold it
            result = future.result()
            arrived(result)
            results[index[future.key]] = result
            future.release()
        return results
    finally:
        if own:
            client.close()


# A host task: (host file, plane_jobs, keep_events) -> the parsed host or its failure. It runs in
# the process that parsed the host (pool process, Dask worker), so a task that reduces the host
# there (`analysis.host_digest.parse_and_digest`) sends back only what it keeps. Picklable.
HostTask = Callable[..., "HostTrace | HostFailure"]


def load_capture(path: Path | str, jobs: int | None = None,
                 progress: Callable[[str], None] | None = None, scheduler=None,
                 per_host: HostTask | None = None, on_host: Callable[[HostTrace], None] | None = None) -> Profile:
    """Parse every host of the capture at `path` (a local path or an fsspec URL).

    Several hosts parse in parallel processes (`jobs`), or as tasks on a Dask distributed cluster
    when `scheduler` (an address or a `distributed.Client`) is given. `per_host` replaces the
    plain parse of each host file; it is asked to keep the events only for a single-host capture.
    `on_host` is called in this process with each parsed host as it arrives, before the next ones
    are gathered, so a caller can fold what a host brings instead of holding every host's.
    """
    capture = find_capture(path)
    files = capture.files
    task = per_host or parse_file_or_failure
    keep = len(files) == 1

    def arrived(result: HostTrace | HostFailure) -> HostTrace | HostFailure:
        if on_host is not None and isinstance(result, HostTrace):
            on_host(result)
        return result

    results: list[HostTrace | HostFailure]
    workers = min(len(files), jobs or os.cpu_count() or 1)
    if scheduler is not None:
        if progress:
            progress(f"parsing {len(files)} hosts on the Dask cluster")
        results = _map_on_dask(task, files, keep, scheduler, arrived)
    elif workers <= 1 or len(files) == 1:
        results = []
        for f in files:
            if progress:
                progress(f"parsing {f.name}")
            # A single host may still use every core, plane by plane.
            results.append(arrived(task(f, plane_jobs=jobs or os.cpu_count() or 1, keep_events=keep)))
    else:
        if progress:
            progress(f"parsing {len(files)} hosts in {workers} processes")
        with _pool(workers) as pool:
            results = [arrived(r) for r in pool.map(functools.partial(task, plane_jobs=1, keep_events=keep), files)]
    for f, r in zip(files, results):
        if isinstance(r, HostTrace):  # resolved here, in the caller's working directory
            r.source = str(f) if isinstance(f, HostUrl) else str(Path(f).resolve())
    hosts = [r for r in results if isinstance(r, HostTrace)]
    failures = [r for r in results if isinstance(r, HostFailure)]
    _share_programs(hosts)
    hosts, failures, notes = reconcile_hosts(hosts, failures)
    if not hosts:
        if len(failures) == 1:
            raise InputError(failures[0].message)
        raise InputError(f"none of the {len(failures)} host files could be read; first: {failures[0].message}",
                         path=capture.input_path)
    return Profile(input_path=str(capture.input_path), run=capture.run, hosts=hosts, failures=failures,
                   warnings=notes, modelled=any(h.modelled for h in hosts))


def _share_programs(hosts: list[HostTrace]) -> None:
    """Hosts of one SPMD run embed the same HLO protos (MBs each): keep one copy of each."""
    seen: dict[int, list[bytes]] = {}
    for host in hosts:
        for pid, data in list(host.hlo_protos.items()):
            copies = seen.setdefault(pid, [])
            same = next((c for c in copies if c == data), None)
            if same is None:
                copies.append(data)
            else:
                host.hlo_protos[pid] = same


_HOST_TABLES = ("events", "op_metadata", "modules", "async_windows")


def reconcile_hosts(hosts: list[HostTrace], failures: list[HostFailure]
                    ) -> tuple[list[HostTrace], list[HostFailure], list[str]]:
    """Make the parsed hosts combinable: (hosts, failures, warnings).

    Hosts are keyed by name everywhere downstream, so two files with the same XSpace hostname
    (a capture copied twice, a host restarted) get their file's name added to tell them apart.
    Host-only (CPU) files beside device hosts have no device ops and no steps: analysing them
    with the others would empty the combined step time, so they are set aside with a reason.
    """
    notes: list[str] = []
    device_hosts = [h for h in hosts if h.device.platform != "CPU"]
    if device_hosts and len(device_hosts) < len(hosts):
        for h in hosts:
            if h.device.platform == "CPU":
                failures = [*failures, HostFailure(h.path, f"`{h.path}`: no device plane (a host-only capture) "
                                                           "beside device hosts; not analysed")]
        hosts = device_hosts
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h.host] = counts.get(h.host, 0) + 1
    taken = set(counts)
    for h in hosts:
        if counts[h.host] > 1:
            new = _distinct_name(h, taken)
            notes.append(f"hostname `{h.host}` appears in {counts[h.host]} files; `{Path(h.path).name}` "
                         f"is shown as `{new}`")
            _rename_host(h, new)
    return hosts, failures, notes


def _distinct_name(host: HostTrace, taken: set[str]) -> str:
    base = f"{host.host} ({Path(host.path).name.removesuffix(TRACE_SUFFIX)})"
    name, n = base, 2
    while name in taken:
        name, n = f"{base} #{n}", n + 1
    taken.add(name)
    return name


def _rename_host(host: HostTrace, name: str) -> None:
    host.host = name
    for attr in _HOST_TABLES:
        df = getattr(host, attr)
        if df is not None and "host" in df.columns:
            df["host"] = pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int8), categories=[name])
