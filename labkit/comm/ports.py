"""TCP ports for a run's rendezvous: chosen by the OS, and held until the run ends.

Choosing a free port and closing it leaves a gap before rank 0 listens on it. On a busy machine another run's
``bind(0)`` or an outgoing connection can take the port in that gap, and rank 0 fails with EADDRINUSE. A
reservation closes the gap: a socket bound (not listening) with SO_REUSEADDR keeps the port out of the OS's hands,
and rank 0's TCPStore, which also sets SO_REUSEADDR, can still listen on it.
"""
from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator

__all__ = ["free_port", "reserved_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it). Prefer :func:`reserved_port` around a run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port the OS gives to nobody else until the block ends; a listener with SO_REUSEADDR may still take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        yield int(sock.getsockname()[1])
