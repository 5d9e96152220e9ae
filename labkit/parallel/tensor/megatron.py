"""Megatron's tensor parallelism written out: the f and g operators, column- and row-parallel linears, and one
pre-norm transformer layer split across the ranks of the default process group.

Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053, Section 3): an MLP ``fc2(gelu(fc1(x)))`` splits ``fc1`` by its
output features (column-parallel: each rank computes a slice of the hidden units, GELU needs no communication) and
``fc2`` by its input features (row-parallel: each rank computes a partial sum of the output). Attention splits by
heads the same way. Around each block, ``f`` is the identity forward and an all-reduce backward; ``g`` is an
all-reduce forward and the identity backward: one all-reduce each way per block.

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, Section 4.2.2) keeps the layer norms (and
dropouts) on 1/t of the sequence: ``g`` becomes a reduce-scatter along the sequence (all-gather backward) and ``f``
an all-gather (reduce-scatter backward). The column linear saves only its input's sequence shard and gathers it
again in backward, as Megatron-LM does, so the norm region's activations shrink by t.

The collectives are looked up on ``torch.distributed`` when called, so ``comm_volume.counting_collectives`` counts
them. Tensors are (batch, sequence, hidden).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.comm.mesh import Mesh
from labkit.core.validation import positive_int
from labkit.sharding.comm_volume import all_gather_single, reduce_scatter_single

# The unsplit layer's linears and how Megatron splits each: column = by output features, row = by input features.
COLUMN, ROW = "column", "row"
Group = Optional[dist.ProcessGroup]          # None: the default group (every rank)
SPLITS = {"attn.wq": COLUMN, "attn.wk": COLUMN, "attn.wv": COLUMN, "attn.wo": ROW, "mlp.fc1": COLUMN, "mlp.fc2": ROW}


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer's sizes: the layer notebook 11 checkpoints (d_model 64, 4 heads, FFN 4x)."""

    d_model: int = 64
    heads: int = 4
    seq_len: int = 128
    batch: int = 4

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "seq_len", "batch"):
            positive_int(getattr(self, name), name)
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by heads={self.heads}")

    def check_split(self, world_size: int) -> int:
        """One clear error unless heads and sequence divide among ``world_size`` tp ranks: the mesh's tp rules
        (:meth:`labkit.comm.mesh.Mesh.check_model`, the rules the planner asks too)."""
        t = positive_int(world_size, "world_size")
        Mesh(tp=t).check_model(heads=self.heads, seq_len=self.seq_len)
        return t


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Scaled dot-product attention over however many heads the tensors hold: (b, s, n*hd) -> (b, s, n*hd)."""
    b, s = q.shape[:2]
    q, k, v = (t.reshape(b, s, -1, head_dim).transpose(1, 2) for t in (q, k, v))   # (b, n, s, hd)
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    """Multi-head self-attention with separate q, k, v projections (so each can be split by heads)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.head_dim = d_model // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Local heads are inferred from q's width, so a column-sharded copy runs the same code."""
        return self.wo(attend(self.wq(h), self.wk(h), self.wv(h), self.head_dim))


class MLP(nn.Module):
    """fc1 -> GELU -> fc2, hidden width 4 x d_model."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The position-wise feed-forward block."""
        return self.fc2(F.gelu(self.fc1(h)))


class Block(nn.Module):
    """The unsplit pre-norm transformer layer (no dropout): x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn, self.mlp = Attention(d_model, heads), MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One layer."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def build_block(shape: LayerShape, seed: int = 0) -> Block:
    """The seeded unsplit layer (float32): every rank builds the same one and takes its slices."""
    torch.manual_seed(seed)
    return Block(shape.d_model, shape.heads)


# ------------------------------------------------------------------------------------- the communication operators
def _seq_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).contiguous()           # (b, s, h) -> (s, b, h): collectives work on dim 0


def gather_sequence(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """All-gather the sequence shards: (b, s/t, h) on each rank -> (b, s, h) on every rank of ``group``."""
    local = _seq_first(x)
    out = local.new_empty((local.shape[0] * dist.get_world_size(group), *local.shape[1:]))
    all_gather_single(out, local, group=group)
    return out.transpose(0, 1)


def scatter_sequence_sum(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Reduce-scatter along the sequence: partial sums (b, s, h) -> this rank's summed shard (b, s/t, h)."""
    full = _seq_first(x)
    out = full.new_empty((full.shape[0] // dist.get_world_size(group), *full.shape[1:]))
    reduce_scatter_single(out, full, group=group)
    return out.transpose(0, 1)


def _all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


class CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward; backward all-reduces the partial input gradients of the rank's slice."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        """Pass through."""
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Sum every rank's contribution to dL/dx."""
        return _all_reduce(grad, ctx.group), None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum the row-parallel partial outputs); identity backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        """Sum the partial outputs."""
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Every rank already holds the whole output gradient."""
        return grad, None


class ReduceScatterSequence(torch.autograd.Function):
    """Sequence parallelism's g: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, group: Group = None) -> torch.Tensor:
        """Summed output, this rank's sequence shard."""
        ctx.group = group
        return scatter_sequence_sum(x, group)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Every rank needs the output gradient of the whole sequence."""
        return gather_sequence(grad, ctx.group), None


class GatherLinear(torch.autograd.Function):
    """Sequence parallelism's f fused with the column linears after it (q, k and v share one gather): all-gather the
    sequence, multiply; save the shard only and gather it again in backward (Megatron-LM's way of keeping the norm
    region's activations at 1/t). Arguments after the shard and the group: weight, bias, weight, bias, ..."""

    @staticmethod
    def forward(ctx: object, x_shard: torch.Tensor, group: Group, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(b, s/t, h) shard -> one (b, s, out/t) output per (weight, bias) pair."""
        ctx.save_for_backward(x_shard, *params[0::2])
        ctx.group = group
        x_full = gather_sequence(x_shard, group)
        return tuple(F.linear(x_full, w, b) for w, b in zip(params[0::2], params[1::2]))

    @staticmethod
    def backward(ctx: object, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Input gradient summed and reduce-scattered back to the shards; weight gradients from the re-gathered input."""
        x_shard, *weights = ctx.saved_tensors
        x_full = gather_sequence(x_shard, ctx.group)
        flat_x = x_full.reshape(-1, x_full.shape[-1])
        grad_x = scatter_sequence_sum(sum(g @ w for g, w in zip(grads, weights)), ctx.group)
        out: list[torch.Tensor | None] = [grad_x, None]
        for g in grads:
            flat_g = g.reshape(-1, g.shape[-1])
            out += [flat_g.t() @ flat_x, flat_g.sum(dim=0)]
        return tuple(out)


def enter_parallel(h: torch.Tensor, linears: list[nn.Module], sequence_parallel: bool,
                   group: Group = None) -> tuple[torch.Tensor, ...]:
    """The column linears of one block on a replicated (or sequence-sharded) input, with one f (or one gather)."""
    if sequence_parallel:
        return GatherLinear.apply(h, group, *(p for lin in linears for p in (lin.weight, lin.bias)))
    h = CopyToParallel.apply(h, group)
    return tuple(F.linear(h, lin.weight, lin.bias) for lin in linears)


# ------------------------------------------------------------------------------------------------ the split layer
class ColumnParallelLinear(nn.Module):
    """This rank's rows of ``weight`` (out/t output features) and of the bias; f (or the gather) on the way in."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, sequence_parallel: bool, group: Group = None) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight.clone()), nn.Parameter(bias.clone())
        self.sequence_parallel, self.group = sequence_parallel, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Replicated (or sequence-sharded) input -> this rank's output features."""
        return enter_parallel(x, [self], self.sequence_parallel, self.group)[0]


class RowParallelLinear(nn.Module):
    """This rank's columns of ``weight`` (in/t input features); g sums the partial outputs, then the whole bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, sequence_parallel: bool, group: Group = None) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight.clone()), nn.Parameter(bias.clone())
        self.sequence_parallel, self.group = sequence_parallel, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's input features -> the summed output (or its sequence shard)."""
        partial = F.linear(x, self.weight)
        g = ReduceScatterSequence if self.sequence_parallel else ReduceFromParallel
        total = g.apply(partial, self.group)
        return total + self.bias


def shard_tensor(full: torch.Tensor, split: str, rank: int, world_size: int) -> torch.Tensor:
    """This rank's slice of a Linear's weight (out, in) or bias (out,): column = rows of W, row = columns of W."""
    if split not in (COLUMN, ROW):
        raise ValueError(f"split must be {COLUMN!r} or {ROW!r}, got {split!r}")
    if split == ROW and full.dim() == 1:
        return full                                  # a row-parallel bias is added once, after the sum
    dim = 0 if split == COLUMN else 1
    return full.chunk(world_size, dim=dim)[rank]


def shard_state(full: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """The unsplit layer's state (parameters or their gradients), cut to what ``rank`` holds, by parameter name."""
    out = {}
    for name, tensor in full.items():
        module = name.rsplit(".", 1)[0]
        out[name] = shard_tensor(tensor, SPLITS[module], rank, world_size) if module in SPLITS else tensor
    return out


class ParallelBlock(nn.Module):
    """One rank's part of ``Block``: the same parameter names, each linear replaced by its column or row shard."""

    def __init__(self, block: Block, rank: int, world_size: int, sequence_parallel: bool = False,
                 group: Group = None) -> None:
        super().__init__()
        self.sequence_parallel, self.group = sequence_parallel, group       # rank: this rank's place in group
        self.ln1, self.ln2 = (nn.LayerNorm(n.normalized_shape) for n in (block.ln1, block.ln2))
        self.ln1.load_state_dict(block.ln1.state_dict()), self.ln2.load_state_dict(block.ln2.state_dict())
        self.attn, self.mlp = nn.Module(), nn.Module()
        self.head_dim = block.attn.head_dim
        for path, split in SPLITS.items():
            owner, name = path.split(".")
            full = block.get_submodule(path)
            kind = ColumnParallelLinear if split == COLUMN else RowParallelLinear
            setattr(getattr(self, owner), name, kind(shard_tensor(full.weight.data, split, rank, world_size),
                                                     shard_tensor(full.bias.data, split, rank, world_size),
                                                     sequence_parallel, group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, s, h) on every rank, or this rank's (b, s/t, h) sequence shard under sequence parallelism."""
        a, m, sp = self.attn, self.mlp, self.sequence_parallel
        q, k, v = enter_parallel(self.ln1(x), [a.wq, a.wk, a.wv], sp, self.group)      # this rank's heads, whole sequence
        x = x + a.wo(attend(q, k, v, self.head_dim))                       # g: one all-reduce (or reduce-scatter)
        return x + m.fc2(F.gelu(m.fc1(self.ln2(x))))

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole (norms, row biases): under sequence parallelism each rank's gradient
        of them covers its shard of the sequence only, so they are summed across ranks after backward."""
        return [p for n, p in self.named_parameters() if n.startswith("ln") or
                (n.endswith("bias") and SPLITS.get(n.rsplit(".", 1)[0]) == ROW)]
