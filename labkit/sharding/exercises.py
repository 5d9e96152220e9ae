"""Checked exercises for notebook 11: the model-state bytes per rank of ZeRO and the bytes a rank sends; and
"write the distributed code": the learner's ZeRO step (reduce-scatter, SGD on a shard, all-gather), judged on live
gloo ranks (:mod:`labkit.comm.rank_answers`) against one unsharded SGD step on the averaged gradient.

References: the ZeRO paper's formulas (``sharding.memory.zero_paper_bytes``, Rajbhandari et al. 2020, Fig. 1)
and the per-step traffic of each strategy (``sharding.comm_volume.predicted_bytes_per_step``, which the tests
hold against the ring simulator).
"""
from __future__ import annotations

import random
from typing import Any, Callable

import torch
import torch.distributed as dist

from labkit.comm.rank_answers import RankExercise
from labkit.core.exercises import Exercise, Mistake
from labkit.sharding.comm_volume import predicted_bytes_per_step
from labkit.sharding.memory import STRATEGIES, zero_paper_bytes


def zero_bytes_reference(num_params: int, strategy: str, world_size: int) -> int:
    """Model-state bytes per rank with mixed-precision Adam (2+2+12 bytes per parameter before sharding)."""
    return zero_paper_bytes(num_params, strategy, world_size)


def _zero_cases(seed: int = 22) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"num_params": 7_500_000_000, "strategy": "zero2", "world_size": 64}]
    for strategy in STRATEGIES:
        for _ in range(3):
            r = rng.choice([2, 4, 8, 64, 1024])       # num_params a multiple of R: every shard is whole bytes
            cases.append({"num_params": r * rng.randint(10**6 // r, 10**10 // r), "strategy": strategy,
                          "world_size": r})
    return cases


def _stage_factors(strategy: str, r: int) -> tuple[float, float, float]:
    return {"ddp": (1, 1, 1), "zero1": (1, 1, 1 / r), "zero2": (1, 1 / r, 1 / r), "zero3": (1 / r, 1 / r, 1 / r)}[strategy]


def _zero2_shards_params(num_params: int, strategy: str, world_size: int) -> int:
    p, g, o = _stage_factors("zero3" if strategy == "zero2" else strategy, world_size)
    return round(2 * num_params * p + 2 * num_params * g + 12 * num_params * o)


def _adam_state_4(num_params: int, strategy: str, world_size: int) -> int:
    p, g, o = _stage_factors(strategy, world_size)
    return round(2 * num_params * p + 2 * num_params * g + 8 * num_params * o)


def _grads_unsharded(num_params: int, strategy: str, world_size: int) -> int:
    return zero_paper_bytes(num_params, "zero1" if strategy == "zero2" else strategy, world_size)


ZERO_BYTES = Exercise(
    "zero_bytes_per_rank", "model-state bytes per rank (an int) for DDP and ZeRO-1/2/3 with mixed-precision Adam on "
    "R ranks; num_params is always a multiple of R, so every sharded term is a whole number",
    zero_bytes_reference, _zero_cases,
    (Mistake("zero2_like_zero1", _grads_unsharded, "ZeRO-2 shards the gradients too: each rank keeps only the "
             "gradients of its own 1/R of the optimizer state"),
     Mistake("zero2_shards_params", _zero2_shards_params, "ZeRO-2 keeps the full fp16 parameters on every rank; "
             "only ZeRO-3 shards them"),
     Mistake("optimizer_8_bytes", _adam_state_4, "mixed-precision Adam keeps an fp32 master copy of the weights "
             "besides its two fp32 moments: K = 4 + 4 + 4 = 12 bytes per parameter, not 8")),
    "fp16 params 2 bytes, fp16 grads 2, optimizer 12 per parameter; stage 1 shards the optimizer, 2 also the "
    "gradients, 3 also the parameters (divide by R: num_params is a multiple of R, so // is exact)")


def bytes_sent_reference(strategy: str, param_bytes: int, world_size: int) -> int:
    """Bytes one rank sends per step with ring collectives (``comm_volume.predicted_bytes_per_step``): a whole
    number here, since each case's buffer splits into whole 4-byte chunks per rank."""
    return round(predicted_bytes_per_step(strategy, param_bytes, world_size))


def _comm_cases(seed: int = 23) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for strategy in STRATEGIES:
        for _ in range(3):
            r = rng.choice([2, 3, 4, 6, 8, 64])
            cases.append({"strategy": strategy, "param_bytes": 4 * r * rng.randint(10**4, 10**8), "world_size": r})
    return cases


def _zero3_like_ddp(strategy: str, param_bytes: int, world_size: int) -> int:
    return round(predicted_bytes_per_step("ddp", param_bytes, world_size))


BYTES_SENT = Exercise(
    "bytes_sent_per_step", "bytes one rank sends per training step with DDP and ZeRO-1/2/3 (ring collectives)",
    bytes_sent_reference, _comm_cases,
    (Mistake("all_like_ddp", _zero3_like_ddp, "ZeRO-3 gathers the parameters twice (forward and backward) and "
             "reduce-scatters the gradients: 3 x (R-1)/R x N, 1.5x DDP's all-reduce"),
     Mistake("no_ring_factor", lambda strategy, param_bytes, world_size:
             {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3}[strategy] * param_bytes,
             "a ring collective sends (R-1)/R of the buffer per phase, not all of it")),
    "DDP: all-reduce = reduce-scatter + all-gather; each ring phase sends (R-1)/R x N; ZeRO-3 adds one all-gather")


# ------------------------------------------------------------------ 11: write the ZeRO step, judged on live ranks
def zero_step(params: torch.Tensor, grad: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One ZeRO step on this rank's shard: reduce-scatter the averaged gradient, SGD on the shard, all-gather."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # torch < 2.12
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad_shard = torch.empty(grad.numel() // world_size, dtype=grad.dtype)
    reduce_scatter(grad_shard, grad)                        # the sum over the ranks of this rank's slice
    grad_shard /= world_size
    shard = params.chunk(world_size)[rank] - lr * grad_shard
    full = torch.empty_like(params)
    all_gather(full, shard)
    return shard, full


def single_process_step(params: torch.Tensor, grad: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The kit's expected answer: every rank's gradient gathered as plain data, averaged, one unsharded SGD step as a
    single process takes it; (this rank's slice of the result, the result)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    grads = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(grads, grad)
    full = params - lr * torch.stack(grads).mean(0)
    return full.chunk(world_size)[rank].clone(), full


def zero_step_summed(params: torch.Tensor, grad: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mistake: the reduce-scatter's sum, never divided by the world size."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    grad_shard = torch.empty(grad.numel() // world_size, dtype=grad.dtype)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(grad_shard, grad)
    shard = params.chunk(world_size)[rank] - lr * grad_shard
    full = torch.empty_like(params)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(full, shard)
    return shard, full


def zero_step_unsharded(params: torch.Tensor, grad: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mistake: DDP's step, not ZeRO's: every rank all-reduces and updates all the parameters (right numbers, no
    memory saved)."""
    dist.all_reduce(grad)
    full = params - lr * grad / dist.get_world_size()
    return full, full


def zero_step_gathered_first(params: torch.Tensor, grad: torch.Tensor,
                             lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mistake: the all-gather runs before the update, so the full parameters are last step's."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    grad_shard = torch.empty(grad.numel() // world_size, dtype=grad.dtype)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(grad_shard, grad)
    full = torch.empty_like(params)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(full, params.chunk(world_size)[rank])
    return params.chunk(world_size)[rank] - lr * grad_shard / world_size, full


def zero_case(answer: Callable[..., Any], shard_len: int, lr: float, seed: int) -> list[list[float]]:
    """In a rank: seeded parameters (the same on every rank) and this rank's gradient, in halves and quarters so every
    sum is exact in float32; ``answer(params, grad, lr)``; [its shard, its full parameters] as lists."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(seed)
    params = torch.randint(-8, 9, (world_size * shard_len,), generator=gen) / 2            # (R * shard_len,)
    grads = torch.randint(-8, 9, (world_size, world_size * shard_len), generator=gen) / 4  # one row per rank
    out = answer(params.clone(), grads[rank].clone(), lr)
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise TypeError(f"zero_step returned {type(out).__name__}: return two tensors, (your updated shard, the full "
                        "updated parameters)")
    return [out[0].reshape(-1).tolist(), out[1].reshape(-1).tolist()]


def zero_cases(seed: int = 111) -> list[dict]:
    """Two seeded cases: a few parameters per rank, a power-of-two learning rate (exact in float32)."""
    rng = random.Random(seed)
    return [{"shard_len": rng.choice([2, 3, 4]), "lr": rng.choice([0.5, 0.25, 0.125]), "seed": rng.randrange(1000)}
            for _ in range(2)]


ZERO_STEP = RankExercise(
    "zero_step", "write zero_step(params, grad, lr): this rank owns shard params.chunk(R)[rank]. Reduce-scatter grad "
    "to your shard of the averaged gradient, take an SGD step on your shard only, all-gather the updated shards; "
    "return (your updated shard, the full updated parameters)",
    zero_step, single_process_step, zero_case, zero_cases,
    (Mistake("summed", zero_step_summed, "the reduce-scatter sums over the ranks, the rival 'sum without dividing': "
             "divide your gradient shard by dist.get_world_size() before the step"),
     Mistake("unsharded", zero_step_unsharded, "your full parameters are right, but your 'shard' is the whole "
             "vector, the rival 'no sharding' (DDP's step, no memory saved): update only params.chunk(R)[rank]"),
     Mistake("gathered_first", zero_step_gathered_first, "your shard is right but the full parameters are last "
             "step's, the rival 'gather before the update': all-gather the updated shard, after the SGD step")),
    "grad_shard = torch.empty(grad.numel() // R); dist.reduce_scatter_single(grad_shard, grad); divide by R; "
    "shard = params.chunk(R)[rank] - lr * grad_shard; dist.all_gather_single(full, shard)", case_s=5.0)
