"""A reserved port stays out of the OS's hands until rank 0's store listens on it."""
from __future__ import annotations

import datetime
import socket

import pytest
import torch.distributed as dist

from labkit.comm.ports import free_port, reserved_port


def _plain_bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def test_another_bind_cannot_take_a_reserved_port():
    with reserved_port() as port, pytest.raises(OSError):
        _plain_bind(port).close()


def test_the_rival_a_chosen_free_port_can_be_taken_before_rank_zero_listens():
    """free_port alone: another program binds the port in the gap, which is the EADDRINUSE CI saw."""
    port = free_port()
    _plain_bind(port).close()


def test_rank_zeros_store_listens_on_the_reserved_port():
    with reserved_port() as port:
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=10))
        store.set("key", "value")
        assert store.get("key") == b"value"
        del store


def test_the_reservation_ends_with_the_block():
    with reserved_port() as port:
        pass
    _plain_bind(port).close()
