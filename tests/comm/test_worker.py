"""The rank side: joining the process group (from a launcher's environment), binding GPUs, parent watchdogs."""
from __future__ import annotations

import os
from datetime import timedelta
import signal
import sys

import psutil
import pytest
import torch
import torch.distributed as dist

from labkit.comm import worker
from labkit.comm.launch import launch
from labkit.comm.worker import init_from_env
from labkit.comm.stop import wait_vanished
from tests.launch_support import parent_of_sleeping_ranks


# ---- functions the worker processes import by name (this module is importable from the children)
def parent_death_signal() -> int:
    import ctypes

    value = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


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


@pytest.fixture
def recorded_init(monkeypatch) -> dict:
    """What init_process_group hands torch (no group is made) for rank 1 of a 2-rank torchrun job on one node."""
    calls: dict = {}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.update(device=i))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29999")
    return calls


def test_worker_under_torchrun_on_one_gpu_joins_with_gloo(gpus, recorded_init):
    """The H100 failure: torchrun --nproc-per-node 2 on one GPU; rank 1 must not bind cuda:1."""
    gpus(1)
    assert worker.init_process_group(1, 2, 1) == "gloo"
    assert recorded_init["backend"] == "gloo" and "device" not in recorded_init


def test_worker_with_a_gpu_per_rank_binds_its_own_gpu(gpus, recorded_init):
    gpus(2)
    assert worker.init_process_group(1, 2, 1) == "nccl"
    assert recorded_init == {"backend": "nccl", "init_method": "env://", "rank": 1, "world_size": 2, "device": 1}


def test_mpi_job_on_two_nodes_uses_the_mpi_local_count(gpus, recorded_init, monkeypatch):
    """mpiexec -n 8 on 2 nodes of 4 GPUs (Open MPI's variables, no LOCAL_WORLD_SIZE): NCCL, this rank's GPU 1."""
    gpus(4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    for name, value in (("OMPI_COMM_WORLD_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "8"),
                        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert worker.init_from_env() == (5, 8)
    assert recorded_init["backend"] == "nccl" and recorded_init["device"] == 1


# ---- no orphans: the workers die with their launcher
@pytest.mark.parametrize("start_method,processes", [("fresh", 2), ("forkserver", 3)])
def test_workers_exit_when_the_launching_process_is_killed(tmp_path, start_method, processes):
    # SIGKILL gives the launcher no chance to remove its labkit-launch-* folder: keep it under tmp_path, not /tmp
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with parent_of_sleeping_ranks(tmp_path, start_method, env={**os.environ, "TMPDIR": str(tmp)}) as (parent, kids):
        assert len(kids) == processes  # killed at once: a watchdog that starts late still sees its parent gone
        assert list(tmp.glob("labkit-launch-*"))  # the launcher's folder went to the redirected TMPDIR
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_vanished(kids, 30) == []          # a zombie not yet reaped by init has exited


@pytest.mark.parametrize("start_method", ["fresh", "forkserver"])
def test_parent_death_signal_is_armed_in_workers(start_method):
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    assert launch(parent_death_signal, 2, show_output=False, start_method=start_method) == [signal.SIGKILL] * 2


def test_a_gloo_rank_computes_on_the_cpu():
    """The device a rank computes on follows the backend: gloo ranks are CPU processes, even on a GPU box."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert worker.rank_device() == torch.device("cpu")
    finally:
        dist.destroy_process_group()


def test_ranks_on_torchruns_agent_store_join_under_a_prefix_per_start_of_the_workers(monkeypatch):
    """After a restart the agent's store still holds the dead attempt's keys: each start gets its own prefix,
    counted by arrivals, so agents whose restart counts differ still agree."""
    monkeypatch.delenv("LABKIT_START", raising=False)          # restored (unset) after the test
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))   # the OS's port
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    starts = []
    for _ in range(4):                                   # two starts of a 2-rank job
        store = worker._attempt_store(2, 10.0)
        starts.append(os.environ["LABKIT_START"])
        store.set("addr", starts[-1])
    assert starts == ["0", "0", "1", "1"]
    assert server.get("labkit/start0/addr") == b"0" and server.get("labkit/start1/addr") == b"1"


def test_a_rank_result_is_one_write_so_two_ranks_lines_cannot_run_together(monkeypatch):
    """Rival: print's text and newline as two writes (11 of 120 forked-agent runs under load joined two lines)."""
    writes = []
    monkeypatch.setattr(sys, "stdout", type("Out", (), {"write": lambda self, s: writes.append(s),
                                                         "flush": lambda self: None})())
    worker.print_rank_result(1, 2, "m:f", {"a": 1})
    assert writes == ["[rank 1/2] m:f -> {'a': 1}\n"]
