"""Loopback helpers for tests that talk to local services (Dask schedulers, storage stand-ins)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on (bound and released: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
