"""The tuning ladder's configuration: what it trains, for how long, and which rungs it may try.

The ladder: one training job, every lesson of the kit switched on rung by rung, each rung measured.

Rungs are cumulative: each is added to the best recipe so far and measured with the instrumented loop for the
same fixed budget of training samples (throughput *and* accuracy). A rung that does not make the job faster
here, or that costs accuracy against rung 0, is still measured and reported, then left out of the following
rungs; a rung that cannot apply here says why. Beside the table: the hardware ceiling (the best recipe on
training batches already on the device), so the reader sees how far the recipe is from the hardware.
The climb itself is :func:`labkit.ladder.climb.run_ladder`; headless: ``labkit ladder``
(:mod:`labkit.cli.ladder`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.choices import MODELS
from labkit.core.env import Mode, pick
from labkit.core.validation import checked_int, positive_int, positive_ints, positive_number
from labkit.ladder.rungs import RUNG_KEYS


@dataclass(frozen=True)
class LadderConfig:
    """What the ladder trains, for how long, and which rungs it may try."""

    model: str = "resnet18"                       # labkit.core.models.build_model name (ignored when model_fn is given)
    dataset: str | None = None                    # labkit.core.data.load_data name; None -> 'auto'
    train_limit: int | None = None
    val_limit: int | None = None
    budget_epochs: int = 2                        # fixed budget per rung: this many passes over the training set ...
    min_optimizer_steps: int = 30                 # ... raised so the largest candidate batch still takes this many
    lr: float = 0.05                              # SGD LR at lr_ref_batch, scaled linearly (Goyal et al. 2017)
    lr_ref_batch: int = 32
    lr_warmup_fraction: float = 0.2               # linear LR warm-up over this share of steps when LR was scaled up
    batch_candidates: tuple[int, ...] = (32, 64, 128, 256)
    probe_steps: int = 5                          # timed steps per candidate when choosing rung 1's batch
    memory_budget_bytes: int | None = None        # CPU memory budget for the batch-size finder
    num_workers: int | None = None                # rung 2; None -> half the cores (1..4)
    ddp_world_size: int | None = None             # last rung; None -> all GPUs, or 2 gloo processes on a CPU
    skip: tuple[str, ...] = ()                    # rung keys to leave out (reported as "skipped")
    min_gain: float = 0.03                        # a rung is carried forward only if >= 3% faster
    accuracy_tolerance: float = 0.02              # ... and its accuracy within 2 points of rung 0's
    warmup_steps: int = 3                         # excluded from throughput (compile, worker start-up)
    seed: int = 0
    device: str | None = None
    ddp_timeout_s: float = 600.0
    measure_ceiling: bool = True                  # the best recipe on device-resident training batches
    progress: bool = True

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r} (or pass model_fn= to run_ladder)")
        for name in ("budget_epochs", "min_optimizer_steps", "lr_ref_batch", "probe_steps"):
            positive_int(getattr(self, name), name)
        for name in ("train_limit", "val_limit", "memory_budget_bytes", "ddp_world_size"):
            checked_int(getattr(self, name), name, allow_none=True)
        for name in ("warmup_steps", "seed"):
            checked_int(getattr(self, name), name, minimum=0)
        checked_int(self.num_workers, "num_workers", minimum=0, allow_none=True)
        positive_number(self.lr, "lr")
        positive_ints(self.batch_candidates, "batch_candidates")
        unknown = [k for k in self.skip if k not in RUNG_KEYS]
        if unknown or "naive" in self.skip:
            raise ValueError(f"skip may name rungs {RUNG_KEYS[1:]}, got {self.skip!r} (rung 0 is the baseline)")
        if not 0 <= self.min_gain < 1 or not 0 <= self.accuracy_tolerance <= 1 or not 0 <= self.lr_warmup_fraction < 1:
            raise ValueError(f"min_gain and lr_warmup_fraction must be in [0, 1) and accuracy_tolerance in [0, 1], "
                             f"got {self.min_gain!r}, {self.lr_warmup_fraction!r}, {self.accuracy_tolerance!r}")
        positive_number(self.ddp_timeout_s, "ddp_timeout_s", hint="seconds")

    @classmethod
    def fast(cls, **overrides: Any) -> LadderConfig:
        """CPU-sized (fast mode): the small CNN on 1,024 of the lab's training images, 3 epochs per rung, batches 16
        or 32 (96 optimizer steps at batch 32, 3,072 at batch 1: rung 0 alone trains a step per sample, and the
        notebook must finish in two minutes on a shared CPU; at batch 64 the budget's 48 steps fell more than the
        tolerance below batch 1's accuracy, and every later rung then trained at batch 1).
        """
        return cls(**{"model": "small_cnn", "budget_epochs": 3, "train_limit": 1024, "batch_candidates": (16, 32),
                      "memory_budget_bytes": 1 << 30,                 # Binder's 2 GB, half for the kernel
                      **overrides})

    @classmethod
    def full(cls, **overrides: Any) -> LadderConfig:
        """GPU-sized (full mode): ResNet-18 on up to 10,000 training images, 2 epochs or 30 steps at batch 512."""
        return cls(**{"model": "resnet18", "train_limit": 10_000, "budget_epochs": 2,
                      "batch_candidates": (64, 128, 256, 512), **overrides})

    @classmethod
    def smoke(cls, **overrides: Any) -> LadderConfig:
        """Seconds-long, for tests: tiny data, two candidates, no compile, no DDP, no ceiling."""
        return cls(**{"model": "small_cnn", "train_limit": 64, "val_limit": 32, "budget_epochs": 1,
                      "min_optimizer_steps": 4, "batch_candidates": (4, 8), "probe_steps": 2, "warmup_steps": 1,
                      "skip": ("compile", "ddp"), "measure_ceiling": False, "progress": False, **overrides})

    @classmethod
    def for_mode(cls, mode: Mode | None = None, **overrides: Any) -> LadderConfig:
        """``fast()`` in fast mode, ``full()`` in full mode."""
        return pick(fast=cls.fast, full=cls.full, mode=mode)(**overrides)


def budget_samples(config: LadderConfig, train_len: int, world_size: int = 1) -> int:
    """Samples every rung trains on: ``budget_epochs`` passes, raised so that the largest global batch (the
    largest candidate the data allows, times the DDP rung's ``world_size``) still takes ``min_optimizer_steps``
    steps (a budget of 6 steps at batch 512 learns nothing; 8 GPUs at 512 each would get fewer still)."""
    largest = max([b for b in config.batch_candidates if b <= train_len] or [1])
    return max(config.budget_epochs * train_len, config.min_optimizer_steps * largest * world_size)
