"""One description of a training run: model, batch size, optimizer and its hyper-parameters, precision, memory
format and learning-rate warm-up, as one frozen value checked once, where it is made.

The dashboard, the ladder's recipes, the batch finder and the memory model take a :class:`RunSpec`; the loop's
:class:`labkit.training.config.TrainConfig` holds one (and adds only *how long and what to measure*), the step's
:class:`labkit.core.step.StepOptions`, the memory model's optimizer kind and the data loader are derived from it,
so the optimizer travels as itself (no kind string decoded back with a guessed momentum) and the precision is
spelt one way (:func:`labkit.core.dtypes.amp_mode`). Linear LR scaling with warm-up: Goyal et al. 2017.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from labkit.core.choices import MODELS, TRAIN_OPTIMIZERS
from labkit.core.data import make_loader, validate_batch_size
from labkit.core.dtypes import amp_mode
from labkit.core.step import StepOptions
from labkit.core.validation import checked_int, positive_int, positive_number
from labkit.memory.model import MemoryModel, build_memory_model, optimizer_kind


@dataclass(frozen=True)
class RunSpec:
    """What is trained and how: each field checked once, here, with one clear message per bad field."""

    model: str = "small_cnn"              # labkit.core.models.build_model name
    batch_size: int = 32                  # samples per step (per process)
    optimizer: str = "sgd"                # 'sgd' or 'adam'
    lr: float = 0.05
    momentum: float = 0.9                 # SGD only (0 = plain SGD); Adam ignores it
    weight_decay: float = 0.0
    precision: str | None = None          # autocast dtype: None (fp32), 'bf16' or 'fp16' (any core.dtypes spelling)
    tf32: bool | None = None              # fp32 matmuls/convolutions in TF32 (True) or strict IEEE (False) on an
                                          # Ampere+ GPU; None leaves torch's current setting (a CPU has no TF32)
    channels_last: bool = False           # NHWC inputs and weights
    compile: bool = False                 # torch.compile the model
    lr_warmup_steps: int = 0              # linear warm-up from lr/10 (Goyal et al. 2017, section 2.2)
    seed: int = 0
    dataset_size: int | None = None       # when known, the batch may not be larger

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.dataset_size is not None:
            positive_int(self.dataset_size, "dataset_size")
        validate_batch_size(self.batch_size, self.dataset_size)       # the loaders' own rule and message
        if self.optimizer not in TRAIN_OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {TRAIN_OPTIMIZERS}, got {self.optimizer!r}")
        positive_number(self.lr, "lr")
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) or not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be a number in [0, 1), got {self.momentum!r}")
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float)) \
                or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a number >= 0, got {self.weight_decay!r}")
        object.__setattr__(self, "precision", amp_mode(self.precision))     # 'bfloat16' -> 'bf16', 'fp32' -> None
        for name in ("channels_last", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.tf32 is not None and not isinstance(self.tf32, bool):
            raise ValueError(f"tf32 must be True, False or None (torch's current setting), got {self.tf32!r}")
        checked_int(self.lr_warmup_steps, "lr_warmup_steps", minimum=0)
        checked_int(self.seed, "seed", minimum=0)

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def optimizer_kind(self) -> str:
        """The memory model's name for the optimizer state: 'sgd', 'sgd_momentum' or 'adam'."""
        return optimizer_kind(self.optimizer, self.momentum if self.optimizer == "sgd" else 0.0)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The one place a run's optimizer is made: SGD (with ``momentum``) or Adam over ``model``'s parameters."""
        if self.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def step_options(self) -> StepOptions:
        """The one training step's options for this run."""
        return StepOptions(precision=self.precision, channels_last=self.channels_last, compile=self.compile)

    def memory_model(self, model: nn.Module, sample_shape: tuple[int, ...]) -> MemoryModel:
        """The kit's memory model for ``model`` trained this way (optimizer state and precision included)."""
        return build_memory_model(model, sample_shape, self.optimizer, self.momentum, precision=self.precision)

    def loader(self, dataset: Dataset, *, shuffle: bool = True) -> DataLoader:
        """Training batches of ``batch_size`` from ``dataset``, shuffled with this run's seed."""
        return make_loader(dataset, self.batch_size, shuffle=shuffle, seed=self.seed)

    @classmethod
    def fast(cls, **overrides: Any) -> RunSpec:
        """A CPU-sized preset for tests and fast mode: the small CNN at batch 32."""
        return cls(**{"model": "small_cnn", "batch_size": 32, **overrides})
