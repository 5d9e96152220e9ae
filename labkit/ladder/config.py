"""The tuning ladder: one training job, every lesson of the kit switched on rung by rung, each rung measured.

Rungs are cumulative: each is added to the best recipe so far and measured with the instrumented loop for the
same fixed budget of training samples (throughput *and* accuracy). A rung that does not make the job faster
here, or that costs accuracy against rung 0, is still measured and reported, then left out of the following
rungs; a rung that cannot apply here says why. Beside the table: the hardware ceiling (the best recipe on
training batches already on the device), so the reader sees how far the recipe is from the hardware.
Headless: ``python -m labkit ladder`` (:mod:`labkit.cli.ladder`).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

from labkit.ladder.climb import MIN_TIMED_STEPS, LadderJob, climb
from labkit.ladder.measure import fp32_math, steps_for_budget, train_config
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.rungs import RUNG_KEYS, RUNGS, Recipe, detect_capabilities
from labkit.core.models import MODELS
from labkit.core.validation import checked_int, positive_int

__all__ = ["LadderConfig", "LadderResult", "LadderRow", "RUNGS", "run_ladder"]


@dataclass(frozen=True)
class LadderConfig:
    """What the ladder trains, for how long, and which rungs it may try."""

    model: str = "resnet18"                       # labkit.build_model name (ignored when model_fn is given)
    dataset: str | None = None                    # labkit.load_data name; None -> 'auto'
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
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not self.batch_candidates or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                            for b in self.batch_candidates):
            raise ValueError(f"batch_candidates must be a non-empty tuple of positive integers, "
                             f"got {self.batch_candidates!r}")
        unknown = [k for k in self.skip if k not in RUNG_KEYS]
        if unknown or "naive" in self.skip:
            raise ValueError(f"skip may name rungs {RUNG_KEYS[1:]}, got {self.skip!r} (rung 0 is the baseline)")
        if not 0 <= self.min_gain < 1 or not 0 <= self.accuracy_tolerance <= 1 or not 0 <= self.lr_warmup_fraction < 1:
            raise ValueError(f"min_gain and lr_warmup_fraction must be in [0, 1) and accuracy_tolerance in [0, 1], "
                             f"got {self.min_gain!r}, {self.lr_warmup_fraction!r}, {self.accuracy_tolerance!r}")
        if not self.ddp_timeout_s > 0:
            raise ValueError(f"ddp_timeout_s must be > 0 seconds, got {self.ddp_timeout_s!r}")

    @classmethod
    def fast(cls, **overrides) -> "LadderConfig":
        """CPU-sized (fast mode): the small CNN on the lab's data, 5 epochs per rung, batches up to 64.

        Five epochs bring the digits to a plateau, so rungs that only reorder floating-point work land within
        a point of each other; at batch 64 that is still over 100 optimizer steps.
        """
        return cls(**{"model": "small_cnn", "budget_epochs": 5, "batch_candidates": (16, 32, 64),
                      "memory_budget_bytes": 1 << 30,                 # Binder's 2 GB, half for the kernel
                      **overrides})

    @classmethod
    def full(cls, **overrides) -> "LadderConfig":
        """GPU-sized (full mode): ResNet-18 on up to 10,000 training images, 2 epochs or 30 steps at batch 512."""
        return cls(**{"model": "resnet18", "train_limit": 10_000, "budget_epochs": 2,
                      "batch_candidates": (64, 128, 256, 512), **overrides})

    @classmethod
    def smoke(cls, **overrides) -> "LadderConfig":
        """Seconds-long, for tests: tiny data, two candidates, no compile, no DDP, no ceiling."""
        return cls(**{"model": "small_cnn", "train_limit": 64, "val_limit": 32, "budget_epochs": 1,
                      "min_optimizer_steps": 4, "batch_candidates": (4, 8), "probe_steps": 2, "warmup_steps": 1,
                      "skip": ("compile", "ddp"), "measure_ceiling": False, "progress": False, **overrides})

    @classmethod
    def for_mode(cls, mode=None, **overrides) -> "LadderConfig":
        """``fast()`` in fast mode, ``full()`` in full mode."""
        from labkit.core.env import pick

        return pick(fast=cls.fast, full=cls.full, mode=mode)(**overrides)


def budget_samples(config: LadderConfig, train_len: int) -> int:
    """Samples every rung trains on: ``budget_epochs`` passes, raised so that the largest candidate batch that
    the data allows still takes ``min_optimizer_steps`` steps (a budget of 6 steps at batch 512 learns nothing)."""
    largest = max([b for b in config.batch_candidates if b <= train_len] or [1])
    return max(config.budget_epochs * train_len, config.min_optimizer_steps * largest)


def run_ladder(config: LadderConfig | None = None, model_fn: Callable | None = None, data=None, *,
               trainer: Callable | None = None, ceiling_fn: Callable | None = None) -> LadderResult:
    """Climb the ladder on one job: measure every rung, carry forward the ones that help, return the table.

    ``model_fn()`` builds a fresh model (default: ``config.model`` via labkit.build_model; must be picklable,
    e.g. a module-level function, for the DDP rung); ``data`` is an ImageData (default: labkit.load_data);
    ``trainer`` replaces labkit.training.loop.train and ``ceiling_fn`` labkit.training.ceiling.measure_ceiling (tests inject fakes).
    """
    from labkit.core.data import load_data, make_loader
    from labkit.core.env import get_mode
    from labkit.core.device import device_label, get_device
    from labkit.core.models import build_model, check_model_accepts

    config = config or LadderConfig.for_mode()
    name = config.model if model_fn is None else getattr(model_fn, "__name__", type(model_fn).__name__)
    device = get_device(config.device)
    if data is None:
        data = load_data(config.dataset, train_limit=config.train_limit, val_limit=config.val_limit, seed=config.seed)
    model_fn = model_fn or functools.partial(build_model, config.model, data.num_classes, tuple(data.image_shape))
    check_model_accepts(model_fn(), tuple(data.image_shape), data.num_classes)
    caps = detect_capabilities(device, config.ddp_world_size, config.num_workers)
    job = LadderJob(config, model_fn, data, str(device), caps, make_loader(data.val, min(256, len(data.val))),
                    budget_samples(config, len(data.train)), trainer)
    rows, probe, notes = climb(job)
    result = LadderResult(rows, device_label(device), str(get_mode()), name, data.name, job.budget_samples,
                          probe, notes)
    return with_ceiling(result, job, ceiling_fn) if config.measure_ceiling else result


def with_ceiling(result: LadderResult, job: LadderJob, ceiling_fn: Callable | None = None) -> LadderResult:
    """The result with the hardware ceiling measured for its best single-process recipe, and every rung's
    fraction of it (per process, so a DDP rung is compared per device)."""
    single = [r for r in result.rows if r.measured and r.world_size == 1 and r.accuracy_ok is not False]
    if not single:
        return result
    best = max(single, key=lambda r: r.samples_per_s)
    recipe = Recipe(**best.recipe)
    if ceiling_fn is None:
        from labkit.training.ceiling import measure_ceiling as ceiling_fn
    cfg = job.config
    steps = steps_for_budget(job.budget_samples, recipe.batch_size, cfg.warmup_steps + MIN_TIMED_STEPS)
    train_cfg = train_config(recipe, steps=steps, lr=best.lr, warmup_steps=cfg.warmup_steps, seed=cfg.seed,
                             device=job.device)
    with fp32_math(recipe.tf32):
        run = ceiling_fn(job.model_fn(), recipe.batch_size, train_cfg, image_shape=tuple(job.data.image_shape),
                         num_classes=job.data.num_classes, sample_from=job.data.train)
    ceiling = float(run.samples_per_s_median)
    rows = [dataclasses.replace(r, fraction_of_ceiling=r.samples_per_s / r.world_size / ceiling)
            if r.measured else r for r in result.rows]
    note = (f"rung {best.rung}'s recipe ({best.math_mode}, batch {recipe.batch_size}) on training batches already "
            f"on the device, {steps} steps, fastest of its repeats")
    return dataclasses.replace(result, rows=rows, ceiling_samples_per_s=ceiling, ceiling_note=note)
