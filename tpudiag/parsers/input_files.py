"""Bounded, regular-file-only reads of untrusted input files, and a bounded gzip inflater.

Every trace, dump and side file goes through `read_input_bytes`: a FIFO or a link to a device
(`/dev/zero`) named like a trace would otherwise block `open()` or grow without end, and a huge
file would exhaust memory before any parser could complain. Compressed values go through
`inflate_bounded`, which stops as soon as the output passes its cap instead of inflating a
decompression bomb whole.
"""

from __future__ import annotations

import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from tpudiag.errors import InputError

TRACE_SUFFIX = ".xplane.pb"  # a host file of an XProf capture: `<logdir>/plugins/profile/<run>/<host>.xplane.pb`

_ENV_MAX_FILE_MB = "TPUDIAG_MAX_INPUT_MB"


@dataclass(frozen=True)
class ReadLimits:
    """Caps on what one input may cost. Generous: real captures reach a few GB per host."""

    max_file_bytes: int = 32 << 30  # one trace or dump file
    max_inflated_bytes: int = 64 << 20  # one gzip-compressed stat value, once decompressed

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_inflated_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ReadLimits.{name} must be positive, got {getattr(self, name)}")


def default_limits() -> ReadLimits:
    """The limits in force: `TPUDIAG_MAX_INPUT_MB` (MiB per file) overrides the file cap."""
    raw = os.environ.get(_ENV_MAX_FILE_MB, "").strip()
    if not raw:
        return ReadLimits()
    if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
        raise InputError(f"{_ENV_MAX_FILE_MB}={raw!r} is not a positive whole number of MiB")
    return ReadLimits(max_file_bytes=int(raw) << 20)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def size_error(path: Path | str, size: int, cap: int) -> InputError:
    return InputError(f"file is {_mib(size)}, over the {_mib(cap)} input size cap", path=path,
                      hint=f"raise the cap with {_ENV_MAX_FILE_MB}=<MiB> if the file is genuine")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _os_error(exc: OSError, path: Path | str) -> InputError:
    if isinstance(exc, IsADirectoryError):
        return InputError("is a directory, not a file", path=path)
    if isinstance(exc, PermissionError):
        return InputError("permission denied", path=path)
    if isinstance(exc, FileNotFoundError):
        return InputError("no such file", path=path)
    return InputError(f"cannot read file ({exc.strerror or exc})", path=path)


def read_input_bytes(path: Path | str, limits: ReadLimits | None = None, *, limit: int = -1) -> bytes:
    """The bytes of the regular file `path` (its first `limit` bytes when limit >= 0).

    Opened non-blocking so that a FIFO cannot stall the open itself, then checked on the open
    descriptor (no window for the path to be swapped after a check). Over the size cap is an
    InputError naming the file and the cap.
    """
    limits = limits or default_limits()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(exc, path) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{_kind(info.st_mode)}, not a regular file; not read", path=path)
        if limit < 0 and info.st_size > limits.max_file_bytes:
            raise size_error(path, info.st_size, limits.max_file_bytes)
        cap = limits.max_file_bytes + 1 if limit < 0 else min(limit, limits.max_file_bytes + 1)
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            # Ask for the size fstat gave (a read of `cap` would allocate the whole cap up front),
            # then keep reading in chunks should the file still be growing.
            data = fh.read(min(cap, info.st_size + 1))
            while len(data) < cap:
                more = fh.read(min(cap - len(data), 1 << 24))
                if not more:
                    break
                data += more
    except OSError as exc:
        raise _os_error(exc, path) from exc
    finally:
        if fd >= 0:
            os.close(fd)
    if limit < 0 and len(data) > limits.max_file_bytes:  # the file grew while being read
        raise size_error(path, len(data), limits.max_file_bytes)
    return data


def read_input_text(path: Path | str, limits: ReadLimits | None = None, *, limit: int = -1) -> str:
    """`read_input_bytes` decoded as UTF-8, undecodable bytes replaced."""
    return read_input_bytes(path, limits, limit=limit).decode("utf-8", errors="replace")


def inflate_bounded(data: bytes, max_bytes: int, what: str = "compressed value",
                    path: str | Path | None = None) -> bytes | None:
    """Gunzip (or zlib-inflate) `data`, at most `max_bytes` out.

    Damaged or truncated data gives None (the caller decides what a lost value means); output
    past `max_bytes` is an InputError naming `path`. Streams in bounded chunks, so a bomb costs about
    `max_bytes` of memory and stops as soon as it passes the cap.
    """
    inflater = zlib.decompressobj(wbits=47)  # 32 + 15: accept a gzip or a zlib header
    out = bytearray()
    pending = data
    try:
        while pending and not inflater.eof:
            out += inflater.decompress(pending, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                raise InputError(f"{what} inflates beyond the {_mib(max_bytes)} cap (a decompression bomb?)",
                                 path=path)
            pending = inflater.unconsumed_tail
    except zlib.error:
        return None
    return bytes(out) if inflater.eof else None
