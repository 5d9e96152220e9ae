"""Checked exercises for notebook 13 (inside the layer): a weight split Megatron's two ways, the bytes tensor
parallelism sends per layer and the bytes each placement of a 2-D mesh sends over the slow link.

References: the split the hand-written tensor-parallel layer uses (:mod:`labkit.parallel.tensor.megatron`) and its
cost formulas (:mod:`labkit.parallel.tensor.cost`). Notebooks reach them as ``labkit.parallel.exercises.*``.
"""
from __future__ import annotations

import random

import torch

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.tensor.megatron import shard_tensor
from labkit.parallel.tensor.cost import tp_bytes_per_layer


# ------------------------------------------------------------------------------------ 13: inside the layer
def shard_weight_reference(weight: list[list[int]], split: str, rank: int, world_size: int) -> list[list[int]]:
    """This rank's block of a Linear's weight (out_features x in_features), as the hand-written TP layer cuts it."""
    return shard_tensor(torch.tensor(weight), split, rank, world_size).tolist()


def _shard_weight_cases(seed: int = 38) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for split in ("column", "row") * 3:
        t = rng.choice([2, 4])
        a, b = rng.sample([1, 2, 3], 2)     # both sides split evenly (any split is possible), never square
        rows, cols = t * a, t * b
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


def tp_bytes_reference(batch: int, seq_len: int, hidden: int, world_size: int, bytes_per_element: int) -> int:
    """Bytes one rank sends per layer, forward + backward (Narayanan et al. 2021, four ring all-reduces of b*s*h):
    a whole number, compared exactly (the cases' sequence lengths split evenly over the ranks)."""
    return round(tp_bytes_per_layer(batch, seq_len, hidden, world_size, bytes_per_element))


def tp_bytes_cases_for(batch: int, seq_len: int, hidden: int, world_size: int,
                       bytes_per_element: int = 4) -> list[dict]:
    """This notebook's layer first (its verdict shows it, next to the bytes measured), then random ones."""
    first = {"batch": batch, "seq_len": seq_len, "hidden": hidden, "world_size": world_size,
             "bytes_per_element": bytes_per_element}
    return [first] + _tp_bytes_cases()


def _tp_bytes_cases(seed: int = 39) -> list[dict]:
    rng = random.Random(seed)
    return [{"batch": rng.randint(1, 16), "seq_len": rng.choice([128, 512, 2048]), "hidden": rng.choice([64, 1024, 4096]),
             "world_size": rng.choice([2, 4, 8]), "bytes_per_element": rng.choice([2, 4])} for _ in range(8)]


TP_BYTES = Exercise(
    "tp_bytes_per_layer", "bytes one rank sends per transformer layer (forward + backward) under tensor parallelism",
    tp_bytes_reference, _tp_bytes_cases,
    (Mistake("forward_only", lambda batch, seq_len, hidden, world_size, bytes_per_element:
             round(tp_bytes_per_layer(batch, seq_len, hidden, world_size, bytes_per_element) / 2),
             "the backward pass all-reduces too: f's backward, once per block, so four all-reduces per layer"),
     Mistake("no_ring_factor", lambda batch, seq_len, hidden, world_size, bytes_per_element:
             4 * batch * seq_len * hidden * bytes_per_element,
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


def _slow_link_cases(seed: int = 40) -> list[dict]:
    rng = random.Random(seed)
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
