"""The reference kit: toy problems, their single-process reference training and the weight comparison that
the parallel labs (synchronous SGD, sharding, and later the multi-node lab) hold their distributed runs against.

A distributed run is right when its weights match one process training on the combined batch (Goyal et al.
2017, section 2): :func:`train_single_process` is that process and :func:`max_weight_difference` the comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from labkit.core.models import mlp
from labkit.core.step import TrainStep
from labkit.core.validation import checked_int, positive_int, positive_number


@dataclass(frozen=True)
class ToyProblem:
    """A small, deterministic classification task: data and weights follow from ``seed``."""

    seed: int = 0
    in_features: int = 8
    hidden: int = 16
    num_classes: int = 3
    micro_batch: int = 8
    lr: float = 0.1
    momentum: float = 0.9

    def __post_init__(self) -> None:
        for name in ("in_features", "hidden", "num_classes", "micro_batch"):
            positive_int(getattr(self, name), name)
        positive_number(self.lr, "lr")


def build_toy_model(problem: ToyProblem, init_seed: int) -> nn.Module:
    """The toy MLP, initialised from ``init_seed`` (replicas start *different* on purpose)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(init_seed)
    model = mlp((problem.in_features, problem.hidden, problem.num_classes), nn.Tanh)
    torch.random.set_rng_state(gen_state)
    return model


def toy_batch(problem: ToyProblem, step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined batch of ``global_batch`` samples for ``step``: same on every process."""
    gen = torch.Generator().manual_seed(problem.seed * 1_000_003 + step)
    x = torch.randn(global_batch, problem.in_features, generator=gen)           # (R*B, F)
    y = torch.randint(0, problem.num_classes, (global_batch,), generator=gen)   # (R*B,)
    return x, y


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous micro-batch of a combined batch (rows split evenly)."""
    if x.shape[0] % world_size:
        raise ValueError(f"batch of {x.shape[0]} rows does not split evenly over world_size={world_size}")
    b = x.shape[0] // world_size
    return x[rank * b:(rank + 1) * b]


def toy_optimizer(model: nn.Module, problem: ToyProblem) -> torch.optim.Optimizer:
    """SGD with the problem's learning rate and momentum: the same on every replica and in the reference."""
    return torch.optim.SGD(model.parameters(), lr=problem.lr, momentum=problem.momentum)


def copy_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict, detached and copied to the CPU (what workers hand back for comparison)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def train_single_process(world_size: int, *, steps: int, seed: int = 0, micro_batch: int = 8,
                         lr: float = 0.1) -> dict[str, torch.Tensor]:
    """The reference: one process, the combined batch of ``world_size * micro_batch`` each step."""
    world_size = positive_int(world_size, "world_size")
    checked_int(steps, "steps", minimum=0)
    problem = ToyProblem(seed=seed, micro_batch=micro_batch, lr=lr)
    model = build_toy_model(problem, init_seed=seed)                  # rank 0's initial weights
    batches = (toy_batch(problem, step, world_size * micro_batch) for step in range(steps))
    return single_process_weights(model, toy_optimizer(model, problem), batches)


def single_process_weights(model: nn.Module, optimizer: torch.optim.Optimizer,
                           batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Any reference run: one process, the kit's one training step on each whole global batch; its final weights."""
    step = TrainStep(model, optimizer)
    for x, y in batches:
        step(x, y)
    return copy_weights(model)


def max_weight_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state_dicts with the same keys."""
    if a.keys() != b.keys():
        raise ValueError(f"state_dicts have different keys: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
