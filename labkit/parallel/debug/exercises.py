"""Checked exercises for notebooks 09 and 09b: the shard a rank reads, the LR of a data-parallel job (09), and,
from :mod:`labkit.parallel.debug.hang_exercises`, naming the stuck rank and where a loop hangs (09b).

References: torch's ``DistributedSampler`` and the kit's LR rule (:func:`labkit.training.batch_rules.scaled_lr`).
"""
from __future__ import annotations

import math
import random

from torch.utils.data import DistributedSampler

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.debug.hang_exercises import HANG_POINT, STUCK_RANK  # noqa: F401 - notebook 09b's, checked as ex.*
from labkit.training.batch_rules import scaled_lr

# ------------------------------------------------------------------------------------ 09: shards and LR
def shard_reference(num_examples: int, rank: int, world_size: int) -> list[int]:
    """The indices rank ``rank`` reads in one epoch: torch's ``DistributedSampler`` without shuffling."""
    return list(DistributedSampler(range(num_examples), world_size, rank, shuffle=False))


def _shard_cases(seed: int = 14) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"num_examples": 10, "rank": 2, "world_size": 4}]
    for _ in range(10):
        r = rng.randint(2, 8)
        cases.append({"num_examples": rng.randint(r, 50), "rank": rng.randrange(r), "world_size": r})
    return cases


SHARD = Exercise(
    "shard_indices", "the indices each rank reads (as DistributedSampler, no shuffle): padded, then every R-th",
    shard_reference, _shard_cases,
    (Mistake("no_padding", lambda num_examples, rank, world_size: list(range(rank, num_examples, world_size)),
             "every rank must run the same number of steps (or the all-reduce hangs): pad the index list by "
             "wrapping around to a multiple of R before taking every R-th"),
     Mistake("contiguous", lambda num_examples, rank, world_size:
             list(range(num_examples))[rank * math.ceil(num_examples / world_size):
                                       (rank + 1) * math.ceil(num_examples / world_size)],
             "DistributedSampler interleaves: rank r takes indices r, r+R, r+2R, ... (of the padded list)")),
    "pad range(N) by repeating its start up to ceil(N/R)*R indices, then take indices[rank::R]")


def ddp_lr_reference(base_lr: float, base_batch: int, per_rank_batch: int, world_size: int) -> float:
    """LR for R ranks of ``per_rank_batch`` each: linear scaling by the GLOBAL batch (Goyal et al. 2017, 2.1)."""
    return scaled_lr(base_lr, per_rank_batch * world_size, base_batch)


def _lr_cases(seed: int = 15) -> list[dict]:
    rng = random.Random(seed)
    return [{"base_lr": rng.choice([0.01, 0.05, 0.1]), "base_batch": rng.choice([32, 64, 256]),
             "per_rank_batch": rng.choice([16, 32, 64, 128]), "world_size": rng.choice([2, 4, 8, 16])}
            for _ in range(10)]


DDP_LR = Exercise(
    "ddp_lr", "the LR for R data-parallel ranks of b samples each, from one tuned at a base batch",
    ddp_lr_reference, _lr_cases,
    (Mistake("per_rank_batch", lambda base_lr, base_batch, per_rank_batch, world_size:
             base_lr * per_rank_batch / base_batch,
             "DDP averages the gradient over ALL ranks' samples: scale by the global batch b x R, not the "
             "per-GPU batch b"),
     Mistake("times_world", lambda base_lr, base_batch, per_rank_batch, world_size: base_lr * world_size,
             "scale by global batch / base batch; the base batch need not equal the per-rank batch")),
    "lr = base_lr x (b x R) / base_batch")
