"""Synchronous data-parallel SGD from scratch, with the communication injected.

Why it is correct: the loss of the combined batch is the mean of the replicas' micro-batch losses,
and the gradient is linear, so the gradient of that mean is the mean of the replicas' gradients.
All-reduce those gradients (sum, then divide by the world size), take the same optimizer step on
every replica from the same starting weights, and every replica follows exactly the trajectory of
single-process training on the combined batch (Goyal et al. 2017, "Accurate, Large Minibatch SGD",
section 2; Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training").

The two collectives are passed in as callables, ``broadcast(tensor, src)`` and ``allreduce_sum(tensor)``
(both in place), so the same code runs on ``torch.distributed`` (below) and on MPI (``mpi4py``).
The ``*_worker`` functions are module-level so ``labkit.comm.launch.launch`` can import them by name.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.comm.launch import launch
from labkit.core.step import TrainStep
from labkit.core.validation import checked_int, positive_int
from labkit.training.reference import (ToyProblem, build_toy_model, copy_weights, shard, toy_batch, toy_optimizer,
                                      train_single_process)

Broadcast = Callable[[torch.Tensor, int], None]
AllreduceSum = Callable[[torch.Tensor], None]


# ---------------------------------------------------------------------------- the derivation, checked
def micro_batch_gradients(problem: ToyProblem, world_size: int,
                          step: int = 0) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Per-replica gradients on each micro-batch, and the single-process gradient on the combined batch."""
    world_size = checked_int(world_size, "world_size")
    model = build_toy_model(problem, problem.seed)
    x, y = toy_batch(problem, step, world_size * problem.micro_batch)
    loss_fn = nn.CrossEntropyLoss()                                   # mean over the batch
    per_replica = []
    for rank in range(world_size):
        model.zero_grad()
        loss_fn(model(shard(x, rank, world_size)), shard(y, rank, world_size)).backward()
        per_replica.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    loss_fn(model(x), y).backward()
    return per_replica, [p.grad.clone() for p in model.parameters()]


def gradient_of_sum_error(problem: ToyProblem, world_size: int, step: int = 0) -> float:
    """Max |mean of replica gradients - combined-batch gradient| over all parameters (should be ~1e-8)."""
    per_replica, full = micro_batch_gradients(problem, world_size, step)
    averaged = [torch.stack(gs).mean(0) for gs in zip(*per_replica)]
    return max(float((a - f).abs().max()) for a, f in zip(averaged, full))


# ---------------------------------------------------------------------------- the two collectives
def sync_initial_weights(model: nn.Module, broadcast: Broadcast, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every replica (in place, by broadcast)."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            broadcast(tensor.data, src)


def sync_gradients(model: nn.Module, allreduce_sum: AllreduceSum, world_size: int, *, bucket: bool = False) -> None:
    """Replace every gradient by the mean over replicas: all-reduce (sum) then divide by ``world_size``.

    ``bucket=False`` (naive): one all-reduce per parameter. ``bucket=True``: flatten all gradients into
    one buffer and all-reduce it once, the way DDP's gradient buckets save per-message latency.
    """
    world_size = checked_int(world_size, "world_size")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        raise ValueError("no gradients to synchronise: call loss.backward() before sync_gradients")
    if bucket:
        flat = torch.cat([g.reshape(-1) for g in grads])             # (total_params,)
        allreduce_sum(flat)
        flat /= world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return
    for g in grads:
        allreduce_sum(g)
        g /= world_size


# ---------------------------------------------------------------------------- training
def train_replica(rank: int, world_size: int, broadcast: Broadcast, allreduce_sum: AllreduceSum, *,
                  steps: int, seed: int = 0, micro_batch: int = 8, lr: float = 0.1, bucket: bool = False,
                  ) -> dict[str, torch.Tensor]:
    """From-scratch synchronous SGD on the toy problem; returns this replica's final state_dict (CPU)."""
    world_size = positive_int(world_size, "world_size")
    checked_int(rank, "rank", minimum=0, maximum=world_size - 1, hint="ranks count from 0 to world_size - 1")
    checked_int(steps, "steps", minimum=0)
    problem = ToyProblem(seed=seed, micro_batch=micro_batch, lr=lr)
    model = build_toy_model(problem, init_seed=seed + rank)           # deliberately different per rank
    sync_initial_weights(model, broadcast, src=0)                     # ... until rank 0's weights win
    train_step = TrainStep(model, toy_optimizer(model, problem),           # the gradients averaged before the update
                           grad_hook=lambda m: sync_gradients(m, allreduce_sum, world_size, bucket=bucket))
    for step in range(steps):
        x, y = toy_batch(problem, step, world_size * micro_batch)
        train_step(shard(x, rank, world_size), shard(y, rank, world_size))
    return copy_weights(model)


# ---------------------------------------------------------------------------- torch.distributed workers
def torch_broadcast(tensor: torch.Tensor, src: int) -> None:
    """``broadcast`` for train_replica, on the current torch.distributed process group."""
    dist.broadcast(tensor, src)


def torch_allreduce_sum(tensor: torch.Tensor) -> None:
    """``allreduce_sum`` for train_replica, on the current torch.distributed process group."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def sync_sgd_worker(steps: int, seed: int = 0, micro_batch: int = 8, lr: float = 0.1,
                    bucket: bool = False) -> dict[str, torch.Tensor]:
    """Run inside launch(): the from-scratch sync SGD on torch.distributed."""
    torch.set_num_threads(1)
    return train_replica(dist.get_rank(), dist.get_world_size(), torch_broadcast, torch_allreduce_sum,
                         steps=steps, seed=seed, micro_batch=micro_batch, lr=lr, bucket=bucket)


def ddp_worker(steps: int, seed: int = 0, micro_batch: int = 8, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Run inside launch(): the same training with PyTorch DistributedDataParallel."""
    torch.set_num_threads(1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    problem = ToyProblem(seed=seed, micro_batch=micro_batch, lr=lr)
    model = DDP(build_toy_model(problem, init_seed=seed + rank))      # DDP broadcasts rank 0's weights
    train_step = TrainStep(model, toy_optimizer(model, problem))     # DDP averages the gradients in backward
    for step in range(steps):
        x, y = toy_batch(problem, step, world_size * micro_batch)
        train_step(shard(x, rank, world_size), shard(y, rank, world_size))
    return copy_weights(model.module)


def sync_vs_ddp_worker(steps: int, seed: int = 0, micro_batch: int = 8, lr: float = 0.1) -> dict[str, dict]:
    """Run inside launch(): from-scratch (naive and bucketed) and DDP training in one process group."""
    return {"scratch": sync_sgd_worker(steps, seed, micro_batch, lr),
            "scratch_bucketed": sync_sgd_worker(steps, seed, micro_batch, lr, bucket=True),
            "ddp": ddp_worker(steps, seed, micro_batch, lr)}


def run_sync_sgd_comparison(world_size: int = 2, steps: int = 10, seed: int = 0, micro_batch: int = 8,
                            lr: float = 0.1, timeout_s: float = 120.0) -> dict[str, object]:
    """Launch the comparison on ``world_size`` real processes; per-rank state_dicts plus the reference.

    Returns ``{"scratch": [rank0, rank1, ...], "scratch_bucketed": [...], "ddp": [...], "single": state}``.
    """
    # gloo on purpose, GPUs or not: this is a proof to float precision against a CPU reference (CPU tensors,
    # deterministic kernels); the timing lessons are the ones that follow choose_backend onto the GPUs
    per_rank = launch(sync_vs_ddp_worker, world_size, kwargs=dict(steps=steps, seed=seed, micro_batch=micro_batch,
                      lr=lr), backend="gloo", timeout_s=timeout_s, show_output=False)
    out: dict[str, object] = {k: [r[k] for r in per_rank] for k in ("scratch", "scratch_bucketed", "ddp")}
    out["single"] = train_single_process(world_size, steps=steps, seed=seed, micro_batch=micro_batch, lr=lr)
    return out
