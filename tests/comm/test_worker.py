"""The rank side: joining the process group (from a launcher's environment), binding GPUs, parent watchdogs."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from labkit.comm import worker
from labkit.comm.launch import kill_tree, launch
from labkit.comm.worker import init_from_env

REPO = Path(__file__).resolve().parents[2]


# ---- functions the worker processes import by name (this module is importable from the children)
def parent_death_signal() -> int:
    import ctypes

    value = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


def sleep_forever() -> None:
    time.sleep(600)


# ---- joining a group
def test_init_from_env_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    try:
        assert init_from_env(backend="gloo") == (0, 1)
        assert dist.get_backend() == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_worker_under_torchrun_on_one_gpu_joins_with_gloo(gpus, monkeypatch):
    """The H100 failure: torchrun --nproc-per-node 2 on one GPU; rank 1 must not bind cuda:1."""
    gpus(1)
    calls = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.update(device=i))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29999")
    assert worker.init_process_group(1, 2, 1) == "gloo"
    assert calls["backend"] == "gloo" and "device" not in calls


def test_worker_with_a_gpu_per_rank_binds_its_own_gpu(gpus, monkeypatch):
    gpus(2)
    calls = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.update(device=i))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29999")
    assert worker.init_process_group(1, 2, 1) == "nccl"
    assert calls == {"backend": "nccl", "init_method": "env://", "rank": 1, "world_size": 2, "device": 1}


# ---- no orphans: the workers die with their launcher
def test_workers_exit_when_the_launching_process_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from labkit.comm.launch import launch
        import test_worker
        launch(test_worker.sleep_forever, 2, timeout_s=300)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        kids: list[psutil.Process] = []
        while time.monotonic() < deadline and len(kids) < 2:
            time.sleep(0.2)
            kids = psutil.Process(parent.pid).children()
        assert len(kids) == 2  # killed at once: a watchdog that starts late still sees its parent gone
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs(kids, timeout=30)
        assert alive == []
    finally:
        kill_tree(parent.pid)


def test_parent_death_signal_is_armed_in_workers():
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    assert launch(parent_death_signal, 1, show_output=False) == [signal.SIGKILL]
