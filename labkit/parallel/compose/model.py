"""The one transformer every composition trains, its one-process reference, and the gradients put back together.

The model is a stack of the kit's layer (:mod:`labkit.parallel.tensor.megatron`'s ``Block``, the layer notebooks 11
and 13 use; layer i seeded with i), the loss the mean of ``out * probe`` (a fixed random weight on every output
element, so every element of every gradient is checked). A mean, not a sum: each data or context rank's loss is the
mean over its share, and the mean of those equals the whole batch's mean, so gradients are *averaged* over dp x cp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from labkit.comm.mesh import AxisGroup, Mesh
from labkit.core.step import LossFn, StepOptions, TrainStep
from labkit.core.validation import positive_int
from labkit.parallel.tensor.megatron import SPLITS, Block, LayerShape, ParallelBlock, build_block


@dataclass(frozen=True)
class StackShape:
    """The stack: ``layers`` of the kit's layer (d_model, heads), the global batch of ``batch`` x ``seq_len``."""

    layers: int = 2
    d_model: int = 64
    heads: int = 4
    seq_len: int = 32
    batch: int = 4

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "seq_len", "batch"):
            positive_int(getattr(self, name), name)
        LayerShape(self.d_model, self.heads, self.seq_len, self.batch)       # d_model divisible by heads

    @classmethod
    def fast(cls) -> "StackShape":
        """CPU-sized: every composition's step in well under a second."""
        return cls()

    def layer(self) -> LayerShape:
        """One layer's shape at the global batch."""
        return LayerShape(self.d_model, self.heads, self.seq_len, self.batch)

    def check(self, mesh: Mesh) -> Mesh:
        """The mesh's divisibility rules for this stack (one line per broken rule)."""
        return mesh.check_model(heads=self.heads, layers=self.layers, seq_len=self.seq_len, batch=self.batch)


def build_layers(shape: StackShape) -> list[Block]:
    """The unsplit layers, layer i seeded with i: every rank builds the same ones and takes its part."""
    return [build_block(shape.layer(), seed=i) for i in range(shape.layers)]


def stack_inputs(shape: StackShape, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, probe), both (batch, seq_len, d_model): the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    size = (shape.batch, shape.seq_len, shape.d_model)
    return torch.randn(size, generator=gen), torch.randn(size, generator=gen)


def probe_mean_loss(out: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """mean(out * probe): its gradient is probe / numel, a different weight on every output element."""
    return (out * probe).mean()


def gradients_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                 sync: Callable[[nn.Module], None] | None = None, micro_batches: int = 1) -> tuple[float, dict]:
    """Forward and backward through the kit's one step (no update): the loss and a copy of every gradient, taken
    after ``sync(model)`` (the data-parallel reduction) has run."""
    kept: dict[str, torch.Tensor] = {}

    def keep(m: nn.Module) -> None:
        if sync is not None:
            sync(m)
        kept.update({n: p.grad.detach().clone() for n, p in m.named_parameters()})

    step = TrainStep(model, None, loss_fn=loss_fn, grad_hook=keep, options=StepOptions(accumulation_steps=micro_batches))
    return float(step(x, y).loss), kept


def reference_step(shape: StackShape) -> dict:
    """One process, the whole batch: the loss and every gradient, by name ('layers.0.attn.wq.weight', ...)."""
    loss, grads = gradients_of(Stack(dict(enumerate(build_layers(shape)))), *stack_inputs(shape), probe_mean_loss)
    return {"loss": loss, "grads": grads}


class Stack(nn.Module):
    """This rank's layers, keyed by their id in the whole stack (so gradient names are global: 'layers.1.ln1.weight');
    ``run_layer(layer, x)`` replaces ``layer(x)`` when given (e.g. with ring attention)."""

    def __init__(self, layers: dict[int, nn.Module],
                 run_layer: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): layer for i, layer in layers.items()})
        self.run_layer = run_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The held layers in order."""
        for layer in self.layers.values():
            x = layer(x) if self.run_layer is None else self.run_layer(layer, x)
        return x


def tp_stack(shape: StackShape, layer_ids: list[int], tp: AxisGroup,
             run_layer: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> Stack:
    """This rank's tensor-parallel part of the given layers (whole layers when tp has one rank)."""
    blocks = build_layers(shape)
    return Stack({i: ParallelBlock(blocks[i], tp.index, tp.size, group=tp.group) for i in layer_ids}, run_layer)


def stage_layers(shape: StackShape, stages: int, stage: int) -> list[int]:
    """The layer ids pipeline stage ``stage`` of ``stages`` holds: equal contiguous runs (the mesh checks divisibility)."""
    per = shape.layers // stages
    return list(range(stage * per, (stage + 1) * per))


def full_tensor(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """One parameter's gradient from its tp shards (in tp order): column splits stack rows, row splits columns;
    replicated tensors (norms, row biases) are the same on every tp rank, so the first is taken."""
    module = name.rsplit(".", 1)[0].split(".", 2)[-1]                     # 'layers.0.attn.wq.weight' -> 'attn.wq'
    split = SPLITS.get(module)
    if split is None or len(shards) == 1 or (split == "row" and shards[0].dim() == 1):
        return shards[0]
    return torch.cat(shards, dim=0 if split == "column" else 1)


def assemble_grads(ranks: list[dict], mesh: Mesh) -> dict[str, torch.Tensor]:
    """The full gradient of every parameter from the ranks' local ones: the tp shards of the dp = cp = 0 ranks,
    each from the pipeline stage that holds it. Ranks report {'grads': {name: tensor}} with global layer names."""
    out: dict[str, torch.Tensor] = {}
    for pp_i in range(mesh.pp):
        tp_ranks = [mesh.rank_of(pp=pp_i, tp=t) for t in range(mesh.tp)]
        for name in ranks[tp_ranks[0]]["grads"]:
            out[name] = full_tensor(name, [ranks[r]["grads"][name] for r in tp_ranks])
    return out


def replicas_agree(ranks: list[dict], mesh: Mesh) -> float:
    """Largest difference between a gradient on a dp or cp replica and the same one on dp = cp = 0 (0 when synced)."""
    worst = 0.0
    for rank, result in enumerate(ranks):
        c = mesh.coords(rank)
        home = ranks[mesh.rank_of(pp=c["pp"], tp=c["tp"])]
        for name, g in result["grads"].items():
            worst = max(worst, float((g - home["grads"][name]).abs().max()))
    return worst
