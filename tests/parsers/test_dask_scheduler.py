"""`--scheduler ADDRESS` as a user runs it: the CLI in its own process, a cluster with worker
processes, no Dask client anywhere but the one tpudiag makes.

Regressions: `tpudiag report --scheduler tcp://HOST:PORT` printed `ValueError: No clients found`
(`as_completed` looked for a default client; the in-process test passed only because it made
one); `--scheduler garbage` printed its error, hung 60 s and printed a `Client.__del__`
traceback; a non-Dask service on the port gave 84 lines and `Unable to allocate 3.07 EiB`.
Only loopback addresses are used.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.parsers.loopback import free_port
from tests.parsers.test_scale_out import RUN, _comparable, _pod, _report

distributed = pytest.importorskip("distributed", reason="dask[distributed] is not installed (the dask extra)")

from tpudiag.errors import UsageError  # noqa: E402
from tpudiag.parsers.dask_hosts import check_scheduler  # noqa: E402
from tpudiag.pipeline import diagnose  # noqa: E402

# The bounds, for the whole CLI process (start-up and reading the capture included).
REFUSED_BOUND_S = 15.0
STRANGER_BOUND_S = 30.0  # it accepts the connection, then speaks something else (or nothing)


def _cli(*args: str, timeout: float = 120) -> tuple[int, str, str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "NO_COLOR": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tpudiag.cli.app", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def _no_default_client() -> bool:
    try:
        distributed.default_client()
    except ValueError:
        return True
    return False


@pytest.fixture(scope="module")
def process_cluster() -> Iterator[str]:
    """A scheduler and 2 worker processes on loopback; no client is made for it here."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def test_report_cli_on_a_process_cluster_equals_the_local_report(tmp_path: Path, process_cluster: str):
    logdir = tmp_path / "logdir"
    _pod(logdir / RUN, broken=True)
    local = _report(logdir, jobs=1)
    assert _no_default_client()
    code, out, err, _ = _cli("report", "--format", "json", "--scheduler", process_cluster, str(logdir))
    assert code == 0, err
    assert "Traceback" not in err
    assert _comparable(json.loads(out)) == local
    # In this process too, with no default client: diagnose() makes and closes its own.
    assert _report(logdir, scheduler=process_cluster) == local
    assert _no_default_client()


@pytest.fixture
def stranger(request) -> Iterator[str]:
    """A loopback TCP service that accepts and then speaks `request.param` (None: says nothing)."""
    reply: bytes | None = request.param
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                if reply is not None:
                    conn.sendall(reply)
                stop.wait(STRANGER_BOUND_S if reply is None else 1.0)  # a silent one holds the line open

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    server.close()


STRANGERS = {
    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4,  # read as a 3 EiB frame before
    "plausible-size-then-junk": struct.pack("<Q", 24) + b"\x01" + b"\xff" * 23,
    "silent": None,
}


@pytest.mark.parametrize("stranger", list(STRANGERS.values()), ids=list(STRANGERS), indirect=True)
def test_a_service_that_is_not_dask_is_one_line_and_exit_2(small_capture: Path, stranger: str):
    code, out, err, seconds = _cli("report", "--scheduler", stranger, str(small_capture))
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and "Traceback" not in err, err
    assert err.startswith(f"error: cannot reach the Dask scheduler at `{stranger}`"), err
    assert "Dask" in err.split("(", 1)[1]  # the cause says it is not Dask, not a bare exception text
    assert seconds < STRANGER_BOUND_S


@pytest.mark.parametrize("address", ["garbage", "refused"])
def test_a_wrong_or_unreachable_address_is_one_line_and_exit_2(small_capture: Path, address: str):
    address = f"tcp://127.0.0.1:{free_port()}" if address == "refused" else address
    code, out, err, seconds = _cli("report", "--scheduler", address, str(small_capture))
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and "Traceback" not in err, err
    assert err.startswith(f"error: cannot reach the Dask scheduler at `{address}`"), err
    assert seconds < REFUSED_BOUND_S


@pytest.mark.parametrize(("address", "cause"), [
    ("garbage", "missing port number"),
    ("tcp://127.0.0.1:99999", "expected `tcp://host:port`"),
    ("nosuch://127.0.0.1:1", "unknown address scheme"),
    ("tcp://127.0.0.1:1", "connection refused"),
])
def test_check_scheduler_names_the_cause(address: str, cause: str):
    with pytest.raises(UsageError, match="cannot reach the Dask scheduler") as caught:
        check_scheduler(address)
    assert cause in caught.value.message


def test_check_scheduler_passes_none_a_client_and_a_live_scheduler(process_cluster: str):
    check_scheduler(None)
    check_scheduler(process_cluster)
    with pytest.raises(UsageError, match="scheduler must be an address"):
        check_scheduler(8786)


def test_diagnose_refuses_a_bad_scheduler_before_reading_dumps(small_capture: Path, tmp_path: Path):
    # The dump directory does not exist: had it been read first, this would be an InputError.
    with pytest.raises(UsageError, match="cannot reach the Dask scheduler"):
        diagnose(small_capture, dumps=tmp_path / "no-such-dump", scheduler="garbage")
