"""Remote logdirs fail fast, in one line naming the cause, and name the right package.

Regressions: `tpudiag report gs://bucket/x` without a network took 84 s and printed gcsfs's log
lines (with tracebacks) before "no such file or directory"; `s3://` and `hdfs://` were told
"`gs://` needs gcsfs". The Cloud Storage cases run against loopback only: gcsfs is pointed at
`STORAGE_EMULATOR_HOST`, a port nothing listens on (no network) or a tiny HTTP server here that
answers every request with one status (credentials refused, no such bucket), so no test depends
on how long a real network takes to fail.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from tests.parsers.loopback import free_port
from tpudiag.errors import InputError
from tpudiag.parsers.capture_files import find_capture
from tpudiag.parsers.remote import cause

BOUND_S = 30.0  # the bound for `gs://` without network or credentials, start-up included


@pytest.mark.parametrize(("scheme", "package"), [("s3", "s3fs"), ("abfs", "adlfs"), ("az", "adlfs"),
                                                 ("hdfs", "pyarrow"), ("gs", "gcsfs")])
def test_each_scheme_names_its_own_package(scheme: str, package: str):
    pytest.importorskip("fsspec", reason="fsspec is not installed (the cloud extra)")
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here, so `{scheme}://` has its filesystem")
    with pytest.raises(InputError) as caught:
        find_capture(f"{scheme}://bucket/logdir")
    assert f"{package} is not installed" in caught.value.message
    assert caught.value.hint.startswith(f"`{scheme}://` needs {package}")
    assert package == "gcsfs" or "gcsfs" not in caught.value.hint


def test_an_unknown_scheme_says_so():
    pytest.importorskip("fsspec", reason="fsspec is not installed (the cloud extra)")
    with pytest.raises(InputError, match="unknown URL scheme `nosuchfs://`"):
        find_capture("nosuchfs://bucket/logdir")


@pytest.fixture
def fake_gcs(request) -> Iterator[str]:
    """A loopback stand-in for the Cloud Storage JSON API answering every request with `request.param`."""
    status: int = request.param

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"error": {"code": status, "message": "refused by the test server"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _report(url: str, emulator: str) -> tuple[int, str, str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "NO_COLOR": "1", "STORAGE_EMULATOR_HOST": emulator}
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tpudiag.cli.app", "report", url], capture_output=True,
                          text=True, env=env, timeout=2 * BOUND_S)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def test_gs_without_network_is_one_line_naming_the_network():
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (the cloud extra)")
    port = free_port()
    code, out, err, seconds = _report("gs://bucket/logdir", f"http://127.0.0.1:{port}")
    assert code == 2 and out == ""
    assert err.splitlines() == [f"error: `gs://bucket/logdir`: network: cannot connect to `127.0.0.1:{port}` "
                                "(Connection refused)"], err
    assert seconds < BOUND_S


@pytest.mark.parametrize(("fake_gcs", "expected"), [
    (401, "credentials: access denied"), (403, "credentials: access denied"), (404, "no such bucket `bucket`"),
], indirect=["fake_gcs"], ids=["401", "403", "404"])
def test_gs_names_credentials_or_bucket_in_one_line_without_gcsfs_logs(fake_gcs: str, expected: str):
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (the cloud extra)")
    code, out, err, seconds = _report("gs://bucket/logdir", fake_gcs)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err  # gcsfs logs nothing to stderr
    assert err.startswith("error: `gs://bucket/logdir`: ") and expected in err, err
    assert seconds < BOUND_S


def test_an_unresolvable_endpoint_is_named_as_the_network(monkeypatch):
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (the cloud extra)")
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://storage.invalid:80")  # RFC 6761: never resolves
    with pytest.raises(InputError, match="network: cannot resolve `storage.invalid`"):
        find_capture("gs://bucket/logdir")


def test_cause_reads_the_exception_chain():
    class HttpError(Exception):
        code = 403

    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as inner:
            raise RuntimeError("request failed") from inner
    except RuntimeError as exc:
        assert cause(exc).startswith("network: ")
    assert cause(HttpError("no")).startswith("credentials: ")
    assert cause(OSError("Forbidden: b/bucket/o\nnope")).startswith("credentials: ")
    assert cause(FileNotFoundError("b/x")) == "no such bucket or object"
    assert cause(ValueError("x" * 500)).endswith("...")


def test_a_service_that_does_not_answer_is_cut_off_at_the_deadline():
    from tpudiag.parsers.remote import _with_deadline

    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(InputError, match="network or credentials: no answer within 0.5 s"):
        _with_deadline(lambda: release.wait(30), "gs://bucket/logdir", 0.5)
    assert time.monotonic() - start < 5
    release.set()
    assert _with_deadline(lambda: "listed", "gs://bucket/logdir", 5) == "listed"

    def missing() -> None:
        raise InputError("no such bucket `b`")

    with pytest.raises(InputError, match="no such bucket"):  # the work's own error reaches the caller as itself
        _with_deadline(missing, "gs://b/x", 5)
