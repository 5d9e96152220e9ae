"""Multi-GPU pitfalls in the data each rank sees (PyTorch side), each run broken and then fixed, returning evidence.

1. Uneven last batch: DistributedSampler pads ranks to equal length (duplicating samples); a last
   batch of one sample makes BatchNorm1d raise (PyTorch skips an *empty* batch); ``drop_last`` fixes it.
2. Per-replica batches that are too small: samples/s measured by batch size.
3. DistributedSampler padding double-counts samples in a distributed evaluation (real processes).
7. Each rank needs its own shard; learning-rate scaling with the number of workers (Goyal et al. 2017,
   "Accurate, Large Minibatch SGD", arXiv:1706.02677) — a starting point that is then tuned.

Pitfalls 4-6 (what one rank does differently) are in ``labkit.parallel.debug.rank_pitfalls``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from labkit.comm.backend import check_data_size
from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.models import MLP
from labkit.core.step import TrainStep
from labkit.core.timing import time_fn
from labkit.core.validation import checked_int, positive_int, positive_ints, positive_number


# ---------------------------------------------------------------------------------------------- pitfall 1
@dataclass(frozen=True)
class TorchUnevenBatchEvidence:
    """Pitfall 1's evidence: padded shards, the 1-sample last batch that breaks BatchNorm, and drop_last's fix."""

    samples_per_rank: tuple[int, ...]          # DistributedSampler(drop_last=False): padded to equal length
    duplicated_samples: int                    # samples that appear twice across ranks because of the padding
    last_batch_sizes: tuple[int, ...]          # per rank, DataLoader(drop_last=False)
    broken_error: str | None                   # BatchNorm1d on the 1-sample last batch
    fixed_last_batch_sizes: tuple[int, ...]    # DataLoader(drop_last=True)
    fixed_stats_finite: bool
    empty_batch_changes_stats: bool            # does BatchNorm update its statistics on a 0-sample batch?


def _train_bn_over(batches: list[torch.Tensor]) -> tuple[nn.BatchNorm1d, str | None]:
    bn = nn.BatchNorm1d(4).train()
    try:
        for xb in batches:
            bn(xb)
    except ValueError as err:
        return bn, str(err)
    return bn, None


def torch_uneven_last_batch(num_examples: int = 65, batch_size: int = 8,
                            world_size: int = 2) -> TorchUnevenBatchEvidence:
    """Pitfall 1, PyTorch side: the real DistributedSampler and BatchNorm1d, ranks simulated by ``rank=``."""
    check_data_size(world_size, positive_int(num_examples, "num_examples"))
    per_rank = -(-num_examples // world_size)                             # the sampler pads every rank to this
    checked_int(batch_size, "batch_size", maximum=per_rank,
                hint=f"each rank holds {per_rank} samples and drop_last=True must leave one full batch")
    data = torch.randn(num_examples, 4, generator=torch.Generator().manual_seed(0))
    shards = [list(DistributedSampler(range(num_examples), world_size, r, shuffle=False)) for r in range(world_size)]
    counts = np.bincount(np.concatenate(shards), minlength=num_examples)
    last, errors, fixed_last, finite = [], [], [], True
    for idx in shards:
        batches = [data[idx[i:i + batch_size]] for i in range(0, len(idx), batch_size)]
        last.append(len(batches[-1]))
        errors.append(_train_bn_over(batches)[1])
        full = [b for b in batches if len(b) == batch_size]                 # what drop_last=True yields
        fixed_last.append(len(full[-1]))
        bn, _ = _train_bn_over(full)
        finite &= bool(torch.isfinite(bn.running_mean).all() and torch.isfinite(bn.running_var).all())
    bn, _ = _train_bn_over([data[:batch_size]])
    before = bn.running_mean.clone()
    bn(data[:0])                                                           # a 0-sample batch
    return TorchUnevenBatchEvidence(tuple(map(len, shards)), int((counts > 1).sum()), tuple(last),
                                    next((e for e in errors if e), None), tuple(fixed_last), finite,
                                    not torch.equal(before, bn.running_mean))


# ---------------------------------------------------------------------------------------------- pitfall 2
def samples_per_s_by_batch(model: nn.Module, batch_sizes: tuple[int, ...] = (2, 8, 32), *,
                           image_shape: tuple[int, int, int] = (3, 32, 32), repeats: int = 5,
                           cpu_threads: int | None = 1) -> dict[int, float]:
    """Training-step throughput (samples/s, median) for each per-replica batch size on this device.

    On a CPU it uses ``cpu_threads`` torch threads (default 1, restored afterwards): multi-threaded ops on a
    shared, busy machine stall waiting for descheduled threads, which would drown the batch-size effect.
    """
    return samples_per_s_rounds(model, batch_sizes, rounds=1, image_shape=image_shape, repeats=repeats,
                                cpu_threads=cpu_threads)[0]


def samples_per_s_rounds(model: nn.Module, batch_sizes: tuple[int, ...] = (2, 64), *, rounds: int = 5,
                         image_shape: tuple[int, int, int] = (3, 32, 32), repeats: int = 3,
                         cpu_threads: int | None = 1) -> list[dict[int, float]]:
    """Training-step samples/s per batch size in interleaved paired rounds, one dict per round: each round times
    every batch size in turn (median of ``repeats`` steps), so a burst of other work hits every batch size alike."""
    batch_sizes = positive_ints(batch_sizes, "batch_sizes")
    rounds = positive_int(rounds, "rounds")
    checked_int(cpu_threads, "cpu_threads", allow_none=True)
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = torch.get_num_threads()
    if cpu_threads is not None and device.type == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        return [_throughputs(model, opt, batch_sizes, image_shape, repeats, device) for _ in range(rounds)]
    finally:
        torch.set_num_threads(before)


def _throughputs(model, opt, batch_sizes, image_shape, repeats, device) -> dict[int, float]:
    out = {}
    step = TrainStep(model, opt, device=device)
    for bs in batch_sizes:
        x = torch.randn(bs, *image_shape, device=device)
        y = torch.randint(0, 10, (bs,), device=device)
        out[bs] = bs / time_fn(lambda: step(x, y), warmup=2, repeats=repeats, device=device).median_s
    return out


# ---------------------------------------------------------------------------------------------- pitfall 3
def _shard_totals(correct: list[int], indices: list[int]) -> dict:
    totals = torch.tensor([sum(correct[i] for i in indices), len(indices)], dtype=torch.float64,
                          device=rank_device())
    dist.all_reduce(totals)                                    # sum (correct, seen) over all ranks
    return {"indices": indices, "correct": float(totals[0]), "seen": float(totals[1])}


def sharded_eval_worker(correct: list[int]) -> dict:
    """One rank: accuracy counts on DistributedSampler's padded shard, then on an unpadded shard."""
    rank, world_size, n = dist.get_rank(), dist.get_world_size(), len(correct)
    padded = list(DistributedSampler(range(n), world_size, rank, shuffle=False))
    return {"padded": _shard_totals(correct, padded),
            "unpadded": _shard_totals(correct, list(range(rank, n, world_size)))}   # the fix: uneven shards


@dataclass(frozen=True)
class ShardedEvalEvidence:
    """Pitfall 3's evidence: the exact accuracy, the padded shards' (samples double-counted) and the fix's."""

    exact_accuracy: float
    padded_accuracy: float
    padded_samples_seen: int
    fixed_accuracy: float
    fixed_samples_seen: int


def padded_eval_accuracy(correct: list[int], world_size: int = 3, timeout_s: float = 120.0) -> ShardedEvalEvidence:
    """Pitfall 3: distributed accuracy with DistributedSampler's padding vs unpadded shards (real processes)."""
    if not correct or any(c not in (0, 1) for c in correct):
        raise ValueError("correct must be a non-empty list of 0/1 flags (1 = prediction was right)")
    check_data_size(world_size, len(correct), "the evaluation set")
    res = launch(sharded_eval_worker, world_size, args=(list(map(int, correct)),), timeout_s=timeout_s,
                 show_output=False)[0]
    pad, fix = res["padded"], res["unpadded"]
    return ShardedEvalEvidence(float(np.mean(correct)), pad["correct"] / pad["seen"], int(pad["seen"]),
                               fix["correct"] / fix["seen"], int(fix["seen"]))


# ---------------------------------------------------------------------------------------------- pitfall 7
def shard_coverage(num_examples: int, world_size: int, use_sampler: bool) -> dict[str, int]:
    """Samples read per epoch by all ranks together, and how many of them are distinct."""
    num_examples, world_size = positive_int(num_examples, "num_examples"), positive_int(world_size, "world_size")
    if use_sampler:
        reads = [list(DistributedSampler(range(num_examples), world_size, r, shuffle=True, seed=0))
                 for r in range(world_size)]
    else:                                               # every rank iterates the whole dataset
        reads = [list(range(num_examples)) for _ in range(world_size)]
    flat = np.concatenate(reads)
    return {"samples_read": int(len(flat)), "distinct": int(len(np.unique(flat))), "per_rank": len(reads[0])}


def lr_scaling_run(x: torch.Tensor, y: torch.Tensor, xv: torch.Tensor, yv: torch.Tensor, *, global_batch: int,
                   lr: float, epochs: int = 3, seed: int = 0) -> float:
    """Train an MLP with plain SGD at ``global_batch`` and ``lr`` for ``epochs``; validation accuracy.

    One process with batch k*B computes the same averaged gradient as k synchronous workers with B each.
    """
    checked_int(global_batch, "global_batch", maximum=len(x), hint=f"the training set has {len(x)} samples")
    positive_number(lr, "lr")
    positive_int(epochs, "epochs")
    torch.manual_seed(seed)
    model = MLP(int(max(y.max(), yv.max())) + 1, in_features=x[0].numel(), hidden=128)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=lr))
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - global_batch + 1, global_batch):
            idx = perm[i:i + global_batch]
            if not torch.isfinite(step(x[idx], y[idx]).loss):
                return float("nan")                     # diverged: the learning rate is too large for this batch
    with torch.no_grad():
        return float((model(xv).argmax(1) == yv).float().mean())


# ---------------------------------------------------------------------------------------------- helpers
def dataset_arrays(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """All of a map-style dataset as numpy arrays (x, y), in order."""
    x, y = next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False)))
    return x.numpy(), y.numpy()
