"""Checked exercises for notebook 15 (experts across ranks): the token-copies each expert computes under a capacity
factor, the all-to-all bytes one rank sends per layer, and which placement crosses the slow link less.

References: the capacity rule of :class:`labkit.parallel.experts.moe.MoEConfig`, the byte count of
:func:`labkit.parallel.experts.traffic.counted_bytes` and the per-layer formulas of
:func:`labkit.parallel.experts.traffic.ep_bytes_per_layer` (EP) and :mod:`labkit.cluster.ep_mesh` (TP on the experts),
generalised to groups that span some of a cluster's nodes: the ones the notebook's runs are checked with.
"""
from __future__ import annotations

import math
import random

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.experts.moe import MoEConfig
from labkit.parallel.experts.traffic import ALL_TO_ALLS_PER_LAYER, counted_bytes


# ------------------------------------------------------------------------------- tokens per expert under capacity
def kept_per_expert_reference(routed: list[int], tokens: int, top_k: int, capacity_factor: float) -> list[int]:
    """Token-copies each expert computes: the routed ones, capped at ceil(cf x tokens x k / E) (Fedus et al. 2021)."""
    config = MoEConfig(experts=len(routed), top_k=top_k, capacity_factor=capacity_factor)
    capacity = config.capacity(tokens)
    return [min(n, capacity) for n in routed]


def _routed_counts(rng: random.Random, tokens: int, top_k: int, experts: int) -> list[int]:
    """Copies per expert for ``tokens`` tokens each sent to ``top_k`` distinct experts, one expert favoured."""
    counts = [0] * experts
    weights = [4.0] + [1.0 + rng.random() for _ in range(experts - 1)]
    for _ in range(tokens):
        chosen: set[int] = set()
        while len(chosen) < top_k:
            chosen.add(rng.choices(range(experts), weights)[0])
        for e in chosen:
            counts[e] += 1
    return counts


def kept_cases_for(routed: list[int], tokens: int, top_k: int, capacity_factor: float) -> list[dict]:
    """This notebook's routing first (its verdict shows it next to what the ranks computed), then random ones."""
    return [{"routed": list(routed), "tokens": tokens, "top_k": top_k, "capacity_factor": capacity_factor}] + \
        _kept_cases()


def _kept_cases(seed: int = 55) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        experts, top_k = rng.choice([4, 8]), rng.choice([1, 2])
        tokens = rng.choice([50, 100, 150])
        factor = rng.choice([1.0, 1.25, 1.5])
        if math.isclose(factor * tokens * top_k / experts % 1, 0):
            tokens += 1                                   # a fractional capacity: ceil and floor differ
        cases.append({"routed": _routed_counts(rng, tokens, top_k, experts), "tokens": tokens, "top_k": top_k,
                      "capacity_factor": factor})
    return cases


def _floor_capacity(routed: list[int], tokens: int, top_k: int, capacity_factor: float) -> list[int]:
    capacity = math.floor(capacity_factor * tokens * top_k / len(routed))
    return [min(n, capacity) for n in routed]


def _no_k(routed: list[int], tokens: int, top_k: int, capacity_factor: float) -> list[int]:
    capacity = math.ceil(capacity_factor * tokens / len(routed))
    return [min(n, capacity) for n in routed]


KEPT_PER_EXPERT = Exercise(
    "kept_per_expert", "token-copies each expert computes under a capacity factor (Switch's capacity rule)",
    kept_per_expert_reference, _kept_cases,
    (Mistake("floor", _floor_capacity, "Switch rounds the capacity up: ceil(cf x tokens x k / E), so no expert gets "
             "less than its even share"),
     Mistake("no_k", _no_k, "each token sends k copies: the even share per expert is tokens x k / E"),
     Mistake("no_cap", lambda routed, tokens, top_k, capacity_factor: list(routed),
             "copies over the capacity are dropped: an expert computes min(routed, capacity)")),
    "capacity = ceil(capacity_factor x tokens x top_k / experts); each expert computes min(routed, capacity)",
    rel_tol=0.0)


# ------------------------------------------------------------------------------------ the bytes one rank sends
def a2a_bytes_reference(rank: int, send_splits: list[int], recv_splits: list[int], hidden: int,
                        bytes_per_element: int) -> int:
    """Bytes ``rank`` sends to other ranks per MoE layer, forward + backward, from its dispatch's split sizes."""
    return sum(counted_bytes(rank, send_splits, recv_splits, hidden, bytes_per_element).values())


def a2a_cases_for(rank: int, send_splits: list[int], recv_splits: list[int], hidden: int,
                  bytes_per_element: int = 4) -> list[dict]:
    """This notebook's rank first (the check prints what its sockets carried), then random ones."""
    return [{"rank": rank, "send_splits": list(send_splits), "recv_splits": list(recv_splits), "hidden": hidden,
             "bytes_per_element": bytes_per_element}] + _a2a_cases()


def _a2a_cases(seed: int = 56) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        ep = rng.choice([2, 4, 8])
        cases.append({"rank": rng.randrange(ep), "send_splits": [rng.randint(10, 300) for _ in range(ep)],
                      "recv_splits": [rng.randint(10, 300) for _ in range(ep)], "hidden": rng.choice([64, 1024, 4096]),
                      "bytes_per_element": rng.choice([2, 4])})
    return cases


def _with_own(rank: int, send_splits: list[int], recv_splits: list[int], hidden: int, bytes_per_element: int) -> int:
    return 2 * (sum(send_splits) + sum(recv_splits)) * hidden * bytes_per_element


def _dispatch_only(rank: int, send_splits: list[int], recv_splits: list[int], hidden: int,
                   bytes_per_element: int) -> int:
    return 4 * (sum(send_splits) - send_splits[rank]) * hidden * bytes_per_element


A2A_BYTES = Exercise(
    "a2a_bytes_per_layer", "bytes one rank sends to other ranks per MoE layer (forward + backward) under expert "
    "parallelism, from its dispatch's split sizes",
    a2a_bytes_reference, _a2a_cases,
    (Mistake("own_block", _with_own, "the block a rank keeps for its own experts never leaves it: leave out "
             "send_splits[rank] and recv_splits[rank]"),
     Mistake("dispatch_only", _dispatch_only, "the combine sends back what the rank received, recv_splits, not what "
             "it sent: a rank's two directions differ when routing is uneven"),
     Mistake("forward_only", lambda rank, send_splits, recv_splits, hidden, bytes_per_element:
             _with_own(rank, send_splits, recv_splits, hidden, bytes_per_element) // 2
             - (send_splits[rank] + recv_splits[rank]) * hidden * bytes_per_element,
             "backward sends too: each all-to-all's backward is the all-to-all the other way")),
    "forward: dispatch sends the rows for other ranks (send_splits, less your own), combine sends back what others "
    "sent you (recv_splits, less your own); backward repeats both; x hidden x bytes per element",
    rel_tol=0.0)


# ------------------------------------------------------------------------ which placement crosses the slow link less
def slow_link_bytes_reference(kind: str, degree: int, nodes_spanned: int, ranks_per_node: int, tokens: int,
                              top_k: int, hidden: int, bytes_per_element: int) -> float:
    """Bytes one node sends over its link per MoE layer (forward + backward) when the experts are placed over groups
    of ``degree`` ranks, each group spread evenly over ``nodes_spanned`` nodes; every rank holds ``tokens`` tokens.

    ``kind="ep"``: experts whole; a copy's expert is on another node with probability 1 - 1/nodes_spanned.
    ``kind="tp"``: every expert split over the group; a rank's tokens go to every rank of the group, and as many
    partial sums come back, so degree x (1 - 1/nodes_spanned) copies of each token cross. Two collectives forward,
    two backward."""
    away = 1 - 1 / nodes_spanned                                 # the group's ranks on other nodes, as a share
    rows = tokens * top_k * away if kind == "ep" else tokens * degree * away
    return ranks_per_node * ALL_TO_ALLS_PER_LAYER * rows * hidden * bytes_per_element


def slow_link_cases_for(kind: str, degree: int, nodes_spanned: int, ranks_per_node: int, tokens: int, top_k: int,
                        hidden: int, bytes_per_element: int = 4) -> list[dict]:
    """This notebook's placement first (the check cell prints what its eth0 counted), then random ones."""
    return [{"kind": kind, "degree": degree, "nodes_spanned": nodes_spanned, "ranks_per_node": ranks_per_node,
             "tokens": tokens, "top_k": top_k, "hidden": hidden, "bytes_per_element": bytes_per_element}] + \
        _slow_link_cases()


def _slow_link_cases(seed: int = 57) -> list[dict]:
    """Random clusters; the first two always tell every planted mistake apart (TP with k > 1 and a group with
    several ranks per node; EP over 8 ranks on 2 or 4 nodes)."""
    rng = random.Random(seed)
    shapes = [("tp", 4, 2, 4, rng.choice([2, 4, 8])), ("ep", 8, rng.choice([2, 4]), 8, rng.choice([2, 4, 8]))]
    for _ in range(4):
        degree = rng.choice([2, 4, 8])
        spanned = rng.choice([d for d in (1, 2, 4, 8) if degree % d == 0])
        shapes.append((rng.choice(["ep", "tp"]), degree, spanned, degree // spanned * rng.choice([1, 2]),
                       rng.choice([1, 2, 4, 8])))
    return [{"kind": kind, "degree": degree, "nodes_spanned": spanned, "ranks_per_node": per_node,
             "tokens": rng.choice([512, 1024, 4096]), "top_k": k, "hidden": rng.choice([1024, 4096, 7168]),
             "bytes_per_element": rng.choice([2, 4])} for kind, degree, spanned, per_node, k in shapes]


def _rank_share(kind: str, degree: int, nodes_spanned: int, ranks_per_node: int, tokens: int, top_k: int,
                hidden: int, bytes_per_element: int) -> float:
    away = (degree - 1) / degree
    rows = tokens * top_k * away if kind == "ep" else tokens * (degree - 1)
    return ranks_per_node * ALL_TO_ALLS_PER_LAYER * rows * hidden * bytes_per_element


def _tp_per_copy(kind: str, degree: int, nodes_spanned: int, ranks_per_node: int, tokens: int, top_k: int,
                 hidden: int, bytes_per_element: int) -> float:
    away = 1 - 1 / nodes_spanned
    rows = tokens * top_k * away * (1 if kind == "ep" else degree)
    return ranks_per_node * ALL_TO_ALLS_PER_LAYER * rows * hidden * bytes_per_element


SLOW_LINK = Exercise(
    "moe_slow_link_bytes", "bytes one node sends over the slow link per MoE layer (forward + backward): experts "
    "placed whole (EP) or split by columns and rows (TP) over groups spread over some of the nodes",
    slow_link_bytes_reference, _slow_link_cases,
    (Mistake("rank_share", _rank_share, "a copy sent to another rank of the same node never touches the link: the "
             "share that crosses is the group's ranks on other nodes, 1 - 1/nodes_spanned, not (degree - 1)/degree"),
     Mistake("tp_per_copy", _tp_per_copy, "TP moves each token, not each copy: every rank of the group needs the "
             "token's rows once whatever k is, so TP's bytes do not grow with top_k (EP's do)"),
     Mistake("forward_only", lambda **case: slow_link_bytes_reference(**case) / 2,
             "backward sends too: each collective's backward is the same exchange the other way (four per layer)"),
     Mistake("one_rank", lambda **case: slow_link_bytes_reference(**case) / case["ranks_per_node"],
             "every rank of the node sends its own tokens' share: multiply by ranks_per_node")),
    "EP: ranks_per_node x 4 x tokens x k x (1 - 1/nodes_spanned) x hidden x bytes; TP: the same with degree in "
    "place of k. EP crosses less when k < degree",
    rel_tol=1e-9)
