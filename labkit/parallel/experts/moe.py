"""A mixture-of-experts layer by hand, in one process: a router, top-k gating, a capacity per expert, small FFN experts.

A router (a linear layer, then a softmax) scores every expert for every token; each token goes to its ``top_k``
experts (Shazeer et al. 2017, arXiv:1701.06538), its output the gate-weighted sum of theirs. Each expert takes at
most ``capacity = ceil(capacity_factor x tokens x k / experts)`` token-copies from a group of tokens; the copies
over that are dropped (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961, Section 2.2): the layer outputs
zero for them and the block's residual connection carries the token on. First choices queue before second choices,
and within a choice tokens queue in order (GShard, Lepikhin et al. 2020, arXiv:2006.16668, Algorithm 1).

Tokens are routed in groups (GShard's groups): under expert parallelism a group is one rank's tokens, so the
one-process layer given the ranks' tokens as groups routes, drops and computes exactly what the ranks do. The
pieces here (``route``, ``pack``, ``unpack``, the experts) are the ones :mod:`labkit.parallel.experts.dispatch`
runs across ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit.core.validation import positive_int


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer's shape: model width, expert FFN width, experts, experts per token, capacity factor."""

    hidden: int = 32
    ffn: int = 64
    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "experts", "top_k"):
            positive_int(getattr(self, name), name)
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed the number of experts ({self.experts})")
        if not (isinstance(self.capacity_factor, (int, float)) and self.capacity_factor > 0):
            raise ValueError(f"capacity_factor must be a positive number, got {self.capacity_factor!r}")

    @classmethod
    def fast(cls) -> "MoEConfig":
        """A small layer for the 2-core CPU and the tests."""
        return cls()

    def capacity(self, tokens: int) -> int:
        """Token-copies one expert takes from a group of ``tokens``: ceil(cf x tokens x k / E) (Fedus et al. 2021)."""
        return math.ceil(self.capacity_factor * positive_int(tokens, "tokens") * self.top_k / self.experts)

    def experts_per_rank(self, ep: int) -> int:
        """Experts each of ``ep`` ranks holds (the experts must split evenly)."""
        positive_int(ep, "ep")
        if self.experts % ep:
            raise ValueError(f"{self.experts} experts do not split evenly over {ep} ranks")
        return self.experts // ep

    def expert_rank(self, expert: int, ep: int) -> int:
        """The rank holding ``expert``: expert e sits on rank e // (E / ep), a contiguous block per rank."""
        return expert // self.experts_per_rank(ep)


@dataclass
class Routing:
    """Where one group's tokens go: router probabilities (T, E), each token's k experts and gates (T, k), whether
    each token-copy was kept under the capacity (T, k), and token-copies per expert before the capacity (E,)."""

    probs: torch.Tensor
    expert: torch.Tensor
    gate: torch.Tensor
    keep: torch.Tensor
    routed: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        """Token-copies each expert computes (E,): the routed ones, capped at the capacity."""
        return torch.bincount(self.expert[self.keep], minlength=self.routed.numel())

    @property
    def dropped(self) -> int:
        """Token-copies over capacity, dropped."""
        return int((~self.keep).sum())


def predicted_dropped(routed: torch.Tensor, capacity: int) -> int:
    """The capacity rule: an expert sent n token-copies computes min(n, C) of them and drops max(0, n - C)."""
    return int((routed - capacity).clamp(min=0).sum())


def route(logits: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """Softmax, top-k, and each token-copy's place in its expert's queue (first choices first); over capacity dropped."""
    probs = F.softmax(logits, dim=-1)                       # (T, E)
    gate, expert = probs.topk(top_k, dim=-1)                # (T, k) each
    tokens, experts = logits.shape
    choice_major = expert.t().reshape(-1)                   # (k*T,): all first choices, then all second choices
    onehot = F.one_hot(choice_major, experts)               # (k*T, E)
    place = (onehot.cumsum(0) - 1).gather(1, choice_major[:, None])[:, 0]   # place in its expert's queue
    keep = (place < capacity).view(top_k, tokens).t()       # (T, k)
    routed = torch.bincount(choice_major, minlength=experts)
    return Routing(probs, expert, gate, keep, routed)


def pack(x: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept token-copies sorted by expert: (rows (n, h), their (token, choice) flat index (n,), per expert (E,))."""
    flat_expert = routing.expert.reshape(-1)                # (T*k,), token-major
    kept = routing.keep.reshape(-1).nonzero()[:, 0]
    order = kept[torch.sort(flat_expert[kept], stable=True).indices]
    k = routing.expert.shape[1]
    return x[order // k], order, routing.kept


def unpack(rows: torch.Tensor, order: torch.Tensor, routing: Routing, tokens: int) -> torch.Tensor:
    """Combine: each token's output is the gate-weighted sum of its kept copies' expert outputs (T, h)."""
    k = routing.expert.shape[1]
    weighted = rows * routing.gate.reshape(-1)[order][:, None]
    out = rows.new_zeros(tokens, rows.shape[1])
    return out.index_add(0, order // k, weighted)


class ExpertFFN(nn.Module):
    """One expert: a small feed-forward network, hidden -> ffn -> hidden, GELU between."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> (n, hidden)."""
        return self.fc2(F.gelu(self.fc1(x)))


def run_experts(experts: nn.ModuleList, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each expert on its block of consecutive rows (``counts[i]`` rows for ``experts[i]``)."""
    blocks = rows.split(counts)
    return torch.cat([expert(block) for expert, block in zip(experts, blocks)]) if rows.numel() else rows * 0


class MoE(nn.Module):
    """The mixture of experts in one process: the router and every expert; tokens routed in groups (G, T, h)."""

    def __init__(self, config: MoEConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):                   # seeded weights, the caller's generator untouched
            torch.manual_seed(seed)
            self.router = nn.Linear(config.hidden, config.experts)
            self.experts = nn.ModuleList(ExpertFFN(config.hidden, config.ffn) for _ in range(config.experts))
        self.routings: list[Routing] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (G, T, h), G groups of T tokens -> (G, T, h); ``self.routings`` keeps each group's routing."""
        groups, tokens, _ = x.shape
        capacity = self.config.capacity(tokens)
        self.routings = [route(self.router(xg), self.config.top_k, capacity) for xg in x]
        packed = [pack(xg, rg) for xg, rg in zip(x, self.routings)]
        per_expert = [[rows.split(counts.tolist())[e] for rows, _, counts in packed]
                      for e in range(self.config.experts)]          # expert e's rows, group by group
        outs = [self.experts[e](torch.cat(blocks)).split([len(b) for b in blocks])
                for e, blocks in enumerate(per_expert)]
        result = []
        for g, (rows, order, _) in enumerate(packed):
            rows_out = torch.cat([outs[e][g] for e in range(self.config.experts)]) if len(rows) else rows * 0
            result.append(unpack(rows_out, order, self.routings[g], tokens))
        return torch.stack(result)

    def aux_input(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(router probabilities (N, E), each token's experts (N, k)) of the last forward, all groups together."""
        return (torch.cat([r.probs for r in self.routings]), torch.cat([r.expert for r in self.routings]))
