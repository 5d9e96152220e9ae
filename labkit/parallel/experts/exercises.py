"""Checked exercises for notebook 15 (experts across ranks): the token-copies each expert computes under a capacity
factor, the all-to-all bytes one rank sends per layer, which placement crosses the slow link less, and the dispatch
itself, written with ``dist.all_to_all_single`` and judged on 3 live ranks (``DISPATCH``, ``labkit.comm.rank_answers``).

References: the capacity rule of :class:`labkit.parallel.experts.moe.MoEConfig`, the byte count of
:func:`labkit.parallel.experts.traffic.counted_bytes` and the per-layer formulas of
:func:`labkit.parallel.experts.traffic.ep_bytes_per_layer` (EP) and :mod:`labkit.cluster.ep_mesh` (TP on the experts),
generalised to groups that span some of a cluster's nodes: the ones the notebook's runs are checked with.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable

import torch
import torch.distributed as dist

from labkit.comm.rank_answers import RankExercise
from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.experts.dispatch import exchange, exchange_counts
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


# ------------------------------------------------------- write the dispatch, judged on live ranks (rank_answers)

class SplitMismatch(RuntimeError):
    """Split sizes that disagree between ranks: gloo would abort the process (SIGABRT) or hang on them."""


def _checked_all_to_all(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` behind a check (an all_gather of split sizes) that each rank expects the rows the others send."""
    def checked(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        ws = dist.get_world_size(group)
        def splits(t: torch.Tensor, given: Any) -> list[int]:
            n = t.shape[0] if t.dim() else 0
            sizes = [int(s) for s in given] if given is not None else [n // ws] * ws
            return sizes if len(sizes) == ws and sum(sizes) == n else [-1] * ws    # -1: they cannot cut the tensor
        mine = torch.tensor([splits(input, input_split_sizes), splits(output, output_split_sizes)])   # (2, ws)
        every = [torch.empty_like(mine) for _ in range(ws)]
        dist.all_gather(every, mine, group=group)
        for r, s in ((r, s) for r in range(ws) for s in range(ws)):
            sent, expected = int(every[s][0][r]), int(every[r][1][s])
            if sent != expected or sent < 0:                    # -1: split sizes that do not add up to the rows
                raise SplitMismatch(f"rank {r} expects {expected} rows from rank {s}, which sends {sent}")
        return real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    return checked


def dispatch_case(answer: Callable[..., Any], counts: list[list[int]], width: int, seed: int) -> list | str:
    """In a rank: tokens for rank j in ``counts[rank][j]`` shuffled rows; ``answer``'s rows or the splits' mismatch."""
    rank = dist.get_rank()
    dest = [j for j, n in enumerate(counts[rank]) for _ in range(n)]
    random.Random(seed + rank).shuffle(dest)
    dest = dest[::-1] if dest == sorted(dest) and len(set(dest)) > 1 else dest     # never already in order
    tokens = torch.arange(len(dest) * width, dtype=torch.float32).view(len(dest), width) + 1000.0 * rank + seed
    dist.all_to_all_single, real = _checked_all_to_all(dist.all_to_all_single), dist.all_to_all_single   # this call
    try:
        out = answer(tokens, torch.tensor(dest, dtype=torch.int64))
    except SplitMismatch as err:
        return f"split sizes that disagree between ranks: {err}"
    finally:
        dist.all_to_all_single = real
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the function returned {type(out).__name__}, not a tensor of the rows this rank received")
    return out.tolist()


def dispatch_cases(seed: int = 151, ranks: int = 3) -> list[dict]:
    """Three seeded cases on ``ranks`` ranks: uneven and zero counts, never symmetric, never even splits."""
    rng, cases = random.Random(seed), []
    while len(cases) < 3:
        counts = [[rng.choice([0, 0, 1, 2, 3, 5]) for _ in range(ranks)] for _ in range(ranks)]
        even = [[len(c) for c in torch.arange(sum(row)).tensor_split(ranks)] for row in counts]
        if counts != [list(c) for c in zip(*counts)] and counts != even and any(row.count(0) < 2 for row in counts):
            cases.append({"counts": counts, "width": rng.choice([2, 3]), "seed": rng.randrange(1000)})
    return cases


def dispatch_tokens(tokens: torch.Tensor, dest_rank: torch.Tensor) -> torch.Tensor:
    """Send row i of tokens to rank dest_rank[i]; return the rows this rank received, in source-rank order."""
    world_size = dist.get_world_size()
    order = torch.sort(dest_rank, stable=True).indices       # rows grouped by destination, each group in its order
    send = torch.bincount(dest_rank, minlength=world_size)   # rows for each rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)                       # 1. the counts: recv[j] rows will come from rank j
    out = tokens.new_empty(int(recv.sum()), tokens.shape[1])
    dist.all_to_all_single(out, tokens[order], output_split_sizes=recv.tolist(), input_split_sizes=send.tolist())
    return out                                               # 2. the rows, block j from rank j


def _sent(tokens: torch.Tensor, order: torch.Tensor, send: torch.Tensor) -> torch.Tensor:
    """tokens[order] out, ``send[j]`` rows to rank j, counts first: the kit's dispatch, one expert per rank."""
    recv = exchange_counts(send, len(send)).sum(1)
    return exchange(tokens[order], send.tolist(), recv.tolist())


def kit_dispatch(tokens: torch.Tensor, dest_rank: torch.Tensor) -> torch.Tensor:
    """The kit's answer: rows sorted by destination, counted, sent."""
    send = torch.bincount(dest_rank, minlength=dist.get_world_size())
    return _sent(tokens, torch.sort(dest_rank, stable=True).indices, send)


def _even_splits(tokens: torch.Tensor, dest_rank: torch.Tensor) -> torch.Tensor:
    """Mistake: the sorted rows cut into equal blocks, whatever each rank's count."""
    send = torch.tensor([len(c) for c in torch.arange(len(dest_rank)).tensor_split(dist.get_world_size())])
    return _sent(tokens, torch.sort(dest_rank, stable=True).indices, send)


def _unsorted(tokens: torch.Tensor, dest_rank: torch.Tensor) -> torch.Tensor:
    """Mistake: the right counts, the rows in their own order."""
    return _sent(tokens, torch.arange(len(dest_rank)), torch.bincount(dest_rank, minlength=dist.get_world_size()))


def _no_counts(tokens: torch.Tensor, dest_rank: torch.Tensor) -> torch.Tensor:
    """Mistake: no exchange of counts; each rank expects from rank j what it sends to rank j."""
    send = torch.bincount(dest_rank, minlength=dist.get_world_size()).tolist()
    out = tokens.new_empty(sum(send), tokens.shape[1])
    dist.all_to_all_single(out, tokens[torch.sort(dest_rank, stable=True).indices], send, send)
    return out


DISPATCH = RankExercise(
    "moe_dispatch", "write dispatch_tokens(tokens, dest_rank): send row i of tokens (T, h) to rank dest_rank[i] with "
    "dist.all_to_all_single and uneven split sizes (first an all_to_all_single of the counts, then the rows); "
    "return the rows this rank received, rank 0's first, each rank's rows in their original order",
    dispatch_tokens, kit_dispatch, dispatch_case, dispatch_cases,
    (Mistake("even_splits", _even_splits, "your rows were cut into equal blocks, the rival 'even splits': rank j must "
             "get exactly the rows bound for it, so input_split_sizes = torch.bincount(dest_rank, minlength=world)"),
     Mistake("unsorted", _unsorted, "the counts are right but the rows went in their own order, the rival 'unsorted "
             "rows': all_to_all_single sends block j to rank j, so sort the rows by dest_rank first (stable)"),
     Mistake("no_counts", _no_counts, "your ranks never told each other their counts, the rival 'what I send is what "
             "I get': all_to_all_single a tensor of per-rank counts first, and use it as output_split_sizes")),
    "count the rows per destination (torch.bincount), sort them by destination (stable), all_to_all_single the "
    "counts, then the rows with input_split_sizes=counts, output_split_sizes=received counts", world_size=3, case_s=5.0)
