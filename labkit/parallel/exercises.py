"""Checked exercises for notebooks 05, 05b, 07, 09 and 13: the pipeline bubble, the activations and the action order
of a pipeline schedule, the speed-up of replicas, T_sync, the shard a rank reads, the LR of a data-parallel job, a
weight split Megatron's two ways, the bytes tensor parallelism sends per layer and the bytes each placement of a 2-D
mesh sends over the slow link.

References: the GPipe schedule simulator (:mod:`labkit.parallel.pipeline`), the schedules' action orders
(:mod:`labkit.parallel.schedule_sim`, checked against torch's live ``Schedule1F1B`` in notebook 05b), the cost
model (:mod:`labkit.parallel.costmodel`), torch's ``DistributedSampler``, the kit's LR rule, the split the
hand-written tensor-parallel layer uses (:mod:`labkit.parallel.tensor_parallel`) and its cost formulas
(:mod:`labkit.parallel.tp_cost`).
"""
from __future__ import annotations

import math
import random

from torch.utils.data import DistributedSampler

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.hang_exercises import HANG_POINT, STUCK_RANK  # noqa: F401 - notebook 09b's, checked as ex.*
from labkit.parallel.costmodel import micro_batches_for_bubble, predicted_speedup, sync_time_s
from labkit.parallel.pipeline import bubble_fraction, simulate_gpipe
from labkit.parallel.schedule_sim import gpipe_order, one_f_one_b_order, peak_in_flight
from labkit.parallel.tp_exercises import (SHARD_WEIGHT, SLOW_LINK, TP_BYTES,  # noqa: F401 - notebook 13's, checked as ex.*
                                         tp_bytes_cases_for)
from labkit.training.batch_rules import scaled_lr


# ------------------------------------------------------------------------------------ 05: the bubble
def bubble_reference(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe schedule with equal stages, measured on the kit's schedule simulator
    (equals (p-1)/(m+p-1), Huang et al. 2019)."""
    return bubble_fraction(simulate_gpipe([1.0] * stages, [2.0] * stages, micro_batches), stages)


def _bubble_cases(seed: int = 10) -> list[dict]:
    rng = random.Random(seed)
    return [{"stages": rng.randint(2, 8), "micro_batches": rng.randint(1, 32)} for _ in range(10)]


BUBBLE = Exercise(
    "bubble_fraction", "the idle share of a GPipe schedule with p equal stages and m micro-batches",
    bubble_reference, _bubble_cases,
    (Mistake("over_m", lambda stages, micro_batches: (stages - 1) / micro_batches,
             "the schedule lasts m + p - 1 slots, not m: divide the p - 1 idle slots by m + p - 1"),
     Mistake("over_m_plus_p", lambda stages, micro_batches: (stages - 1) / (micro_batches + stages),
             "off by one: filling the pipe takes p - 1 extra slots, so the schedule is m + p - 1 slots long")),
    "each stage idles p - 1 of the m + p - 1 slots of the forward (and again of the backward) pass",
    rel_tol=1e-9)


def micro_batches_reference(stages: int, max_bubble: float) -> int:
    """Smallest m whose bubble (p-1)/(m+p-1) is at most ``max_bubble`` (``costmodel.micro_batches_for_bubble``)."""
    return micro_batches_for_bubble(stages, max_bubble)


def _m_cases(seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    return [{"stages": rng.randint(2, 16), "max_bubble": rng.choice([0.05, 0.1, 0.2, 0.25, 0.3, 0.5])}
            for _ in range(10)] + [{"stages": 4, "max_bubble": 0.25}]


MICRO_BATCHES = Exercise(
    "micro_batches_for_bubble", "the fewest micro-batches that keep the bubble of p stages at or below b",
    micro_batches_reference, _m_cases,
    (Mistake("floor", lambda stages, max_bubble: max(1, math.floor((stages - 1) * (1 - max_bubble) / max_bubble)),
             "round UP: m must be at least (p-1)(1-b)/b, so a fractional answer needs the next whole number"),
     Mistake("over_b", lambda stages, max_bubble: math.ceil((stages - 1) / max_bubble),
             "solve (p-1)/(m+p-1) <= b for m: m >= (p-1)(1-b)/b, not (p-1)/b")),
    "solve (p-1)/(m+p-1) <= b for the smallest whole m")


# ------------------------------------------------------------------------------------ 05b: schedules
def activations_held_reference(schedule: str, stages: int, stage: int, micro_batches: int) -> int:
    """Most micro-batches whose activations ``stage`` holds at once under 'gpipe' or '1f1b' (PipeDream-Flush):
    counted on the schedule's action order (forwards done minus backwards done)."""
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    order = gpipe_order(micro_batches) if schedule == "gpipe" else one_f_one_b_order(stages, stage, micro_batches)
    return peak_in_flight(order)


def _held_cases(seed: int = 16) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"schedule": "1f1b", "stages": 4, "stage": 0, "micro_batches": 2}]
    for _ in range(12):
        p = rng.randint(2, 8)
        cases.append({"schedule": rng.choice(["gpipe", "1f1b"]), "stages": p, "stage": rng.randrange(p),
                      "micro_batches": rng.randint(p, 4 * p)})
    return cases


ACTIVATIONS_HELD = Exercise(
    "activations_held", "how many micro-batches' activations a stage holds at its peak, GPipe vs 1F1B",
    activations_held_reference, _held_cases,
    (Mistake("always_m", lambda schedule, stages, stage, micro_batches: micro_batches,
             "that is GPipe: 1F1B starts each micro-batch's backward as soon as it can, so a stage never holds "
             "more than the micro-batches still ahead of it in the pipe"),
     Mistake("always_p", lambda schedule, stages, stage, micro_batches:
             micro_batches if schedule == "gpipe" else stages,
             "under 1F1B stage s holds p - s micro-batches: the last stage only one (its backward follows at once)"),
     Mistake("no_cap", lambda schedule, stages, stage, micro_batches:
             micro_batches if schedule == "gpipe" else stages - stage,
             "with fewer micro-batches than p - s, a stage cannot hold more than m")),
    "GPipe: every forward before any backward; 1F1B: p - s forwards fill the pipe, then one backward per forward")


def one_f_one_b_reference(stages: int, stage: int, micro_batches: int) -> list[str]:
    """The actions of stage ``stage`` of ``stages`` under 1F1B, in order: ['F0', 'F1', 'B0', 'F2', ...]."""
    return one_f_one_b_order(stages, stage, micro_batches)


def _order_cases(seed: int = 17) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"stages": 2, "stage": 0, "micro_batches": 4}, {"stages": 4, "stage": 3, "micro_batches": 4},
             {"stages": 4, "stage": 0, "micro_batches": 2}]
    for _ in range(8):
        p = rng.randint(2, 6)
        cases.append({"stages": p, "stage": rng.randrange(p), "micro_batches": rng.randint(1, 3 * p)})
    return cases


def _no_warmup(stages: int, stage: int, micro_batches: int) -> list[str]:
    """Alternates from the start, F0 B0 F1 B1 ...: right for the last stage only."""
    return [a for i in range(micro_batches) for a in (f"F{i}", f"B{i}")]


ONE_F_ONE_B_ORDER = Exercise(
    "one_f_one_b_order", "the order of the forward and backward actions of one 1F1B stage",
    one_f_one_b_reference, _order_cases,
    (Mistake("gpipe", lambda stages, stage, micro_batches: gpipe_order(micro_batches),
             "that is GPipe (all forwards, then all backwards): 1F1B starts backwards once the pipe is full"),
     Mistake("same_warmup", lambda stages, stage, micro_batches:
             one_f_one_b_order(stages, 0, micro_batches),
             "the warm-up depends on the stage: stage s runs p - s forwards before its first backward"),
     Mistake("no_warmup", _no_warmup,
             "B0 can only start once micro-batch 0 has gone through the p - s - 1 later stages and come back; "
             "meanwhile stage s keeps the pipe full: p - s forwards before its first backward")),
    "stage s: F0 .. F(p-s-1), then B0, F(p-s), B1, ... until the forwards run out, then the remaining backwards")


# ------------------------------------------------------------------------------------ 07: replicas
def speedup_reference(t_comp_s: float, t_sync_s: float, world_size: int) -> float:
    """Epoch-time speed-up of R replicas over one: R T_comp / (T_comp + T_sync) (``costmodel``)."""
    return predicted_speedup(t_comp_s, t_sync_s, world_size)


def _speedup_cases(seed: int = 12) -> list[dict]:
    rng = random.Random(seed)
    return [{"t_comp_s": rng.uniform(0.01, 1.0), "t_sync_s": rng.uniform(0.0, 1.0), "world_size": rng.randint(2, 64)}
            for _ in range(10)]


SPEEDUP = Exercise(
    "speedup", "the speed-up of R synchronous replicas, each step T_comp of compute then T_sync of all-reduce",
    speedup_reference, _speedup_cases,
    (Mistake("ignores_sync", lambda t_comp_s, t_sync_s, world_size: float(world_size),
             "R replicas do R batches per step, but every step now also waits T_sync: R T_comp / (T_comp + T_sync)"),
     Mistake("no_r", lambda t_comp_s, t_sync_s, world_size: t_comp_s / (t_comp_s + t_sync_s),
             "each step of R replicas processes R batches: multiply by R"),
     Mistake("sync_times_r", lambda t_comp_s, t_sync_s, world_size:
             world_size * t_comp_s / (t_comp_s + world_size * t_sync_s),
             "T_sync is the all-reduce's time for the whole step, paid once per step, not once per replica")),
    "time for R batches alone: R T_comp; with R replicas: T_comp + T_sync")


def ring_sync_time_reference(nbytes: int, world_size: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """T_sync of a ring all-reduce, alpha-beta model: 2(R-1) alpha + 2(R-1)/R N / bandwidth (``costmodel``)."""
    return sync_time_s(nbytes, world_size, latency_s, bandwidth_bytes_per_s, algorithm="ring")


def _sync_cases(seed: int = 13) -> list[dict]:
    rng = random.Random(seed)
    return [{"nbytes": 4 * rng.randint(1, 25_000_000), "world_size": rng.randint(2, 64),
             "latency_s": rng.choice([5e-6, 2e-5, 1e-4]), "bandwidth_bytes_per_s": rng.choice([1e9, 12.5e9, 4.5e11])}
            for _ in range(10)]


RING_SYNC_TIME = Exercise(
    "ring_sync_time_s", "T_sync of a ring all-reduce of N gradient bytes: latency alpha per step, bandwidth B",
    ring_sync_time_reference, _sync_cases,
    (Mistake("one_phase", lambda nbytes, world_size, latency_s, bandwidth_bytes_per_s:
             (world_size - 1) * (latency_s + nbytes / world_size / bandwidth_bytes_per_s),
             "reduce-scatter AND all-gather: 2(R-1) steps, not R-1"),
     Mistake("whole_buffer", lambda nbytes, world_size, latency_s, bandwidth_bytes_per_s:
             2 * (world_size - 1) * (latency_s + nbytes / bandwidth_bytes_per_s),
             "each ring step moves one chunk of N/R bytes, not all N")),
    "2(R-1) steps, each paying alpha plus one chunk of N/R bytes at the bandwidth")


def speedup_cases_for(t_comp_s: float, t_sync_s: float, world_size: int) -> list[dict]:
    """The notebook's measured T_comp and T_sync first, then random cases."""
    return [{"t_comp_s": float(t_comp_s), "t_sync_s": float(t_sync_s), "world_size": world_size}] + _speedup_cases()


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
