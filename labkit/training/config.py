"""How to train, as one frozen config: length (steps or epochs), optimizer, precision, and what to measure.

Its own module because both the loop (:mod:`labkit.training.loop`) and the step it drives
(:mod:`labkit.training.stepper`) read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.core.step import StepOptions
from labkit.core.validation import checked_int, positive_int, positive_number

TIMINGS = ("phases", "step")
OPTIMIZERS = ("sgd", "adam")


def build_optimizer(model: nn.Module, optimizer: str, lr: float, momentum: float = 0.0,
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The one place a run's optimizer is made from its description: SGD (with ``momentum``) or Adam."""
    if optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: length (steps or epochs), optimizer, precision, and what to measure."""

    steps: int | None = None
    epochs: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    warmup_steps: int = 2
    device: str | None = None
    amp_dtype: str | None = None
    channels_last: bool = False
    compile: bool = False
    sync_every_step: bool = False   # True: a device sync at every phase boundary (the costly classic timer)
    read_every: int = 25            # read timing marks and losses back once per this many steps
    timing: str = "phases"          # 'phases': data wait, copy, forward, backward, update; 'step': whole steps only
    evaluate: bool = True
    seed: int = 0
    progress: bool = True
    log_every: int = 1
    profile_model: bool = True      # count FLOPs and fit the memory model on a 2- and 4-sample probe
    lr_warmup_steps: int = 0        # linear LR warm-up from lr/10 (Goyal et al. 2017, section 2.2)

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps= or epochs= (e.g. TrainConfig(steps=50))")
        for name in ("steps", "epochs"):
            checked_int(getattr(self, name), name, allow_none=True)
        positive_number(self.lr, "lr")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        object.__setattr__(self, "amp_dtype", self.step_options().amp_dtype)   # one spelling: 'bf16', 'fp16', None
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS} ('step' times whole steps only, the cheapest on a "
                             f"launch-bound GPU step), got {self.timing!r}")
        for name in ("warmup_steps", "lr_warmup_steps"):
            checked_int(getattr(self, name), name, minimum=0)
        for name in ("log_every", "read_every"):
            positive_int(getattr(self, name), name)

    def step_options(self) -> StepOptions:
        """The options of the one training step (:class:`labkit.core.step.StepOptions`) this config asks for."""
        return StepOptions(amp_dtype=self.amp_dtype, channels_last=self.channels_last, compile=self.compile)

    @classmethod
    def fast(cls, **overrides: Any) -> TrainConfig:
        """A CPU-sized preset for tests and fast mode: 10 steps, no progress bar."""
        return cls(**{"steps": 10, "progress": False, **overrides})
