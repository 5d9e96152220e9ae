"""Notebook kernels that listen on Unix sockets (ZeroMQ's ipc transport) instead of TCP ports.

Why: jupyter_client picks a kernel's five TCP ports by binding port 0 and letting go; the kernel binds them a second
or so later, once its Python has started. Anything that binds port 0 meanwhile (the gloo and TCPStore processes
these notebooks start, or a second notebook's) can take one. Taken, the iopub port leaves a kernel that runs but
never answers ("Kernel didn't respond in 60 seconds"); the shell, control or stdin port kills it. A Unix socket is a
named file, so nothing else can take it. nbval (``notebooks/conftest.py``) and the book (``scripts/book.py``) start
their kernels through :func:`ipc_kernel_manager`.
"""
from __future__ import annotations

import os
import tempfile
import uuid
from typing import TypeVar

T = TypeVar("T", bound=type)


def socket_prefix() -> str:
    """A fresh kernel's socket name prefix: ``<temp folder>/labkit-kernel-<12 hex>``, its sockets ``...-1`` to ``-5``.
    Absolute and unique, so two kernels never meet (jupyter_client's own ipc default is ``kernel-ipc`` in the working
    directory, which two notebooks in one folder share); in the temp folder, short enough for a socket path (under
    108 bytes) where a long home folder's Jupyter runtime path is not. No folder of its own: jupyter_client removes
    the socket files when it shuts the kernel down."""
    return f"{tempfile.gettempdir()}/labkit-kernel-{uuid.uuid4().hex[:12]}"


def ipc_kernel_manager(base: T) -> T:
    """A subclass of the kernel manager class ``base`` whose kernels use the ipc transport, each with its own
    :func:`socket_prefix` (unless given a transport or prefix). Windows keeps TCP: Jupyter's ipc transport needs
    POSIX sockets."""

    class IpcKernelManager(base):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: object) -> None:
            if os.name == "posix":
                kwargs.setdefault("transport", "ipc")
                kwargs.setdefault("ip", socket_prefix())
            super().__init__(**kwargs)

    IpcKernelManager.__name__ = IpcKernelManager.__qualname__ = f"Ipc{base.__name__}"
    return IpcKernelManager  # type: ignore[return-value]
