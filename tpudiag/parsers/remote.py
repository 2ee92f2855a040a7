"""Captures behind fsspec URLs (`gs://bucket/logdir`): listing, reading, and failing in one line.

A cloud filesystem left to itself fails slowly and loudly: without a network gcsfs retries each
call with backoff (about 30 s a call, 84 s for one `report`) and logs each failure with its
traceback to stderr. So, before the first call:

- the loggers of fsspec and its backends get a NullHandler, so their records never reach
  Python's last-resort stderr handler (an application that configures logging still sees them);
- where the service's endpoint is known (`gs://`: Cloud Storage, or `STORAGE_EMULATOR_HOST`),
  it is connected to with a short timeout before the filesystem is made: no network is then
  said in seconds (gcsfs would first spend 15 s looking for credentials on a metadata server);
- making the filesystem and its first call run under a deadline (`FIRST_ANSWER_TIMEOUT_S`),
  and what they raise is named by its cause: network, credentials, or a bucket or path that
  does not exist.

Each scheme's missing backend is named in its own hint (`s3://` needs s3fs, not gcsfs).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from tpudiag.errors import InputError

CONNECT_TIMEOUT_S = 5.0  # the endpoint check: a reachable cloud endpoint answers in well under a second
FIRST_ANSWER_TIMEOUT_S = 20.0  # credentials and the first listing call (gcsfs alone may spend 15 s on credentials)
_QUIET_LOGGERS = ("fsspec", "gcsfs", "s3fs", "adlfs", "aiobotocore", "google.auth", "aiohttp.client")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

# The package each scheme's fsspec backend lives in, and how to install it.
_BACKENDS = {
    "gs": ("gcsfs", "pip install 'tpudiag[cloud]'"), "gcs": ("gcsfs", "pip install 'tpudiag[cloud]'"),
    "s3": ("s3fs", "pip install s3fs"), "s3a": ("s3fs", "pip install s3fs"),
    "abfs": ("adlfs", "pip install adlfs"), "abfss": ("adlfs", "pip install adlfs"),
    "az": ("adlfs", "pip install adlfs"), "hdfs": ("pyarrow", "pip install pyarrow"),
    "http": ("aiohttp", "pip install aiohttp requests"), "https": ("aiohttp", "pip install aiohttp requests"),
    "sftp": ("paramiko", "pip install paramiko"), "ssh": ("paramiko", "pip install paramiko"),
    "hf": ("huggingface_hub", "pip install huggingface_hub"), "oci": ("ocifs", "pip install ocifs"),
}


def quiet_remote_logs() -> None:
    """Keep fsspec's and its backends' log records off stderr unless the application routes them."""
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())


def filesystem(url: str):
    """(fsspec filesystem, path inside it) for a URL; InputError naming the package to install
    when fsspec or this scheme's backend is missing, or when fsspec knows no such scheme."""
    quiet_remote_logs()
    try:
        import fsspec
    except ImportError as exc:
        raise InputError("reading URLs needs fsspec", path=url,
                         hint="install the cloud extra: `pip install 'tpudiag[cloud]'`") from exc
    scheme = url.split("://", 1)[0].lower()
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        from fsspec.registry import known_implementations

        package, install = _BACKENDS.get(scheme, (None, None))
        if package is not None:
            raise InputError(f"no filesystem for `{scheme}://`: {package} is not installed", path=url,
                             hint=f"`{scheme}://` needs {package}: `{install}`") from exc
        if scheme in known_implementations:
            raise InputError(f"no filesystem for `{scheme}://` ({exc})", path=url,
                             hint=known_implementations[scheme].get("err") or None) from exc
        raise InputError(f"unknown URL scheme `{scheme}://`: fsspec has no filesystem for it", path=url,
                         hint="pass a local path, or a URL fsspec reads (`gs://`, `s3://`, ...)") from exc


def find_remote(url: str, suffix: str) -> tuple[str, list[str]]:
    """(run name, host file URLs) for an fsspec URL of a logdir, a run directory or one trace file
    (host files end in `suffix`), as `capture_files.find_capture` finds them locally."""
    quiet_remote_logs()
    check_endpoint(url)  # before the filesystem is made: gcsfs looks for credentials at once, with retries
    # The deadline bounds the first answer (credentials, then what `url` is); listing a logdir
    # of many runs after that may take as long as it takes.
    fs, root, kind = _with_deadline(lambda: _first_answer(url), url, FIRST_ANSWER_TIMEOUT_S)
    if kind == "file":
        return root.rsplit("/", 1)[0].rsplit("/", 1)[-1], [url]
    try:
        run_dir = root
        runs_root = f"{root}/plugins/profile"
        if fs.isdir(runs_root):
            runs = sorted(d for d in fs.ls(runs_root, detail=False)
                          if fs.isdir(d) and fs.glob(f"{d.rstrip('/')}/*{suffix}"))
            if not runs:
                raise InputError(f"no run with `*{suffix}` files under plugins/profile", path=url)
            run_dir = runs[-1].rstrip("/")  # runs are named by timestamp: the last is the newest
        files = sorted(fs.glob(f"{run_dir}/*{suffix}"))
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - backends raise their own types (HttpError, ClientError...)
        raise InputError(f"cannot list: {cause(exc)}", path=url) from exc
    if not files:
        raise InputError(f"no `*{suffix}` trace files here (expected a logdir, a run directory "
                         "or a trace file)", path=url)
    return run_dir.rsplit("/", 1)[-1], [fs.unstrip_protocol(f) for f in files]


def _first_answer(url: str) -> tuple[object, str, str]:
    """(filesystem, path inside it, `file` or `directory`): the first calls, which find out whether
    the network, the credentials and the bucket are there."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    try:
        kind = fs.info(root).get("type")  # not isfile/isdir: they answer False for any error
    except FileNotFoundError:
        raise InputError(_missing(fs, root), path=url) from None
    except Exception as exc:  # noqa: BLE001 - backends raise their own types (HttpError, ClientError...)
        raise InputError(f"cannot list: {cause(exc)}", path=url) from exc
    return fs, root, "file" if kind == "file" else "directory"


def _missing(fs, root: str) -> str:
    """'no such bucket' when the bucket itself is absent, else 'no such file or directory'."""
    bucket = root.split("/", 1)[0]
    if bucket and bucket != root:
        try:
            fs.info(bucket)
        except FileNotFoundError:
            return f"no such bucket `{bucket}`"
        except Exception:  # noqa: BLE001 - the path is missing either way; the bucket check is a nicety
            pass
    return "no such file or directory"


def read_remote_bytes(url: str, cap: int, too_big: Callable[[int], InputError]) -> bytes:
    """The bytes of the object at `url`: its listed size is checked against `cap` first, and the
    read stops one byte past it should the object lie about its size (`too_big(size)` is raised)."""
    fs, inner = filesystem(url)
    try:
        size = fs.size(inner)
        if size is not None and size > cap:
            raise too_big(size)
        with fs.open(inner, "rb") as f:
            data = f.read(cap + 1)
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError("no such file", path=url) from exc
    except Exception as exc:  # noqa: BLE001 - backends raise their own types
        raise InputError(f"cannot read: {cause(exc)}", path=url) from exc
    if len(data) > cap:
        raise too_big(len(data))
    return data


def _gcs_endpoint() -> str:
    """Where gcsfs sends its requests: the Cloud Storage JSON API of the configured universe, or
    the emulator `STORAGE_EMULATOR_HOST` names."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator not in ("", "default"):
        return emulator if emulator.startswith(("http://", "https://")) else f"http://{emulator}"
    return f"https://storage.{os.environ.get('GOOGLE_CLOUD_UNIVERSE_DOMAIN', 'googleapis.com')}"


_ENDPOINTS: dict[str, Callable[[], str]] = {"gs": _gcs_endpoint, "gcs": _gcs_endpoint}


def check_endpoint(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """InputError naming the network when the URL's service cannot be connected to.

    Only for schemes whose endpoint is known (`_ENDPOINTS`), and not behind a proxy (the proxy,
    not this machine, then connects)."""
    endpoint = _ENDPOINTS.get(url.split("://", 1)[0].lower())
    if endpoint is None or any(os.environ.get(v) for v in _PROXY_VARS):
        return
    parts = urlsplit(endpoint())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except socket.gaierror as exc:
        raise InputError(f"network: cannot resolve `{parts.hostname}` (no network or no DNS?)", path=url) from exc
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise InputError(f"network: cannot connect to `{parts.hostname}:{port}` ({why})", path=url) from exc


def cause(exc: BaseException) -> str:
    """What a backend's exception means to the user: network, credentials, missing, or its text."""
    chain = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in chain:
        code = getattr(e, "code", None) or getattr(e, "status", None)
        module = type(e).__module__ or ""
        forbidden = str(e).startswith("Forbidden")  # gcsfs's plain OSError for HTTP 403
        if isinstance(e, PermissionError) or code in (401, 403) or forbidden or module.startswith("google.auth"):
            return f"credentials: access denied ({_short(e)})"
        if isinstance(e, FileNotFoundError) or code == 404:
            return "no such bucket or object"
    for e in chain:
        if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or "Connect" in type(e).__name__:
            return f"network: {_short(e)}"
    return _short(exc)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _with_deadline(work: Callable, url: str, timeout_s: float):
    """`work()`, or InputError when it has not finished after `timeout_s` (it is left to finish in a
    daemon thread: an fsspec call cannot be cancelled, and the process must not wait for it)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=run, name="tpudiag-remote-list", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise InputError(f"network or credentials: no answer within {timeout_s:g} s while looking for "
                         "credentials and reading the bucket", path=url)
    if "error" in box:
        raise box["error"]
    return box["value"]
