"""Balance in a mixture of experts: a skewed router, the load-balancing auxiliary loss, and the capacity factor.

The auxiliary loss (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961, Section 2.2, Eq. 4) is

    loss_aux = alpha x E x sum_i f_i x P_i

f_i: the share of token-copies the router sent to expert i (a count: no gradient), P_i: the mean router
probability of expert i (the gradient flows here). Uniform routing gives alpha, its minimum over routings that
agree; a router that sends most tokens to one expert and gives it most probability pays up to alpha x E. Here it
is trained for a few dozen steps on a small task (learn a fixed teacher MoE's map) from a router skewed towards
expert 0, with and without the loss, through the kit's one training step. Everything runs in one process.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from labkit.core.step import TrainStep
from labkit.core.validation import positive_int
from labkit.parallel.experts.moe import MoE, MoEConfig, predicted_dropped, route


def aux_loss(probs: torch.Tensor, expert: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """Switch's load-balancing loss: alpha x E x sum_i f_i x P_i, from router probs (N, E) and chosen experts (N, k)."""
    experts = probs.shape[1]
    f = torch.bincount(expert.reshape(-1), minlength=experts).to(probs.dtype) / expert.numel()
    p = probs.mean(0)
    return alpha * experts * (f * p).sum()


def skew_router(model: nn.Module, expert: int = 0, bias: float = 3.0) -> None:
    """Make the router favour one expert: add ``bias`` to its logit (a trainable bias, so training can undo it)."""
    with torch.no_grad():
        model.router.bias[expert] += bias


def tokens_per_expert(model: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token-copies the router sends to each expert (E,), before the capacity, over the groups of x (G, T, h)."""
    with torch.no_grad():
        model(x)
    return torch.stack([r.routed for r in model.routings]).sum(0)


def imbalance(per_expert: torch.Tensor) -> float:
    """The busiest expert's load over the mean load: 1.0 is perfect balance, E is everything on one expert."""
    per_expert = per_expert.float()
    return float(per_expert.max() / per_expert.mean())


@dataclass(frozen=True)
class BalanceTask:
    """The small task: learn a teacher MoE's map from x to y, ``steps`` Adam steps on fresh batches of groups."""

    config: MoEConfig = MoEConfig()
    groups: int = 4
    tokens: int = 64
    steps: int = 40
    lr: float = 3e-3
    skew_bias: float = 3.0

    def __post_init__(self) -> None:
        for name in ("groups", "tokens", "steps"):
            positive_int(getattr(self, name), name)
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) for one step: random tokens (G, T, h) and the teacher's output on them."""
        gen = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(self.groups, self.tokens, self.config.hidden, generator=gen)
        teacher = MoE(replace(self.config, capacity_factor=self.config.experts / self.config.top_k), seed=99)
        with torch.no_grad():
            return x, teacher(x)


def train_balance(task: BalanceTask, alpha: float, seed: int = 0) -> dict:
    """Train the skewed student with aux-loss weight ``alpha`` (0: without it); tokens per expert before and after
    on a held-out batch, dropped copies at the task's capacity factor, and the task loss along the way."""
    model = MoE(task.config, seed)
    skew_router(model, 0, task.skew_bias)
    held_x, held_y = task.batch(-1)
    before = tokens_per_expert(model, held_x)
    opt = torch.optim.Adam(model.parameters(), lr=task.lr)

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        probs, chosen = model.aux_input()
        return F.mse_loss(y, target) + aux_loss(probs, chosen, alpha)

    step = TrainStep(model, opt, loss_fn=loss_fn, device=torch.device("cpu"))
    losses = [float(step(*task.batch(i)).loss) for i in range(task.steps)]
    after = tokens_per_expert(model, held_x)
    with torch.no_grad():
        task_loss = float(F.mse_loss(model(held_x), held_y))
    dropped = sum(r.dropped for r in model.routings)
    return {"alpha": alpha, "before": before.tolist(), "after": after.tolist(), "imbalance_before": imbalance(before),
            "imbalance_after": imbalance(after), "losses": losses, "held_out_loss": task_loss,
            "dropped_after": dropped, "copies": task.groups * task.tokens * task.config.top_k}


def capacity_sweep(config: MoEConfig, factors: tuple[float, ...], tokens: int = 256, skew_bias: float = 2.0,
                   seed: int = 0) -> list[dict]:
    """A skewed router's dropped token-copies at each capacity factor: counted from the queue against the rule."""
    model = MoE(config, seed)
    skew_router(model, 0, skew_bias)
    x = torch.randn(tokens, config.hidden, generator=torch.Generator().manual_seed(seed + 7))
    with torch.no_grad():
        logits = model.router(x)
    rows = []
    for factor in factors:
        capacity = replace(config, capacity_factor=factor).capacity(tokens)
        routing = route(logits, config.top_k, capacity)
        rows.append({"capacity_factor": factor, "capacity": capacity, "dropped": routing.dropped,
                     "rule": predicted_dropped(routing.routed, capacity),
                     "dropped_share": routing.dropped / (tokens * config.top_k),
                     "busiest_expert": int(routing.routed.max())})
    return rows
