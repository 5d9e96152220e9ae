"""The workload every checkpoint lab saves and resumes: a float64 MLP sharded with FSDP2 and trained with Adam.

The model is the kit's MLP (``labkit.core.models.mlp``), each ``Linear`` wrapped in ``fully_shard`` (FSDP2, Zhao et
al. 2023, arXiv:2304.11277) on a one-dimensional mesh, so each rank holds ``torch.chunk`` of every parameter's rows
(dim 0) and Adam keeps its two moments for those rows only. The global batch of step ``s`` is the same on any
number of ranks (seeded by ``s``); each rank trains on its slice, so a run resumed on another world size sees the
very batches an uninterrupted run would. float64, so "the same losses" can be held to 1e-12.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from labkit.comm.worker import rank_device
from labkit.core.env import pick
from labkit.core.models import mlp
from labkit.core.step import StepOptions, TrainStep
from labkit.core.validation import checked_int, positive_int, positive_number

DTYPE_BYTES = 8                  # float64
ADAM_TENSORS_PER_PARAM = 3       # the parameter, Adam's exp_avg and exp_avg_sq (Kingma & Ba 2015)


@dataclass(frozen=True)
class CheckpointConfig:
    """The run: MLP widths, the global batch (divisible by every world size tried), steps before the save and
    after it, and the seed."""

    in_features: int = 64
    hidden: int = 512
    classes: int = 8
    global_batch: int = 24        # 2, 3 and 4 ranks each get an equal slice
    steps_before: int = 2
    steps_after: int = 3
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("in_features", "hidden", "classes", "global_batch", "steps_before", "steps_after"):
            positive_int(getattr(self, name), name)
        checked_int(self.seed, "seed", minimum=0)
        positive_number(self.lr, "lr")

    @classmethod
    def fast(cls) -> "CheckpointConfig":
        """The CPU size (15.5 MB of model and Adam state: rank 0's gathered copy stands clear of DCP's few MB of
        fixed cost); a GPU box gets a model twice as wide."""
        return cls(hidden=pick(fast=768, full=1536))

    @classmethod
    def smoke(cls) -> "CheckpointConfig":
        """The tests' size: small, still divisible by 4 ranks, with a bias of 8 rows that 3 ranks split 3/3/2."""
        return cls(hidden=128, steps_after=2)

    @property
    def widths(self) -> tuple[int, ...]:
        """The MLP's widths, input to output."""
        return (self.in_features, self.hidden, self.hidden, self.classes)


def parameter_count(cfg: CheckpointConfig) -> int:
    """Parameters of the MLP: weights and biases of each Linear."""
    return sum(a * b + b for a, b in zip(cfg.widths, cfg.widths[1:]))


def predicted_state_bytes(cfg: CheckpointConfig, world_size: int = 1) -> float:
    """Bytes of model + Adam state a rank holds (and DCP writes) on ``world_size`` ranks: parameters and Adam's
    two moments times the dtype's bytes, divided by the ranks (Adam's scalar step counters left out)."""
    return parameter_count(cfg) * ADAM_TENSORS_PER_PARAM * DTYPE_BYTES / positive_int(world_size, "world_size")


def build_sharded(cfg: CheckpointConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(FSDP2 model, Adam) on this process group's ranks; the same seeded weights on any world size."""
    torch.manual_seed(cfg.seed)
    model = mlp(cfg.widths).double().to(rank_device())
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def global_batch(cfg: CheckpointConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch, identical in every process and for every world size."""
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    return (torch.randn(cfg.global_batch, cfg.in_features, generator=g, dtype=torch.float64),
            torch.randint(0, cfg.classes, (cfg.global_batch,), generator=g))


class Trainer:
    """Runs the steps: each rank its slice of the global batch through the kit's one ``TrainStep``; the loss of a
    step is the mean over the whole global batch (all-reduced), the same number on every rank."""

    def __init__(self, cfg: CheckpointConfig, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        world_size = dist.get_world_size()
        if cfg.global_batch % world_size:
            raise ValueError(f"global_batch={cfg.global_batch} does not split over {world_size} ranks")
        self.cfg, self.model, self.optimizer = cfg, model, optimizer
        self.step_fn = TrainStep(model, optimizer, device=rank_device(), options=StepOptions())

    def run(self, first_step: int, steps: int) -> list[float]:
        """Train steps ``first_step .. first_step + steps - 1``; the global loss of each."""
        rank, world_size = dist.get_rank(), dist.get_world_size()
        per_rank = self.cfg.global_batch // world_size
        losses = []
        for step in range(first_step, first_step + steps):
            x, y = global_batch(self.cfg, step)
            lo = rank * per_rank
            loss = self.step_fn(x[lo:lo + per_rank], y[lo:lo + per_rank]).loss.clone()
            dist.all_reduce(loss)                     # equal slices: the mean of the means is the global mean
            losses.append(float(loss) / world_size)
        return losses


def held_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's own shards of the parameters and of Adam's two moments (step counters left out)."""
    total = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            total += (t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size()
    return total


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Every rank joins; rank 0 gets the whole model and Adam state as plain CPU tensors ({} elsewhere): what a
    rank-0 ``torch.save`` writes, and what two runs are compared on."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd} if dist.get_rank() == 0 else {}


def state_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Where two (nested) state dicts differ: keys missing on one side, or tensors/values not exactly equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{prefix}{k}: only in one" for k in sorted(set(a) ^ set(b), key=str)]
        for k in sorted(set(a) & set(b), key=str):
            out += state_differences(a[k], b[k], f"{prefix}{k}.")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in state_differences(x, y, f"{prefix}{i}.")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        return [] if same else [prefix.rstrip(".")]
    return [] if a == b else [prefix.rstrip(".")]
