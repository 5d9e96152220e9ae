"""Expert parallelism by hand: each rank holds E/ep experts; tokens travel to their experts' ranks and back through
two all-to-alls with uneven split sizes (GShard, Lepikhin et al. 2020, arXiv:2006.16668, Section 2.2).

On every rank: route the rank's own tokens (the same router everywhere), ``pack`` the kept token-copies sorted by
expert, tell every rank how many copies it will get for each of its experts (a small all-to-all of counts), send
the rows (``dispatch``), run the local experts, send the outputs back the way they came (``combine``), and sum
each token's gate-weighted outputs. The row all-to-alls are
``torch.distributed.nn.functional.all_to_all_single``, which carries autograd: its backward is the all-to-all
the other way, so forward and backward each send two. The router's gradient is each rank's part of the whole;
``sync_router_grads`` sums it, as data parallelism would.

For comparison, :class:`TensorParallelExperts` places the same experts the other way over a group: every rank holds
every expert, split by columns (``fc1``) and rows (``fc2``) as Megatron splits an MLP (Shoeybi et al. 2019,
arXiv:1909.08053). The group's tokens are all-gathered in (an all-to-all of copies), and the partial outputs are
summed back to their rank (an all-to-all of equal blocks, then a sum: gloo has no reduce-scatter).
:mod:`labkit.cluster.ep_mesh` places both.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from labkit.core.clock import now_s
from labkit.core.timing import synchronize
from labkit.parallel.experts.moe import MoE, MoEConfig, Routing, pack, route, run_experts, unpack


def exchange(rows: torch.Tensor, send_splits: list[int], recv_splits: list[int], group: object = None) -> torch.Tensor:
    """The all-to-all the lesson is about: rows[i-th block] go to rank i; block j of the result came from rank j
    (ranks of ``group``, the whole world when None)."""
    out = rows.new_empty(sum(recv_splits), rows.shape[1])
    return dist_fn.all_to_all_single(out, rows, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                                     group=group or dist.group.WORLD)


def exchange_counts(per_expert: torch.Tensor, ep: int, group: object = None) -> torch.Tensor:
    """Copies per expert (E,) out; (ep, E/ep) in: row j = what rank j sends for each of this rank's experts."""
    out = torch.empty_like(per_expert)
    dist.all_to_all_single(out, per_expert.contiguous(), group=group)       # equal splits of E/ep counts each
    return out.view(ep, -1)


class ExpertParallelMoE(nn.Module):
    """This rank's part of an MoE: the whole router, experts ``first .. first + E/ep - 1``; input its tokens (T, h).

    ``rank`` is this rank's index in ``group`` (the EP group of ``ep`` ranks; the whole world when None). Each forward
    records, in ``self.last``, the split sizes it sent and received, the routing, and the seconds spent in its
    experts and waiting in the combine (the straggler shows up there)."""

    def __init__(self, reference: MoE, rank: int, ep: int, group: object = None) -> None:
        super().__init__()
        self.config: MoEConfig = reference.config
        self.rank, self.ep, self.group = rank, ep, group
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
        incoming = exchange_counts(per_expert, self.ep, self.group)     # (ep, E/ep)
        recv = incoming.sum(1).tolist()
        arrived = exchange(rows, send, recv, self.group)            # dispatch: rows grouped by source rank
        synchronize(x.device)                                       # a clock read means done, not launched (GPU)
        start = now_s()
        by_expert = _source_to_expert_order(incoming)
        done = run_experts(self.experts, arrived[by_expert], incoming.sum(0).tolist())
        computed = torch.empty_like(done).index_copy(0, by_expert, done)   # back in arrival order
        synchronize(x.device)
        expert_s = now_s() - start
        start = now_s()
        returned = exchange(computed, recv, send, self.group)       # combine: outputs back to their tokens' ranks
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


class TensorParallelExperts(nn.Module):
    """Every expert on every rank of ``group`` (``tp`` ranks; the world when None), split by columns and rows: this
    rank holds ``fc1``'s output columns and ``fc2``'s input columns ``index * ffn/tp`` on, ``fc2``'s bias on index 0
    only. Input: this rank's tokens (T, h); every rank of the group holds T tokens. Each rank's tokens are one routing
    group, as under EP, so both placements compute the same layer."""

    def __init__(self, reference: MoE, index: int, tp: int, group: object = None) -> None:
        super().__init__()
        self.config: MoEConfig = reference.config
        if self.config.ffn % tp:
            raise ValueError(f"the expert FFN width {self.config.ffn} does not split evenly over {tp} ranks")
        self.index, self.tp, self.group = index, tp, group
        self.router = _copy_linear(reference.router)
        width = self.config.ffn // tp
        self.experts = nn.ModuleList(_split_expert(e, slice(index * width, (index + 1) * width), index == 0)
                                     for e in reference.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, h) this rank's tokens -> (T, h)."""
        tokens = x.shape[0]
        blocks = [tokens] * self.tp                                 # block j: rank j's tokens (in), its sums (out)
        # all-gather as an all-to-all of x to every rank: torch's autograd all_gather on gloo scatters from a
        # group-local rank as if global, and fails on a subgroup; this one's backward sums the copies' gradients
        gathered = exchange(x.repeat(self.tp, 1), blocks, blocks, self.group)      # (tp*T, h), rank order
        capacity, partial = self.config.capacity(tokens), []
        for xg in gathered.split(tokens):                           # rank j's tokens: one routing group
            routing = route(self.router(xg), self.config.top_k, capacity)
            rows, order, per_expert = pack(xg, routing)
            partial.append(unpack(run_experts(self.experts, rows, per_expert.tolist()), order, routing, tokens))
        mine = exchange(torch.cat(partial), blocks, blocks, self.group)     # (tp*T, h): every rank's part of mine
        return mine.view(self.tp, tokens, -1).sum(0)


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



def _split_expert(expert: nn.Module, columns: slice, with_bias: bool) -> nn.Module:
    """An expert's column/row part: fc1's rows ``columns`` (its output features), fc2's input columns ``columns``."""
    out = type(expert)(expert.fc1.in_features, columns.stop - columns.start)
    with torch.no_grad():
        out.fc1.weight.copy_(expert.fc1.weight[columns])
        out.fc1.bias.copy_(expert.fc1.bias[columns])
        out.fc2.weight.copy_(expert.fc2.weight[:, columns])
        if with_bias:
            out.fc2.bias.copy_(expert.fc2.bias)
        else:
            out.fc2.bias = None                                     # added once, on the group's first rank
    return out
