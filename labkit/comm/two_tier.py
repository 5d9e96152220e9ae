"""Two tiers of links: the simulator's two-level (hierarchical) all-reduce, and the alpha-beta model per link.

On a cluster a rank's neighbours sit behind two kinds of link: fast ones inside its node, a slow one between nodes.
The two-level all-reduce (reduce to one leader per node, all-reduce among the leaders, broadcast inside each
node; Horovod's hierarchical allreduce, Sergeev & Del Balso 2018, arXiv 1802.05799) sends less over the slow link
than a flat ring over every rank (the ring of Patarasuk & Yuan 2009: each rank sends 2(R-1)/R of the data, and in a
node-ordered ring one rank per node sends it across), at the price of whole-array steps inside the nodes.

Ranks are numbered node by node: rank r sits on node r // ranks_per_node. The time model is the alpha-beta model of
Thakur, Rabenseifner & Gropp 2005 with one (alpha, beta) per tier: a step costs the slowest of its messages,
alpha + nbytes * beta of the link it crosses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from labkit.comm.collectives import OPS, AllreduceResult, Step, stack_workers, allreduce, allreduce_cost
from labkit.core.validation import positive_int

_UFUNC = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


@dataclass(frozen=True)
class Link:
    """One tier's alpha-beta cost: seconds per message and seconds per byte (Thakur et al. 2005)."""

    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self) -> None:
        if not (0 <= self.alpha_s < math.inf and 0 <= self.beta_s_per_byte < math.inf):   # NaN fails both
            raise ValueError(f"alpha_s and beta_s_per_byte must be >= 0 and finite, got {self.alpha_s}, "
                             f"{self.beta_s_per_byte} (a link rate near zero makes beta infinite)")

    def time_s(self, nbytes: float) -> float:
        """alpha + nbytes * beta."""
        return self.alpha_s + nbytes * self.beta_s_per_byte


def _check_layout(world_size: int, ranks_per_node: int) -> int:
    positive_int(ranks_per_node, "ranks_per_node")
    if world_size % ranks_per_node:
        raise ValueError(f"{world_size} workers do not split into nodes of ranks_per_node={ranks_per_node}; "
                         "give every node the same number of ranks")
    return world_size // ranks_per_node


def hierarchical_allreduce(arrays: Sequence[np.ndarray], ranks_per_node: int, op: str = "sum") -> AllreduceResult:
    """Simulate the two-level all-reduce: every output equals the exact reduction, every message is logged."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    shape = np.asarray(arrays[0]).shape if len(arrays) else ()
    data = stack_workers(arrays)                                   # (world_size, n)
    world_size, nbytes = data.shape[0], int(data.nbytes // data.shape[0])
    nodes = _check_layout(world_size, ranks_per_node)
    leaders = [node * ranks_per_node for node in range(nodes)]
    steps: list[Step] = []
    for k in range(1, ranks_per_node):                      # reduce inside each node, one member per step
        for leader in leaders:
            _UFUNC[op](data[leader], data[leader + k], out=data[leader])
            steps.append(Step(k - 1, leader + k, leader, None, nbytes, "reduce"))
    first = ranks_per_node - 1
    inter = allreduce([data[leader] for leader in leaders], "ring", "sum" if op == "mean" else op)
    for s in inter.steps:                                   # the leaders' ring, renumbered to global ranks
        steps.append(Step(first + s.step, leaders[s.sender], leaders[s.receiver], s.chunk, s.nbytes, s.phase,
                          s.num_chunks))
    first += inter.num_steps
    for i, leader in enumerate(leaders):
        data[leader] = inter.outputs[i].reshape(-1)
    for k in range(1, ranks_per_node):                      # broadcast inside each node
        for leader in leaders:
            data[leader + k] = data[leader]
            steps.append(Step(first + k - 1, leader, leader + k, None, nbytes, "broadcast"))
    if op == "mean":
        data = data / world_size if not np.issubdtype(data.dtype, np.floating) else data / data.dtype.type(world_size)
    sent = np.bincount([s.sender for s in steps], weights=[s.nbytes for s in steps],
                       minlength=world_size).astype(np.int64)
    outputs = [data[i].reshape(shape) for i in range(world_size)]
    return AllreduceResult("hierarchical", op, outputs, steps, sent, nbytes, data.dtype.itemsize)


def inter_node_bytes(result: AllreduceResult, ranks_per_node: int) -> np.ndarray:
    """Bytes each node sent over the slow link (messages whose sender and receiver sit on different nodes)."""
    nodes = _check_layout(result.world_size, ranks_per_node)
    out = np.zeros(nodes, dtype=np.int64)
    for s in result.steps:
        if s.sender // ranks_per_node != s.receiver // ranks_per_node:
            out[s.sender // ranks_per_node] += s.nbytes
    return out


def two_tier_time_s(result: AllreduceResult, ranks_per_node: int, intra: Link, inter: Link) -> float:
    """Alpha-beta time of a simulated run over two tiers: each step costs its slowest message on its own link."""
    _check_layout(result.world_size, ranks_per_node)
    slowest = np.zeros(result.num_steps)
    for s in result.steps:
        link = intra if s.sender // ranks_per_node == s.receiver // ranks_per_node else inter
        slowest[s.step] = max(slowest[s.step], link.time_s(s.nbytes))
    return float(slowest.sum())


TWO_TIER_ALGORITHMS = ("flat", "hierarchical")


def two_tier_cost_s(algorithm: str, world_size: int, ranks_per_node: int, nbytes: float, intra: Link,
                    inter: Link) -> float:
    """Alpha-beta seconds of an all-reduce of ``nbytes`` per rank over two tiers, in closed form (no arrays).

    R ranks fill nodes of P in order (the last node may be partial), N = ceil(R/P) nodes. Flat ring: 2(R-1) steps of
    n/R bytes, each as slow as its slowest link, the link between nodes once N > 1. Two-level: the fullest node's
    P-1 reduce steps and P-1 broadcast steps of n bytes inside, 2(N-1) ring steps of n/N between nodes. For full
    nodes and chunks that divide evenly this equals ``two_tier_time_s`` on the simulator's message log (tested).
    """
    if algorithm not in TWO_TIER_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {TWO_TIER_ALGORITHMS}, got {algorithm!r}")
    world_size, ranks_per_node = positive_int(world_size, "world_size"), positive_int(ranks_per_node, "ranks_per_node")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    nodes = -(-world_size // ranks_per_node)
    if algorithm == "flat":
        if nodes == 1:
            return allreduce_cost("ring", world_size, int(nbytes), intra.alpha_s, intra.beta_s_per_byte)
        slowest = max(intra.time_s(nbytes / world_size), inter.time_s(nbytes / world_size))
        return 2 * (world_size - 1) * slowest
    inside = min(ranks_per_node, world_size) - 1
    return 2 * inside * intra.time_s(nbytes) + 2 * (nodes - 1) * inter.time_s(nbytes / nodes)


def predicted_times_s(nodes: int, ranks_per_node: int, nbytes: int, intra: Link, inter: Link) -> dict[str, float]:
    """Modelled seconds of the flat ring and the two-level all-reduce of ``nbytes`` per rank on full nodes."""
    world_size = positive_int(nodes, "nodes") * positive_int(ranks_per_node, "ranks_per_node")
    return {name: two_tier_cost_s(name, world_size, ranks_per_node, nbytes, intra, inter)
            for name in TWO_TIER_ALGORITHMS}
