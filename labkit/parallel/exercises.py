"""Checked exercises for notebooks 05, 07, 09 and 13: the pipeline bubble, the speed-up of replicas, T_sync, the
shard a rank reads, the LR of a data-parallel job, a weight split Megatron's two ways, the bytes tensor parallelism
sends per layer and the bytes each placement of a 2-D mesh sends over the slow link.

References: the GPipe schedule simulator (:mod:`labkit.parallel.pipeline`), the cost model
(:mod:`labkit.parallel.costmodel`), torch's ``DistributedSampler``, the kit's LR rule, the split the hand-written
tensor-parallel layer uses (:mod:`labkit.parallel.tensor_parallel`) and its cost formulas
(:mod:`labkit.parallel.tp_cost`).
"""
from __future__ import annotations

import math
import random

import torch
from torch.utils.data import DistributedSampler

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.hang_exercises import HANG_POINT, STUCK_RANK  # noqa: F401 - notebook 09b's, checked as ex.*
from labkit.parallel.costmodel import micro_batches_for_bubble, predicted_speedup, sync_time_s
from labkit.parallel.pipeline import bubble_fraction, simulate_gpipe
from labkit.parallel.tensor_parallel import shard_tensor
from labkit.parallel.tp_cost import tp_bytes_per_layer
from labkit.training.batch_rules import scaled_lr


# ------------------------------------------------------------------------------------ 05: the bubble
def bubble_reference(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe schedule with equal stages, measured on the kit's schedule simulator
    (equals (p-1)/(m+p-1), Huang et al. 2019)."""
    return bubble_fraction(simulate_gpipe([1.0] * stages, [2.0] * stages, micro_batches), stages)


def _bubble_cases() -> list[dict]:
    rng = random.Random(10)
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


def _m_cases() -> list[dict]:
    rng = random.Random(11)
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


# ------------------------------------------------------------------------------------ 07: replicas
def speedup_reference(t_comp_s: float, t_sync_s: float, world_size: int) -> float:
    """Epoch-time speed-up of R replicas over one: R T_comp / (T_comp + T_sync) (``costmodel``)."""
    return predicted_speedup(t_comp_s, t_sync_s, world_size)


def _speedup_cases() -> list[dict]:
    rng = random.Random(12)
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


def _sync_cases() -> list[dict]:
    rng = random.Random(13)
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


def _shard_cases() -> list[dict]:
    rng = random.Random(14)
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


def _lr_cases() -> list[dict]:
    rng = random.Random(15)
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


# ------------------------------------------------------------------------------------ 13: inside the layer
def shard_weight_reference(weight: list[list[int]], split: str, rank: int, world_size: int) -> list[list[int]]:
    """This rank's block of a Linear's weight (out_features x in_features), as the hand-written TP layer cuts it."""
    return shard_tensor(torch.tensor(weight), split, rank, world_size).tolist()


def _shard_weight_cases() -> list[dict]:
    rng = random.Random(38)
    cases = []
    for split in ("column", "row") * 3:
        t = rng.choice([2, 4])
        rows, cols = t * rng.randint(1, 3), t * rng.randint(1, 3) + (t if split == "row" else 1)
        weight = [[rng.randint(-9, 9) for _ in range(cols)] for _ in range(rows)]
        cases.append({"weight": weight, "split": split, "rank": rng.randrange(t), "world_size": t})
    return cases


def _swapped_split(weight: list[list[int]], split: str, rank: int, world_size: int) -> list[list[int]]:
    return shard_weight_reference(weight, "row" if split == "column" else "column", rank, world_size)


def _interleaved(weight: list[list[int]], split: str, rank: int, world_size: int) -> list[list[int]]:
    w = torch.tensor(weight)
    return (w[rank::world_size] if split == "column" else w[:, rank::world_size]).tolist()


SHARD_WEIGHT = Exercise(
    "shard_weight", "a rank's block of an nn.Linear weight (out x in) under a column-parallel or row-parallel split",
    shard_weight_reference, _shard_weight_cases,
    (Mistake("swapped", _swapped_split, "nn.Linear stores W as (out_features, in_features): a column-parallel "
             "linear splits the outputs, so it takes a block of W's rows; row-parallel takes a block of its columns"),
     Mistake("interleaved", _interleaved, "each rank takes one contiguous block (rank * n/t up to (rank + 1) * n/t), "
             "so its heads and hidden units stay together, not every t-th row")),
    "column-parallel: rows rank*out/t .. (rank+1)*out/t of W; row-parallel: the same block of its columns",
    rel_tol=0.0)


def tp_bytes_reference(batch: int, seq_len: int, hidden: int, world_size: int, bytes_per_element: int) -> float:
    """Bytes one rank sends per layer, forward + backward (Narayanan et al. 2021, four ring all-reduces of b*s*h)."""
    return tp_bytes_per_layer(batch, seq_len, hidden, world_size, bytes_per_element)


def tp_bytes_cases_for(batch: int, seq_len: int, hidden: int, world_size: int,
                       bytes_per_element: int = 4) -> list[dict]:
    """This notebook's layer first (its verdict shows it, next to the bytes measured), then random ones."""
    first = {"batch": batch, "seq_len": seq_len, "hidden": hidden, "world_size": world_size,
             "bytes_per_element": bytes_per_element}
    return [first] + _tp_bytes_cases()


def _tp_bytes_cases() -> list[dict]:
    rng = random.Random(39)
    return [{"batch": rng.randint(1, 16), "seq_len": rng.choice([128, 512, 2048]), "hidden": rng.choice([64, 1024, 4096]),
             "world_size": rng.choice([2, 4, 8]), "bytes_per_element": rng.choice([2, 4])} for _ in range(8)]


TP_BYTES = Exercise(
    "tp_bytes_per_layer", "bytes one rank sends per transformer layer (forward + backward) under tensor parallelism",
    tp_bytes_reference, _tp_bytes_cases,
    (Mistake("forward_only", lambda batch, seq_len, hidden, world_size, bytes_per_element:
             tp_bytes_per_layer(batch, seq_len, hidden, world_size, bytes_per_element) / 2,
             "the backward pass all-reduces too: f's backward, once per block, so four all-reduces per layer"),
     Mistake("no_ring_factor", lambda batch, seq_len, hidden, world_size, bytes_per_element:
             4.0 * batch * seq_len * hidden * bytes_per_element,
             "a ring all-reduce of N bytes sends 2(t-1)/t x N per rank, not N")),
    "4 all-reduces per layer (2 forward, 2 backward), each over b*s*h elements; a ring sends 2(t-1)/t of it per rank")


PLACEMENTS = ("tp_inside", "dp_inside")


def slow_link_reference(placement: str, tp_bytes_per_rank: float, dp_bytes_per_rank: float,
                        ranks_per_node: int) -> float:
    """Bytes one node sends over its slow link per step, 2 nodes x ranks_per_node ranks, groups across nodes of 2.

    tp_inside: TP groups are each node's ranks, each DP group pairs one rank of each node, so every rank's DP
    bytes cross; dp_inside: the opposite, every rank's TP bytes cross (a ring of two sends all to the other)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    crossing = dp_bytes_per_rank if placement == "tp_inside" else tp_bytes_per_rank
    return ranks_per_node * crossing


def _slow_link_cases() -> list[dict]:
    rng = random.Random(40)
    return [{"placement": p, "tp_bytes_per_rank": float(rng.randint(10**5, 10**9)),
             "dp_bytes_per_rank": float(rng.randint(10**5, 10**9)), "ranks_per_node": rng.choice([2, 4, 8])}
            for p in PLACEMENTS * 4]


SLOW_LINK = Exercise(
    "placement_slow_link_bytes", "bytes one node sends over the slow link per step with TP inside the nodes or across them",
    slow_link_reference, _slow_link_cases,
    (Mistake("swapped", lambda placement, tp_bytes_per_rank, dp_bytes_per_rank, ranks_per_node:
             ranks_per_node * (tp_bytes_per_rank if placement == "tp_inside" else dp_bytes_per_rank),
             "with TP inside a node its traffic stays on the fast link: what crosses is the DP traffic"),
     Mistake("one_rank", lambda placement, tp_bytes_per_rank, dp_bytes_per_rank, ranks_per_node:
             dp_bytes_per_rank if placement == "tp_inside" else tp_bytes_per_rank,
             "every rank of the node has a peer on the other node: multiply by the ranks per node")),
    "the groups that span the two nodes are the ones whose bytes cross; each of the node's ranks is in one")
