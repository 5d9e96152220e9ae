"""Checked exercises for notebook 11: the model-state bytes per rank of ZeRO and the bytes a rank sends.

References: the ZeRO paper's formulas (``sharding.memory.zero_paper_bytes``, Rajbhandari et al. 2020, Fig. 1)
and the per-step traffic of each strategy (``sharding.comm_volume.predicted_bytes_per_step``, which the tests
hold against the ring simulator).
"""
from __future__ import annotations

import random

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
            cases.append({"num_params": rng.randint(10**6, 10**10), "strategy": strategy,
                          "world_size": rng.choice([2, 4, 8, 64, 1024])})
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
    "zero_bytes_per_rank", "model-state bytes per rank for DDP and ZeRO-1/2/3 with mixed-precision Adam on R ranks",
    zero_bytes_reference, _zero_cases,
    (Mistake("zero2_like_zero1", _grads_unsharded, "ZeRO-2 shards the gradients too: each rank keeps only the "
             "gradients of its own 1/R of the optimizer state"),
     Mistake("zero2_shards_params", _zero2_shards_params, "ZeRO-2 keeps the full fp16 parameters on every rank; "
             "only ZeRO-3 shards them"),
     Mistake("optimizer_8_bytes", _adam_state_4, "mixed-precision Adam keeps an fp32 master copy of the weights "
             "besides its two fp32 moments: K = 4 + 4 + 4 = 12 bytes per parameter, not 8")),
    "fp16 params 2 bytes, fp16 grads 2, optimizer 12 per parameter; stage 1 shards the optimizer, 2 also the "
    "gradients, 3 also the parameters (divide by R)")


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
