"""Expert parallelism by hand: each rank holds E/ep experts; tokens travel to their experts' ranks and back through
two all-to-alls with uneven split sizes (GShard, Lepikhin et al. 2020, arXiv:2006.16668, Section 2.2).

On every rank: route the rank's own tokens (the same router everywhere), ``pack`` the kept token-copies sorted by
expert, tell every rank how many copies it will get for each of its experts (a small all-to-all of counts), send
the rows (``dispatch``), run the local experts, send the outputs back the way they came (``combine``), and sum
each token's gate-weighted outputs. The row all-to-alls are
``torch.distributed.nn.functional.all_to_all_single``, which carries autograd: its backward is the all-to-all
the other way, so forward and backward each send two. The router's gradient is each rank's part of the whole;
``sync_router_grads`` sums it, as data parallelism would.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from labkit.core.clock import now_s
from labkit.core.timing import synchronize
from labkit.parallel.experts.moe import MoE, MoEConfig, Routing, pack, route, run_experts, unpack


def exchange(rows: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
    """The all-to-all the lesson is about: rows[i-th block] go to rank i; block j of the result came from rank j."""
    out = rows.new_empty(sum(recv_splits), rows.shape[1])
    return dist_fn.all_to_all_single(out, rows, output_split_sizes=recv_splits, input_split_sizes=send_splits)


def exchange_counts(per_expert: torch.Tensor, ep: int) -> torch.Tensor:
    """Copies per expert (E,) out; (ep, E/ep) in: row j = what rank j sends for each of this rank's experts."""
    out = torch.empty_like(per_expert)
    dist.all_to_all_single(out, per_expert.contiguous())                   # equal splits of E/ep counts each
    return out.view(ep, -1)


class ExpertParallelMoE(nn.Module):
    """This rank's part of an MoE: the whole router, experts ``first .. first + E/ep - 1``; input its tokens (T, h).

    Each forward records, in ``self.last``, the split sizes it sent and received, the routing, and the seconds spent
    in its experts and waiting in the combine (the straggler shows up there)."""

    def __init__(self, reference: MoE, rank: int, ep: int) -> None:
        super().__init__()
        self.config: MoEConfig = reference.config
        self.rank, self.ep = rank, ep
        per_rank = self.config.experts_per_rank(ep)
        self.first = rank * per_rank
        self.router = _copy_linear(reference.router)
        self.experts = nn.ModuleList(_copy_expert(reference.experts[e], self.config)
                                     for e in range(self.first, self.first + per_rank))
        self.last: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, h) this rank's tokens -> (T, h)."""
        tokens = x.shape[0]
        routing = route(self.router(x), self.config.top_k, self.config.capacity(tokens))
        rows, order, per_expert = pack(x, routing)
        send = per_expert.view(self.ep, -1).sum(1).tolist()         # copies for each rank's experts
        incoming = exchange_counts(per_expert, self.ep)             # (ep, E/ep)
        recv = incoming.sum(1).tolist()
        arrived = exchange(rows, send, recv)                        # dispatch: rows grouped by source rank
        synchronize(x.device)                                       # a clock read means done, not launched (GPU)
        start = now_s()
        by_expert = _source_to_expert_order(incoming)
        done = run_experts(self.experts, arrived[by_expert], incoming.sum(0).tolist())
        computed = torch.empty_like(done).index_copy(0, by_expert, done)   # back in arrival order
        synchronize(x.device)
        expert_s = now_s() - start
        start = now_s()
        returned = exchange(computed, recv, send)                   # combine: outputs back to their tokens' ranks
        synchronize(x.device)
        self.last = {"send": send, "recv": recv, "routing": routing, "received_per_expert": incoming.sum(0).tolist(),
                     "expert_s": expert_s, "combine_s": now_s() - start}
        return unpack(returned, order, routing, tokens)

    @property
    def routing(self) -> Routing:
        """The last forward's routing of this rank's tokens."""
        return self.last["routing"]

    def sync_router_grads(self) -> None:
        """Sum the router's gradients over the ranks: each rank saw only its own tokens."""
        for p in self.router.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)


def _source_to_expert_order(incoming: torch.Tensor) -> torch.Tensor:
    """Row indices that regroup arrived rows (source-major, then expert) into expert-major, then source order."""
    sources, local = incoming.shape
    ids = torch.arange(local).repeat(sources)                      # each (source, expert) block's local expert
    expert_of_row = ids.repeat_interleave(incoming.reshape(-1))
    return torch.sort(expert_of_row, stable=True).indices


def _copy_linear(layer: nn.Linear) -> nn.Linear:
    out = nn.Linear(layer.in_features, layer.out_features)
    out.load_state_dict(layer.state_dict())
    return out


def _copy_expert(expert: nn.Module, config: MoEConfig) -> nn.Module:
    out = type(expert)(config.hidden, config.ffn)
    out.load_state_dict(expert.state_dict())
    return out

