"""Small torch.distributed demos that run under ``labkit.comm.launch.launch``: each returns what every rank held
before and after, so a notebook can check the real collectives against the simulated ones (``labkit.comm.collectives``).

Run one from a notebook with ``launch(collectives_demo, 3)``, or from a terminal under torchrun::

    torchrun --nproc-per-node=3 -m labkit launch labkit.comm.demos:all_reduce_sum
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from labkit.comm.worker import rank_device


def demo_values(rank: int, length: int) -> np.ndarray:
    """The array rank ``rank`` starts with in every demo: rank r holds 10*r + 1, 10*r + 2, ... (float32)."""
    return (np.arange(length) + 10 * rank + 1).astype(np.float32)


def _start(length: int) -> torch.Tensor:
    return torch.from_numpy(demo_values(dist.get_rank(), length)).to(rank_device())


def _as_list(t: torch.Tensor) -> list[float]:
    return t.detach().cpu().tolist()


def send_recv(length: int = 4) -> dict:
    """Point-to-point: rank 0 sends its tensor to rank 1 (blocking send/recv); other ranks look on."""
    rank = dist.get_rank()
    if dist.get_world_size() < 2:
        raise ValueError("send_recv needs world_size >= 2 (a sender and a receiver)")
    t = _start(length) if rank == 0 else torch.zeros(length, device=rank_device())
    before = _as_list(t)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    return _report({"rank": rank, "before": before, "after": _as_list(t)})


def _report(out: dict) -> dict:
    """Print what this rank held before and after (launch shows it rank by rank), and return it."""
    for key, value in out.items():
        if key != "rank":
            print(f"{key:>20}: {value}")
    return out


def all_reduce_sum(length: int = 4) -> dict:
    """``all_reduce`` with ``ReduceOp.SUM``: every rank ends with the element-wise sum of all ranks' tensors."""
    t = _start(length)
    before = _as_list(t)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return _report({"rank": dist.get_rank(), "before": before, "after": _as_list(t)})


def reduce_scatter_chunk(t: torch.Tensor) -> tuple[torch.Tensor, str]:
    """This rank's chunk of the element-wise sum; gloo builds without native reduce_scatter use all_reduce + slice."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(t.chunk(world))  # length must divide by world so that every chunk has the same size
    out = torch.empty_like(chunks[rank])
    try:
        dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
        return out, "native reduce_scatter"
    except (RuntimeError, NotImplementedError):  # older gloo: same result, but every rank receives the whole sum
        full = t.clone()
        dist.all_reduce(full, op=dist.ReduceOp.SUM)
        return full.chunk(world)[rank].clone(), "all_reduce + slice (no native reduce_scatter on this backend)"


def collectives_demo(length: int | None = None) -> dict:
    """all_reduce (SUM), broadcast (from rank 0), all_gather and reduce_scatter, from the same starting tensor."""
    world, rank = dist.get_world_size(), dist.get_rank()
    length = 2 * world if length is None else length
    if length % world:
        raise ValueError(f"length must be a multiple of world_size={world} for reduce_scatter, got {length}")
    out = {"rank": rank, "before": _as_list(_start(length))}
    t = _start(length)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    out["all_reduce_sum"] = _as_list(t)
    t = _start(length)
    dist.broadcast(t, src=0)
    out["broadcast_from_0"] = _as_list(t)
    gathered = [torch.empty(length, device=rank_device()) for _ in range(world)]
    dist.all_gather(gathered, _start(length))
    out["all_gather"] = [_as_list(g) for g in gathered]
    chunk, method = reduce_scatter_chunk(_start(length))
    out["reduce_scatter_sum"], out["reduce_scatter_method"] = _as_list(chunk), method
    out["ring_all_reduce_sum"] = _as_list(ring_all_reduce(_start(length)))
    return _report(out)


def ring_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over all ranks with the ring algorithm built from point-to-point messages (Patarasuk & Yuan 2009).

    Reduce-scatter then all-gather, 2(R-1) steps; in each step every rank sends one chunk to its right-hand
    neighbour and receives one from its left. The same schedule as ``labkit.comm.collectives.allreduce(..., "ring")``.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = t.detach().clone().reshape(-1)
    chunks = list(flat.tensor_split(world))  # views into flat; lengths that do not divide by R are fine
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(2 * (world - 1)):
        reducing = step < world - 1
        s = step if reducing else step - (world - 1)
        send_idx = (rank - s) % world if reducing else (rank + 1 - s) % world
        recv_idx = (rank - s - 1) % world if reducing else (rank - s) % world
        incoming = torch.empty_like(chunks[recv_idx])
        reqs = [dist.isend(chunks[send_idx].contiguous(), dst=right), dist.irecv(incoming, src=left)]
        for req in reqs:
            req.wait()
        if reducing:
            chunks[recv_idx].add_(incoming)
        else:
            chunks[recv_idx].copy_(incoming)
    return flat.reshape(t.shape)
