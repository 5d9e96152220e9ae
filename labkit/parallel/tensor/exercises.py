"""Checked exercises for notebook 13 (inside the layer): a weight split Megatron's two ways, the bytes tensor
parallelism sends per layer and the bytes each placement of a 2-D mesh sends over the slow link; and "write the
distributed code": the learner's f/g pair around a tensor-parallel MLP, judged on live gloo ranks
(:mod:`labkit.comm.rank_answers`) against the kit's own operators.

References: the split the hand-written tensor-parallel layer uses (:mod:`labkit.parallel.tensor.megatron`) and its
cost formulas (:mod:`labkit.parallel.tensor.cost`); the f/g exercise's expected answer runs ``CopyToParallel`` and
``ReduceFromParallel``, the operators the notebook's split layer runs. Notebooks reach them as
``labkit.parallel.tensor.exercises.*``.
"""
from __future__ import annotations

import random
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.comm.rank_answers import RankExercise
from labkit.core.exercises import Exercise, Mistake
from labkit.core.step import TrainStep
from labkit.parallel.tensor.cost import tp_bytes_per_layer
from labkit.parallel.tensor.megatron import COLUMN, ROW, CopyToParallel, ReduceFromParallel, shard_tensor


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


# ------------------------------------------------------------------------------------ 13: the f/g pair, on live ranks
def tp_mlp(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """fc2(gelu(fc1(x))) on every rank: fc1 column-parallel (w1_shard: hidden/W x d), fc2 row-parallel (w2_shard:
    d x hidden/W), Megatron's f before fc1 and g after fc2 (Shoeybi et al. 2019, Section 3)."""
    class CopyToParallel(torch.autograd.Function):          # f: identity forward, all-reduce backward
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)                            # each rank's fc1 shard gave part of dL/dx
            return grad

    class ReduceFromParallel(torch.autograd.Function):      # g: all-reduce forward, identity backward
        @staticmethod
        def forward(ctx, partial):
            total = partial.clone()
            dist.all_reduce(total)                           # each rank's fc2 shard gave part of the output
            return total

        @staticmethod
        def backward(ctx, grad):
            return grad                                      # every rank already holds the whole dL/dout

    hidden = torch.nn.functional.gelu(CopyToParallel.apply(x) @ w1_shard.t())      # (n, hidden/W), this rank's units
    return ReduceFromParallel.apply(hidden @ w2_shard.t())                         # (n, d), the same on every rank


def megatron_mlp(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """The kit's expected answer: the same MLP through the operators the notebook's split layer runs."""
    hidden = F.gelu(F.linear(CopyToParallel.apply(x, None), w1_shard))
    return ReduceFromParallel.apply(F.linear(hidden, w2_shard), None)


class _AllReduceBothWays(torch.autograd.Function):
    """Mistakes' operator: an all-reduce in forward and again in backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks."""
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        """Sum the gradient over the ranks too."""
        out = grad.clone()
        dist.all_reduce(out)
        return out


def _f_identity(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """Mistake: no f at all (identity both ways): x's gradient is this rank's partial sum."""
    return ReduceFromParallel.apply(F.linear(F.gelu(F.linear(x, w1_shard)), w2_shard), None)


def _g_identity(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """Mistake: no g at all: the output is this rank's partial sum."""
    return F.linear(F.gelu(F.linear(CopyToParallel.apply(x, None), w1_shard)), w2_shard)


def _g_reduces_backward(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """Mistake: g all-reduces in backward too: every gradient W times too big."""
    return _AllReduceBothWays.apply(F.linear(F.gelu(F.linear(CopyToParallel.apply(x, None), w1_shard)), w2_shard))


def _f_reduces_forward(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """Mistake: f all-reduces in forward too: every rank's fc1 sees W x."""
    return ReduceFromParallel.apply(F.linear(F.gelu(F.linear(_AllReduceBothWays.apply(x), w1_shard)), w2_shard), None)


def _swapped(x: torch.Tensor, w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> torch.Tensor:
    """Mistake: g's code before fc1 and f's after fc2."""
    return CopyToParallel.apply(F.linear(F.gelu(F.linear(ReduceFromParallel.apply(x, None), w1_shard)), w2_shard), None)


def mlp_tensors(batch: int, d_model: int, hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """The seeded unsplit MLP's input, weights (as nn.Linear stores them, out x in) and the loss's fixed weights,
    float64 so that the sums' order cannot matter at the checker's float32 tolerance."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float64)
    return {"x": draw(batch, d_model), "w1": draw(hidden, d_model), "w2": draw(d_model, hidden) / hidden ** 0.5,
            "loss_weights": draw(batch, d_model)}


class SplitMLP(nn.Module):
    """One rank's shards of the MLP as parameters; forward runs ``answer`` (the learner's code) on them and keeps
    its output (``output``) for the judge."""

    def __init__(self, answer: Callable[..., torch.Tensor], w1_shard: torch.Tensor, w2_shard: torch.Tensor) -> None:
        super().__init__()
        self.answer = answer
        self.w1_shard, self.w2_shard = nn.Parameter(w1_shard), nn.Parameter(w2_shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The answer's output, checked to be the MLP's shape (a clear line, not a failure deep in the loss)."""
        out = self.answer(x, self.w1_shard, self.w2_shard)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(f"the function returned {got}, not the MLP's output: a tensor of shape {tuple(x.shape)}")
        self.output = out.detach().clone()
        return out


def weighted_sum(out: torch.Tensor, loss_weights: torch.Tensor) -> torch.Tensor:
    """The seeded loss: sum(out * loss_weights), so dL/dout is loss_weights on every rank."""
    return (out * loss_weights).sum()


def fg_case(answer: Callable[..., torch.Tensor], batch: int, d_model: int, hidden_per_rank: int,
            seed: int) -> dict[str, list[float]]:
    """In a rank: the seeded MLP split over the ranks (fc1 by rows of W1, fc2 by columns of W2), one forward and
    backward of ``answer`` through the kit's step; this rank's output and gradients, flattened, after their norms
    (output, x's gradient, w1_shard's, w2_shard's), which a wrong verdict shows first."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    t = mlp_tensors(batch, d_model, hidden_per_rank * world_size, seed)
    x = t["x"].clone().requires_grad_()
    model = SplitMLP(answer, shard_tensor(t["w1"], COLUMN, rank, world_size).clone(),
                     shard_tensor(t["w2"], ROW, rank, world_size).clone())
    got: dict[str, list[float]] = {}

    def record(m: nn.Module) -> None:               # the step clears the gradients after its grad hook
        missing = [n for n, g in (("x", x.grad), ("w1_shard", m.w1_shard.grad), ("w2_shard", m.w2_shard.grad))
                   if g is None]
        if missing:
            raise RuntimeError(f"{missing[0]}.grad is None after backward: keep {missing[0]} in the autograd graph")
        figures = (m.output, x.grad, m.w1_shard.grad, m.w2_shard.grad)
        got["norms"] = [float(v.norm()) for v in figures]            # first, so a wrong verdict shows which is off
        names = ("output", "x_grad", "w1_shard_grad", "w2_shard_grad")
        got.update(zip(names, (v.reshape(-1).tolist() for v in figures)))
    TrainStep(model, None, loss_fn=weighted_sum, grad_hook=record)(x, t["loss_weights"])
    return got


def fg_cases(seed: int = 131) -> list[dict]:
    """Two seeded cases: a few samples, a small model, a few hidden units per rank."""
    rng = random.Random(seed)
    return [{"batch": rng.choice([2, 3, 4]), "d_model": rng.choice([4, 6, 8]), "hidden_per_rank": rng.choice([2, 3, 4]),
             "seed": rng.randrange(1000)} for _ in range(2)]


FG_PAIR = RankExercise(
    "fg_pair", "write tp_mlp(x, w1_shard, w2_shard): the MLP fc2(gelu(fc1(x))) with fc1 split by output features "
    "and fc2 by input features, Megatron's f (identity forward, all-reduce backward) before fc1 and g (all-reduce "
    "forward, identity backward) after fc2, so that every rank returns the unsplit MLP's output and gradients",
    tp_mlp, megatron_mlp, fg_case, fg_cases,
    (Mistake("f_identity", _f_identity, "x's gradient is this rank's partial sum, the rival 'f without its backward "
             "all-reduce': each rank's fc1 shard gives only its hidden units' part of dL/dx. f's backward must "
             "dist.all_reduce the gradient"),
     Mistake("g_identity", _g_identity, "the output is this rank's partial sum, the rival 'g without its forward "
             "all-reduce': fc2's row shard sums over this rank's hidden units only. g's forward must dist.all_reduce "
             "it"),
     Mistake("g_reduces_backward", _g_reduces_backward, "every gradient is W times too big (W = "
             "dist.get_world_size()), the rival 'g all-reduces in backward too': every rank already holds the whole "
             "output gradient, so g's backward returns it unchanged"),
     Mistake("f_reduces_forward", _f_reduces_forward, "your MLP ran on W x, the rival 'f all-reduces in forward too': "
             "x is the same on every rank, so summing it multiplies it by W. f's forward returns x unchanged"),
     Mistake("swapped", _swapped, "f and g are swapped, the rival 'g before fc1, f after fc2': f (identity forward, "
             "all-reduce backward) goes before the column-parallel fc1, g (all-reduce forward) after the "
             "row-parallel fc2")),
    "define two torch.autograd.Function classes inside tp_mlp. f: forward returns x.view_as(x), backward "
    "all-reduces a clone of the gradient. g: forward all-reduces a clone of its input, backward returns the "
    "gradient. Then return g(gelu(f(x) @ w1_shard.t()) @ w2_shard.t())", case_s=5.0)
