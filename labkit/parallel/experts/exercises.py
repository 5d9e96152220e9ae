"""Checked exercises for notebook 15 (experts across ranks): the token-copies each expert computes under a capacity
factor, and the all-to-all bytes one rank sends per layer.

References: the capacity rule of :class:`labkit.parallel.experts.moe.MoEConfig` and the byte count of
:func:`labkit.parallel.experts.traffic.counted_bytes`, the ones the notebook's runs are checked with.
"""
from __future__ import annotations

import math
import random

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.experts.moe import MoEConfig
from labkit.parallel.experts.traffic import counted_bytes


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
