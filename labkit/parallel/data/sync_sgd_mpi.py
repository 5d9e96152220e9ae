"""Synchronous SGD under mpiexec: the from-scratch sync SGD of :mod:`labkit.parallel.data.sync_sgd` with MPI's
collectives injected, and the same training through torch.distributed joined under an MPI launcher (06b).

Run like the MPI lane's numpy-only demos, through ``labkit.comm.mpi_demos`` (``run_demo("torch_sgd", 2)``, or
``mpiexec -n 2 python -m labkit.comm.mpi_demos torch_sgd steps=5``), which imports this module by name only when
one of these demos runs, so the others start without torch.
"""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from labkit.comm.launch_env import detect_launcher_env
from labkit.comm.worker import ensure_master_addr_port, init_from_env
from labkit.parallel.data.sync_sgd import sync_sgd_worker, train_replica


def sgd(comm: Any, steps: int = 5, seed: int = 0, micro_batch: int = 8, lr: float = 0.1, bucket: bool = False) -> dict:
    """The from-scratch synchronous SGD of ``labkit.parallel.data.sync_sgd``, MPI doing the broadcast and all-reduce."""
    from mpi4py import MPI

    torch.set_num_threads(1)

    def broadcast(tensor: torch.Tensor, src: int) -> None:
        comm.Bcast(tensor.numpy(), root=src)             # a CPU tensor's numpy() view shares its memory

    def allreduce_sum(tensor: torch.Tensor) -> None:
        comm.Allreduce(MPI.IN_PLACE, tensor.numpy(), op=MPI.SUM)

    state = train_replica(comm.Get_rank(), comm.Get_size(), broadcast, allreduce_sum, steps=steps, seed=seed,
                          micro_batch=micro_batch, lr=lr, bucket=bucket)
    return {"weights": {k: v.numpy() for k, v in state.items()}}


def torch_sgd(steps: int = 5, seed: int = 0, micro_batch: int = 8, lr: float = 0.1, mpi_too: bool = False) -> dict:
    """torch.distributed (gloo) under whichever launcher started us: rank and world size come from launch_env.

    gloo on every machine, GPUs or not: the demo compares its CPU weights bit for bit with MPI's and with
    single-process training. A GPU job calls ``init_from_env()`` with ``backend="auto"`` to get NCCL.

    ``mpi_too=True`` (under an MPI launcher) also runs the same training with MPI collectives in the same
    processes (``mpi_weights``), which saves a second launch and a second torch import per rank.
    """
    place = detect_launcher_env()
    under_mpi = place.launcher in ("hydra", "openmpi", "mvapich", "pmix")
    if mpi_too and not under_mpi:
        raise ValueError(f"mpi_too=True needs an MPI launcher (mpiexec), but this rank was started by {place.launcher}")
    if under_mpi:
        ensure_master_addr_port()
    rank, world_size = init_from_env(backend="gloo", pg_timeout_s=60)
    state = sync_sgd_worker(steps=steps, seed=seed, micro_batch=micro_batch, lr=lr)
    dist.barrier()                                   # nobody tears the group down while a peer still uses it
    dist.destroy_process_group()
    print(f"rank {rank}/{world_size} via {place.launcher} (local_rank {place.local_rank}) trained {steps} steps")
    seen = {k: v for k, v in sorted(os.environ.items()) if k in _LAUNCHER_VARIABLES}
    out = {"weights": {k: v.numpy() for k, v in state.items()}, "launcher": place.launcher, "rank": rank,
           "world_size": world_size, "local_rank": place.local_rank, "variables": seen}
    if mpi_too:
        from mpi4py import MPI

        out["mpi_weights"] = sgd(MPI.COMM_WORLD, steps=steps, seed=seed, micro_batch=micro_batch, lr=lr)["weights"]
    return out


_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                       "TORCHELASTIC_RUN_ID", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK")
