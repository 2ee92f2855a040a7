"""Parse the host files a user's PATH names, in parallel processes for several hosts.

PATH may be a logdir (the newest run under `plugins/profile/` is used), a run directory (every
`*.xplane.pb` in it, one per host) or a single `.xplane.pb` file, as XProf accepts them; which
files that is, `parsers.capture_files` decides. A bad host file is reported and the others are
analysed; only when no host can be read is it an error.

pandas is imported only where a host's tables are built (`device_trace.assemble_host`), so that
a host file read ahead (`parsers.read_ahead`) decodes its events while the command still imports.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from contextlib import contextmanager
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpudiag.errors import InputError, TpudiagError
from tpudiag.model.profile import HostFailure, HostTrace, Platform, Profile
from tpudiag.parsers.device_trace import (AUX_PLANES, PlaneRef, assemble_host, axis_of, device_planes, host_name,
                                          is_read_line, parse_device_plane)
from tpudiag.parsers import event_wire
from tpudiag.parsers.event_wire import RawLine
from tpudiag.parsers.capture_files import HostUrl, find_capture
from tpudiag.parsers.input_files import TRACE_SUFFIX, default_limits, size_error
from tpudiag.parsers.time_axis import TASK_ENV_PLANE, TimeAxis
from tpudiag.parsers.xspace import check_trace_bytes, parse_message, read_trace_bytes
from tpudiag.proto import XPlane, XPlaneHead, XPlaneRawLines, XSpaceRawPlanes


def read_location_bytes(location: Path | HostUrl) -> bytes:
    """A host file's bytes, local or behind a URL (read by whichever process parses it).

    A local file goes through `read_trace_bytes` (regular files only, checked on the open
    descriptor). A URL has no such thing as a FIFO, but the same size cap holds: the listed size
    is checked first, and the read stops one byte past the cap should the object lie about it.
    """
    if not isinstance(location, HostUrl):
        return read_trace_bytes(location)
    from tpudiag.parsers.remote import read_remote_bytes

    cap = default_limits().max_file_bytes
    return read_remote_bytes(location, cap, lambda size: size_error(location, size, cap))


def _pool(workers: int) -> ProcessPoolExecutor:
    """A process pool that does not fork the caller: forking a process whose other threads hold
    locks (JAX, a TUI, a test runner) can deadlock the child. Forkserver children start from a
    clean server that has imported only the parsers."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tpudiag.parsers.capture"])
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


def process_pool(workers: int) -> ProcessPoolExecutor:
    """The pool other readers of host files use (`analysis.memory_timeline`), started as `load_capture`'s."""
    return _pool(workers)


# A host file at least this big, with several device planes, parses its planes in parallel
# when at least this many processes are allowed. On 2 cores processes do not pay: a 2M-event host
# took 3.8 s either way and 0.5 GB more with two plane workers (benchmarks/bench_report.py), the
# events pickled back. With 2 jobs the planes parse in 2 threads of this process instead: the C
# reader decodes a plane's events without the GIL (`event_wire.decode_line`), as numpy does its
# large sorts and array arithmetic, while the other thread runs the rest.
PARALLEL_PLANES_MIN_BYTES = 16 << 20
PARALLEL_PLANES_MIN_JOBS = 3
PLANE_THREADS = 2
_OVERFLOW = "implausible event times (beyond the int64 picosecond range)"
_TOO_DEEP = "nesting too deep to parse (a damaged or hostile trace)"


@contextmanager
def _host_boundary(path: Path | HostUrl | str):
    """InputError naming `path` for any damage met while parsing one host's bytes.

    Damage that Python reports with its own exceptions (timestamps past int64, nesting past the
    recursion limit) is input damage too, so it becomes InputError here, at the host boundary.
    """
    try:
        yield
    except InputError as exc:
        if exc.path is not None:
            raise
        # Raised deep in a value decoder that does not know the file: name it here.
        raise InputError(exc.message, path=path, hint=exc.hint) from exc
    except OverflowError as exc:
        # A timestamp or duration beyond int64 ps: the file is damaged (or not a device trace).
        raise InputError(_OVERFLOW, path=path) from exc
    except RecursionError as exc:
        raise InputError(_TOO_DEEP, path=path) from exc


# More of a host file read in the pass that parses it: called with the file's planes, their roles
# (`PlaneRoles`: names and the host's time axis), the path and the host's name; what it returns is
# the HostTrace's `memory_timeline`. `tpudiag memory` reads the allocator's events so
# (`analysis.memory_timeline.timeline_of_planes`), not in a second read of the file. Top-level and
# picklable: it runs where the host is parsed (a pool process, a Dask worker).
PlaneReader = Callable[[list, "PlaneRoles", "Path | HostUrl", str], object]


def _parse_file(path: Path | HostUrl, plane_jobs: int = 1, also: PlaneReader | None = None,
                data: list[bytes] | None = None) -> HostTrace:
    """One host file (a local path or a URL) to its HostTrace, or InputError naming the file and
    the cause. `data`: the file's bytes when already read (`parsers.read_ahead`), alone in a list
    that the parse empties, so that it holds the only reference and drops it when done with it."""
    with _host_boundary(path):
        return _parse_file_unchecked(path, plane_jobs, also, data)


def _parse_file_unchecked(path: Path | HostUrl, plane_jobs: int, also: PlaneReader | None = None,
                          data: list[bytes] | None = None) -> HostTrace:
    if data is None:
        data = [read_location_bytes(path)]  # in a list, so that `_parse_planes` can drop the only reference
    check_trace_bytes(data[0], path)
    big = len(data[0]) >= PARALLEL_PLANES_MIN_BYTES
    return _parse_planes(path, data, plane_jobs if big else 1, also)


def _plane_job(job: tuple[bytes, PlaneRef, str, TimeAxis]):
    """Parse one device plane from its bytes (in a worker with `jobs`); a string result is the
    error's cause. The plane's lines stay serialized: their events are decoded from the wire."""
    plane_bytes, ref, platform, axis = job
    try:
        plane, lines = split_lines(plane_bytes, ref.name)
        return parse_device_plane(plane, ref, platform, axis, lines)
    except InputError as exc:
        return exc.message
    except OverflowError:
        return _OVERFLOW
    except RecursionError:
        return _TOO_DEEP


def _parse_planes(path: Path | HostUrl, data: list[bytes], jobs: int, also: PlaneReader | None = None) -> HostTrace:
    """Parse a host file (`data`, its bytes, which this takes over) plane by plane, the device
    planes in `jobs` worker processes from `PARALLEL_PLANES_MIN_JOBS` on, else in up to
    `PLANE_THREADS` threads when `jobs` allows more than one.

    Only the plane list and the plane and line headers are read first. Planes and lines are views
    into the file's bytes where the compiled reader splits them (`event_wire.split_field`), else
    copies by the shadow schemas, dropped once parsed; either way memory stays near one copy of
    the file plus the plane being parsed. Strict only where it must be: a plane tpudiag does not
    read is not parsed; a plane it reads but cannot decode in full is dropped with a warning
    naming it (a partly read device plane would show its missing ops as idle time); the host
    fails only when it has device planes and none of them can be read. `also` reads more of the
    planes in this pass (`PlaneReader`).
    """
    planes, name = split_planes(data.pop(), path)
    if not planes:
        raise InputError("XSpace has no planes: not a trace, or an empty capture", path=path)
    roles = plane_roles(planes, path)
    extra = also(planes, roles, path, name) if also is not None else None
    refs = roles.refs
    jobs_in = [(planes[r.index], r, roles.platform, roles.axis) for r in refs]
    for r in refs:
        planes[r.index] = b""  # held by its job only
    if jobs >= PARALLEL_PLANES_MIN_JOBS:
        with _pool(min(jobs, max(1, len(refs)))) as pool:
            parts = list(pool.map(_plane_job, [(bytes(pb), *rest) for pb, *rest in jobs_in]))
    elif jobs > 1 and len(jobs_in) > 1:
        with ThreadPoolExecutor(min(jobs, PLANE_THREADS)) as threads:
            parts = list(threads.map(_plane_job, jobs_in))
        jobs_in.clear()
    else:
        parts = []
        for i, job in enumerate(jobs_in):
            jobs_in[i] = None  # the job alone holds this plane's bytes, dropped once it is parsed
            parts.append(_plane_job(job))
            del job
    warnings = list(roles.warnings)
    read = [(r, p) for r, p in zip(refs, parts) if not isinstance(p, str)]
    for r, p in zip(refs, parts):
        if isinstance(p, str):
            warnings.append(f"device plane `{r.name}` could not be read and was skipped ({p})")
    if refs and not read:
        raise InputError(next(p for p in parts if isinstance(p, str)), path=path)
    aux = []
    for i, pb in enumerate(planes):
        if roles.names[i] not in AUX_PLANES:
            continue  # not read: damage there cannot fail the host
        try:
            aux.append(parse_message(XPlane(), pb, path))
        except InputError as exc:
            warnings.append(f"plane `{roles.names[i]}` could not be read and was skipped ({exc.message})")
    host = assemble_host(name, path, roles.platform, [r for r, _ in read], [p for _, p in read], aux, roles.axis)
    host.memory_timeline = extra
    for w in warnings:
        if w not in host.warnings:
            host.warnings.append(w)
    return host


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
    return _plane_lines(plane_bytes, path, head_only=False)


def _plane_lines(plane_bytes, path, head_only: bool) -> tuple[object, list[RawLine]]:
    """(the plane without its lines, its lines) from a serialized XPlane: an `XPlaneHead` (its
    name) when `head_only`, else an `XPlaneRawLines` (its metadata and stats too)."""
    split = event_wire.split_field(plane_bytes, 3)  # XPlane.lines
    if split is None:
        if head_only:
            head = parse_message(XPlaneHead(), plane_bytes, path)
            return head, list(head.lines)
        plane = parse_message(XPlaneRawLines(), plane_bytes, path)
        return plane, [RawLine(line) for line in plane.lines]
    values, rest = split
    plane = parse_message(XPlaneHead() if head_only else XPlaneRawLines(), rest, path)
    return plane, [RawLine(v) for v in values]


def _salvage_name(plane_bytes) -> str:
    """The `name` (field 2) of a serialized XPlane whose framing is damaged further on, read by
    walking its top-level fields up to the damage; "" when it cannot be read."""
    data, pos, n = bytes(plane_bytes), 0, len(plane_bytes)

    def varint() -> int | None:
        nonlocal pos
        value = shift = 0
        while pos < n and shift < 64:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        return None

    while pos < n:
        tag = varint()
        kind = -1 if tag is None else tag & 7
        if kind == 0 and varint() is not None:
            continue
        if kind in (1, 5) and pos + (8 if kind == 1 else 4) <= n:
            pos += 8 if kind == 1 else 4
            continue
        length = varint() if kind == 2 else None
        if length is None or pos + length > n:
            return ""
        if tag >> 3 == 2:
            try:
                return data[pos:pos + length].decode("utf-8")
            except UnicodeDecodeError:
                return ""
        pos += length
    return ""


@dataclass(frozen=True)
class PlaneRoles:
    platform: Platform
    refs: list[PlaneRef]  # the device planes
    names: list[str]  # every plane's name; "" for one whose header could not be read
    axis: TimeAxis
    warnings: tuple[str, ...]


def plane_roles(planes: list[bytes | memoryview], path) -> PlaneRoles:
    """The planes' roles and the host's time axis, from the planes' headers read one at a time
    (and the small `Task Environment` plane read whole)."""
    names, stamps, warnings = [], [], []
    unread: dict[int, str] = {}  # plane index: why its header could not be read
    task_env = None
    for i, pb in enumerate(planes):
        try:
            head, lines = _plane_lines(pb, path, head_only=True)
        except InputError as exc:
            names.append(_salvage_name(pb))  # so that a damaged device plane is still known as one
            stamps.append([])
            unread[i] = exc.message
            continue
        names.append(head.name)
        stamps.append([(line.name, line.timestamp_ns) for line in lines])
        if head.name == TASK_ENV_PLANE and task_env is None:
            try:
                task_env = parse_message(XPlane(), pb, path)
            except InputError as exc:
                warnings.append(f"plane `{TASK_ENV_PLANE}` could not be read; its `profile_start_time` is not used "
                                f"({exc.message})")
    platform, all_refs = device_planes(names)
    refs = [r for r in all_refs if r.index not in unread]
    # A damaged plane whose name is unknown may have been a device plane.
    needed = {r.index for r in all_refs} | {i for i in unread if names[i] in ("", *AUX_PLANES)}
    for i, cause in unread.items():
        if i in needed:  # a plane tpudiag does not read is not worth a warning
            warnings.append(f"plane `{names[i] or i}` could not be read and was skipped ({cause})")
    lost = [cause for i, cause in unread.items() if i in needed and names[i] not in AUX_PLANES]
    if lost and not refs:
        # A host file fails only when none of its device data can be read.
        raise InputError(lost[0], path=path)
    host_stamps = [t for name, ts in zip(names, stamps) if name == "/host:CPU" for _, t in ts]
    # Only the device lines tpudiag reads set the axis: an unread line cannot move it.
    device_stamps = [t for r in refs for line, t in stamps[r.index] if is_read_line(line, platform)]
    axis = axis_of(device_stamps, host_stamps, task_env)
    return PlaneRoles(platform, refs, names, axis, tuple(warnings))


def parse_file_or_failure(path: Path | HostUrl, plane_jobs: int = 1, also: PlaneReader | None = None,
                          data: list[bytes] | None = None) -> HostTrace | HostFailure:
    """The worker boundary (a pool process or a Dask task): any project error becomes this host's
    failure, so the others go on. The parsed host has its events (and what `also` read). `data`:
    the file's bytes when already read, alone in a list the parse empties (`_parse_file`)."""
    try:
        return _parse_file(path, plane_jobs, also, data)
    except TpudiagError as exc:
        if exc.path is None:
            exc = InputError(exc.message, path=path, hint=exc.hint)
        return HostFailure(str(path), exc.one_line(), exc.hint)


# A host task: (host file, plane_jobs) -> the parsed host or its failure. It runs in
# the process that parsed the host (pool process, Dask worker), so a task that reduces the host
# there (`analysis.host_digest.parse_and_digest`) sends back only what it keeps. Picklable.
HostTask = Callable[..., "HostTrace | HostFailure"]


def load_capture(path: Path | str, jobs: int | None = None,
                 progress: Callable[[str], None] | None = None, scheduler=None,
                 per_host: HostTask | None = None, on_host: Callable[[HostTrace], None] | None = None) -> Profile:
    """Parse every host of the capture at `path` (a local path or an fsspec URL).

    Several hosts parse in parallel processes (`jobs`), or as tasks on a Dask distributed cluster
    when `scheduler` (an address or a `distributed.Client`) is given. `per_host` replaces the
    plain parse of each host file; it is called with `keep_events`, True only for a single-host capture.
    `on_host` is called in this process with each parsed host as it arrives, before the next ones
    are gathered, so a caller can fold what a host brings instead of holding every host's.
    """
    capture = find_capture(path)
    files = capture.files
    task = functools.partial(per_host, keep_events=len(files) == 1) if per_host else parse_file_or_failure
    # Several hosts repeat one program's names and strings: the driver holds them once.
    from tpudiag.model.shared_values import SharedValues

    shared = SharedValues() if len(files) > 1 else None

    def arrived(result: HostTrace | HostFailure) -> HostTrace | HostFailure:
        if isinstance(result, HostTrace):
            if shared is not None:
                shared.share(result)
            if on_host is not None:
                on_host(result)
        return result

    results: list[HostTrace | HostFailure]
    workers = min(len(files), jobs or os.cpu_count() or 1)
    if scheduler is not None:
        if progress:
            progress(f"parsing {len(files)} hosts on the Dask cluster")
        from tpudiag.parsers.dask_hosts import map_on_dask

        order = largest_first(files)  # submitted first, started first
        results = [None] * len(files)
        for i, result in zip(order, map_on_dask(task, tuple(files[i] for i in order), scheduler, arrived)):
            results[i] = result
    elif workers <= 1 or len(files) == 1:
        results = []
        for f in files:
            if progress:
                progress(f"parsing {f.name}")
            # A single host may still use every core, plane by plane.
            results.append(arrived(task(f, plane_jobs=jobs or os.cpu_count() or 1)))
    else:
        if progress:
            progress(f"parsing {len(files)} hosts in {workers} processes")
        results = _on_pool(functools.partial(task, plane_jobs=1), files, workers, arrived)
    for f, r in zip(files, results):
        if isinstance(r, HostTrace):  # resolved here, in the caller's working directory
            r.source = str(f) if isinstance(f, HostUrl) else str(Path(f).resolve())
    hosts = [r for r in results if isinstance(r, HostTrace)]
    failures = [r for r in results if isinstance(r, HostFailure)]
    _share_programs(hosts)
    hosts, failures, notes = reconcile_hosts(hosts, failures)
    if not hosts:
        if len(failures) == 1:
            raise InputError(failures[0].message, hint=failures[0].hint)
        raise InputError(f"none of the {len(failures)} host files could be read; first: {failures[0].message}",
                         path=capture.input_path, hint=failures[0].hint)
    return Profile(input_path=str(capture.input_path), run=capture.run, hosts=hosts, failures=failures,
                   warnings=notes, modelled=any(h.modelled for h in hosts))


def largest_first(files: tuple[Path | HostUrl, ...]) -> list[int]:
    """The positions of `files`, largest file first (a URL, whose size is not asked, last): the
    order hosts are handed to the workers, so that no big host starts last while the other
    workers have nothing left to do."""
    def size(f: Path | HostUrl) -> int:
        try:
            return -1 if isinstance(f, HostUrl) else Path(f).stat().st_size
        except OSError:
            return -1  # read, and reported, by its task
    sizes = [size(f) for f in files]
    return sorted(range(len(files)), key=lambda i: -sizes[i])


def _on_pool(task: Callable, files: tuple[Path | HostUrl, ...], workers: int,
             arrived: Callable[[HostTrace | HostFailure], HostTrace | HostFailure]) -> list[HostTrace | HostFailure]:
    """`task` of every host file in `workers` local processes, the largest files first; `arrived`
    is called with each result as it finishes (not in file order: a slow host holds up no other's
    fold, and the workers are never idle while hosts are left); results in the order of `files`."""
    results: list[HostTrace | HostFailure | None] = [None] * len(files)
    with _pool(workers) as pool:
        futures = {pool.submit(task, files[i]): i for i in largest_first(files)}
        for future in as_completed(futures):
            results[futures[future]] = arrived(future.result())
    return results


def profile_from_xspace(data: bytes, path: str, run: str) -> Profile:
    """A one-host capture held in memory (a modelled one, `compiler.simulate.simulate_in_memory`),
    parsed as `load_capture` parses a host file; `path` names it in the report (the input it was
    made from). Nothing is read from or written to disk, so the host has no `source` to re-read."""
    with _host_boundary(path):
        check_trace_bytes(data, path)
        host = _parse_planes(path, [data], 1)
    hosts, failures, notes = reconcile_hosts([host], [])
    return Profile(input_path=path, run=run, hosts=hosts, failures=failures, warnings=notes,
                   modelled=any(h.modelled for h in hosts))


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
    device_hosts = [h for h in hosts if h.device.platform is not Platform.CPU]
    if device_hosts and len(device_hosts) < len(hosts):
        for h in hosts:
            if h.device.platform is Platform.CPU:
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
    import pandas as pd

    host.host = name
    for attr in _HOST_TABLES:
        df = getattr(host, attr)
        if df is not None and "host" in df.columns:
            df["host"] = pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int8), categories=[name])
