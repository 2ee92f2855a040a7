"""Host files parsed as tasks on a Dask distributed cluster (`--scheduler` / `scheduler=`).

Before a `distributed.Client` is made for an address, the address is checked: its syntax, then,
for `tcp://`, that something answers there and speaks Dask. A Dask scheduler sends its handshake
(a small framed msgpack message) as soon as it accepts a connection, so the probe reads that one
message, bounded in size and time, and closes (the scheduler may log that a connection closed
before its handshake completed). Without the probe a typo'd port costs a minute: `Client` waits
for a handshake that never comes (a silent service), reads garbage as a frame length and tries to
allocate exabytes (an HTTP server), and after any failed start its `__del__` waits out its own
close timeout and prints a traceback at exit. Other schemes (`tls://`, `ws://`) get a TCP
connect check only; their handshake is inside TLS or HTTP.

The client made here is never the process's default: everything it does names it (`as_completed`
gets its loop), so no default client is needed in the caller's process.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Callable

from tpudiag.errors import UsageError

PROBE_TIMEOUT_S = 5.0  # connect, then the scheduler's first message: a local or LAN scheduler answers in ms
CLIENT_TIMEOUT_S = 10.0  # Client's own connect and handshake, once the probe has passed
WORKERS_TIMEOUT_S = 10.0  # a scheduler with no workers would leave every task pending forever
MAX_HANDSHAKE_BYTES = 1 << 16  # a Dask handshake is ~60 bytes: anything far bigger is another protocol
_TCP_SCHEMES = ("tcp", "tls", "ws", "wss")


def map_on_dask(task: Callable, files: tuple, scheduler, arrived: Callable) -> list:
    """Parse every host file as one task on the cluster; results in the order of `files`.

    `scheduler` is an address (`tcp://host:8786`) or a `distributed.Client`. Only the file names go
    to the workers, which read the files themselves (a shared filesystem or a URL); each task
    returns its parsed host or its one-line failure, so a bad host stays a per-host warning.
    `arrived` is called with each result as it finishes, so the caller can fold it.
    """
    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise UsageError("`--scheduler` needs Dask distributed",
                         hint="install the dask extra: `pip install 'tpudiag[dask]'`") from exc
    own = not isinstance(scheduler, Client)
    client = connect(scheduler) if own else scheduler
    try:
        _wait_for_workers(client, scheduler)
        futures = client.map(task, list(files), plane_jobs=1, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        for future in as_completed(futures, loop=client.loop):  # each host as it finishes
            try:
                result = future.result()
            except ImportError as exc:  # the workers' environment, not the input
                raise UsageError(f"the Dask workers cannot import what tpudiag needs ({exc})",
                                 hint="install tpudiag in the workers' environment") from exc
            arrived(result)
            results[index[future.key]] = result
            future.release()
        return results
    finally:
        if own:
            client.close()


def check_scheduler(scheduler: object) -> None:
    """UsageError in one line unless `scheduler` is None, a `distributed.Client`, or an address
    that answers as a Dask scheduler (within about `PROBE_TIMEOUT_S`). The pipeline calls it
    before reading any dump, so a wrong address fails before the slow part."""
    distributed = sys.modules.get("distributed")  # a Client exists only once distributed is imported
    if scheduler is None or (distributed is not None and isinstance(scheduler, distributed.Client)):
        return
    if not isinstance(scheduler, str):
        raise UsageError(f"scheduler must be an address such as `tcp://host:8786` or a distributed.Client, "
                         f"got a {type(scheduler).__name__}")
    scheme, host, port = check_address(scheduler)
    if scheme in _TCP_SCHEMES:
        probe(scheduler, host, port, handshake=scheme == "tcp")


def connect(address: str):
    """A `distributed.Client` for `address`, not set as the default; UsageError in one line
    (within about `PROBE_TIMEOUT_S` for an address that does not answer as Dask) otherwise."""
    from distributed import Client

    check_scheduler(address)  # again: the scheduler may have gone since the pipeline's check
    try:
        return Client(address, set_as_default=False, timeout=CLIENT_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError) as exc:
        raise _unreachable(address, str(exc) or type(exc).__name__) from exc


def check_address(address: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a scheduler address as Dask reads it (`tcp` when none is given);
    UsageError for one Dask would refuse, before anything is connected. Port None: not a TCP scheme."""
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        registry.get_backend(scheme)
        if scheme not in _TCP_SCHEMES:
            return scheme, location, None
        host, port = parse_host_port(location)
        port = int(port)
    except (ValueError, TypeError) as exc:
        raise _unreachable(address, f"not a scheduler address: {exc}") from exc
    if not (host and 0 < port < 65536):
        raise _unreachable(address, "not a scheduler address: expected `tcp://host:port`")
    return scheme, host, port


def probe(address: str, host: str, port: int, *, handshake: bool = True, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Connect to `host:port` and, with `handshake`, read the first message a Dask scheduler
    sends; UsageError naming what went wrong. Reads at most MAX_HANDSHAKE_BYTES + 8 bytes."""
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host.strip("[]"), port), timeout=timeout_s)
    except socket.gaierror as exc:
        raise _unreachable(address, f"unknown host `{host}`") from exc
    except ConnectionRefusedError as exc:
        raise _unreachable(address, "connection refused: nothing listens on that port") from exc
    except TimeoutError as exc:
        raise _unreachable(address, f"no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc)) from exc
    with sock:
        if not handshake:
            return
        header = _read(sock, 8, deadline)
        what = "it sent no Dask handshake"
        if header is None:
            raise _unreachable(address, f"{what} within {timeout_s:g} s: not a Dask scheduler?")
        if len(header) < 8:
            raise _unreachable(address, f"{what}: it closed the connection; not a Dask scheduler?")
        (size,) = struct.unpack("<Q", header)
        if not 0 < size <= MAX_HANDSHAKE_BYTES:
            raise _unreachable(address, "it does not speak the Dask protocol (its first message is not a "
                                        "Dask handshake)")
        body = _read(sock, size, deadline)
        if body is None or len(body) < size or not _is_handshake(body):
            raise _unreachable(address, "it does not speak the Dask protocol (its first message is not a "
                                        "Dask handshake)")


def _read(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """Up to `n` bytes (fewer when the peer closes); None when the deadline passes first."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            return None
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


def _is_handshake(body: bytes) -> bool:
    """Whether `body` is a Dask handshake: framed as Dask frames messages, its header frame a msgpack
    dict naming the peer's Python. Plain msgpack, no object hooks: Dask's own `loads` would unpickle
    what a stranger sent, and log a traceback when it cannot."""
    import msgpack
    from distributed.protocol.utils import unpack_frames

    try:
        frames, missing = unpack_frames(body, partial=True)
        message = msgpack.loads(frames[0], use_list=False, strict_map_key=False) if frames and not missing else None
    except Exception:  # noqa: BLE001 - any decoding failure means "not Dask"; the bytes are a stranger's
        return False
    return isinstance(message, dict) and "python" in message


def _wait_for_workers(client, scheduler) -> None:
    if client.scheduler_info().get("workers"):
        return
    try:
        client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
    except (TimeoutError, OSError) as exc:
        raise UsageError(f"the Dask scheduler at `{_name(scheduler)}` has no workers "
                         f"(none joined within {WORKERS_TIMEOUT_S:g} s)",
                         hint="start workers with `dask worker ADDRESS`") from exc


def _name(scheduler) -> str:
    return scheduler if isinstance(scheduler, str) else getattr(scheduler.scheduler, "address", "?")


def _unreachable(address: str, cause: str) -> UsageError:
    return UsageError(f"cannot reach the Dask scheduler at `{address}` ({cause})")
