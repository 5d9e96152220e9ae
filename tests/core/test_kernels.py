"""Kernels on Unix sockets: the port race they remove, provoked as a CI run met it, and what they leave behind."""
import importlib.util
import os
import socket
import subprocess
import tempfile
from pathlib import Path

import nbval.kernel
from jupyter_client.manager import KernelManager

from labkit.core.kernels import ipc_kernel_manager, socket_prefix

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _started(km: KernelManager, wait_s: float) -> str:
    """'ready' or the client's error, after starting ``km``'s kernel's channels and waiting up to ``wait_s``."""
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=wait_s)
        return "ready"
    except RuntimeError as e:
        return str(e)
    finally:
        kc.stop_channels()


def test_a_tcp_kernel_whose_iopub_port_a_neighbour_takes_runs_but_never_answers():
    """The failure a quiet CI run met (notebook 13: "Kernel didn't respond in 60 seconds"): jupyter_client picked the
    ports, and another process bound the iopub port before the kernel's Python had started."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(stderr=subprocess.DEVNULL)
    neighbour = socket.socket()
    try:
        neighbour.bind(("127.0.0.1", km.iopub_port))      # the kernel is still importing: it binds a second later
        neighbour.listen()
        assert _started(km, 8) == "Kernel didn't respond in 8 seconds"
        assert km.is_alive()                              # alive, so only the timeout ends the wait
    finally:
        neighbour.close()
        km.shutdown_kernel(now=True)


def test_an_ipc_kernel_has_no_port_to_take_and_answers(tmp_path):
    km = ipc_kernel_manager(KernelManager)(kernel_name="python3", ip=str(tmp_path / "k"))
    km.start_kernel(stderr=subprocess.DEVNULL)
    try:
        info = km.get_connection_info()
        assert info["transport"] == "ipc" and info["ip"] == str(tmp_path / "k")
        assert _started(km, 60) == "ready"
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"k-{i}" for i in range(1, 6)]   # five named sockets
    finally:
        km.shutdown_kernel(now=True)
    assert not list(tmp_path.iterdir())                   # jupyter_client removes them at shutdown


def test_nbval_starts_its_kernels_through_the_ipc_manager():
    spec = importlib.util.spec_from_file_location("notebooks_conftest", NOTEBOOKS / "conftest.py")
    before = nbval.kernel.KernelManager
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert nbval.kernel.KernelManager.__mro__[1] is before
        assert nbval.kernel.KernelManager(kernel_name="python3").transport == "ipc"
    finally:
        nbval.kernel.KernelManager = before


def test_each_kernel_gets_its_own_absolute_short_prefix_and_leaves_no_socket_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, second = socket_prefix(), socket_prefix()
    assert first != second and os.path.isabs(first) and len(f"{first}-5") < 108
    km = ipc_kernel_manager(KernelManager)(kernel_name="python3")
    assert km.ip.startswith(f"{tmp_path}/labkit-kernel-")
    km.start_kernel(stderr=subprocess.DEVNULL)
    try:
        assert _started(km, 60) == "ready"
        assert len(list(tmp_path.glob("labkit-kernel-*"))) == 5
    finally:
        km.shutdown_kernel(now=True)
    assert not list(tmp_path.glob("labkit-kernel-*"))


def test_a_manager_given_its_own_transport_keeps_it():
    km = ipc_kernel_manager(KernelManager)(kernel_name="python3", transport="tcp")
    assert km.transport == "tcp"


def test_windows_keeps_tcp(monkeypatch):
    monkeypatch.setattr(os, "name", "nt")
    assert ipc_kernel_manager(KernelManager)(kernel_name="python3").transport == "tcp"
