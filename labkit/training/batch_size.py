"""The batch-size sweep: a fresh model trained per batch size, and the trade-offs it shows.

Throughput, step time, peak memory and validation accuracy per batch size, and the knee past which a bigger
batch buys little speed. The sweep can scale the learning rate linearly with the batch and warm it up
(Goyal et al. 2017, "Accurate, Large Minibatch SGD", sections 2.1-2.2; :mod:`labkit.training.batch_rules`).
With ``ceiling=True`` each row also gets its hardware ceiling (:mod:`labkit.training.ceiling`: the same model,
recipe and steps on real batches already on the device) and the fraction of it the real loader reached.
"""
from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch import nn

from labkit.core.clock import Deadline
from labkit.core.data import ImageData, make_loader, validate_batch_size
from labkit.core.device import device_label
from labkit.core.validation import positive_int
from labkit.training.batch_rules import scaled_lr
from labkit.training.ceiling import CEILING_REPEATS, measure_ceiling
from labkit.training.loop import RunResult, TrainConfig, train
from labkit.training.memory import build_memory_model, release_cpu_memory

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class SweepRow:
    """One batch size in a sweep (NaN/None where it did not fit)."""

    batch_size: int
    fits: bool
    lr: float
    samples_per_s: float
    step_time_s: float
    peak_mem_bytes: int | None
    val_accuracy: float | None
    steps: int
    note: str = ""
    ceiling_samples_per_s: float | None = None   # same model and recipe on device-resident batches (None: not measured)
    fraction_of_ceiling: float | None = None     # samples_per_s / ceiling_samples_per_s


def knee_batch(batch_sizes: list[int], samples_per_s: list[float], fraction: float = 0.9) -> int | None:
    """Smallest batch reaching ``fraction`` of the best throughput: past it, bigger batches buy little speed."""
    pairs = [(b, s) for b, s in zip(batch_sizes, samples_per_s) if s is not None and math.isfinite(s)]
    if not pairs:
        return None
    best = max(s for _, s in pairs)
    return min(b for b, s in pairs if s >= fraction * best)


@dataclass
class SweepResult:
    """Rows of a batch-size sweep, with a table and a plot."""

    rows: list[SweepRow]
    device: str

    def to_dataframe(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame."""
        return pd.DataFrame([asdict(r) for r in self.rows])

    def knee(self, fraction: float = 0.9) -> int | None:
        """The knee of the throughput curve (see :func:`knee_batch`)."""
        ok = [r for r in self.rows if r.fits]
        return knee_batch([r.batch_size for r in ok], [r.samples_per_s for r in ok], fraction)

    def plot(self, axes: Sequence[Axes] | np.ndarray | None = None) -> Sequence[Axes] | np.ndarray:
        """Throughput and peak memory against batch size (log2 axis), knee marked."""
        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        ok = [r for r in self.rows if r.fits]
        bs = [r.batch_size for r in ok]
        axes[0].plot(bs, [r.samples_per_s for r in ok], "o-", label="real loader")
        measured = [r for r in ok if r.ceiling_samples_per_s is not None]
        if measured:
            axes[0].plot([r.batch_size for r in measured], [r.ceiling_samples_per_s for r in measured], "x:",
                         color="tab:green", label="ceiling (batches on the device)")
        axes[1].plot(bs, [(r.peak_mem_bytes or 0) / 1e6 for r in ok], "s-", color="tab:orange")
        knee = self.knee()
        if knee is not None:
            axes[0].axvline(knee, ls="--", color="grey", label=f"knee (90% of best) at {knee}")
        if knee is not None or measured:
            axes[0].legend()
        for ax, label in zip(axes, ("samples/s", "peak memory (MB)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel(label)
        axes[0].set_title(f"throughput on {self.device}")
        return axes


def batch_size_sweep(model_fn: Callable[[], nn.Module], data: ImageData, batch_sizes: list[int], *,
                     steps: int | None = None, epochs: int | None = None, time_budget_s: float | None = None,
                     base_lr: float = 0.05, base_batch: int = 32, lr_scaling: bool = False, lr_warmup_steps: int = 5,
                     memory_budget_bytes: int | None = None, device: str | None = None, seed: int = 0,
                     progress: bool = True, ceiling: bool = False, ceiling_repeats: int = CEILING_REPEATS,
                     ceiling_fn: Callable[..., RunResult] | None = None) -> SweepResult:
    """Train a fresh model per batch size; throughput, step time, peak memory, val accuracy (and ceiling) per row.

    ``ceiling=True`` measures each row's hardware ceiling with ``ceiling_fn`` (default
    :func:`labkit.training.ceiling.measure_ceiling`, best of ``ceiling_repeats``): a fresh model, the row's
    TrainConfig and as many steps as the row ran, on real training batches resident on the device.
    """
    if not batch_sizes:
        raise ValueError("batch_sizes is empty; give e.g. [1, 8, 32, 128]")
    sizes = [validate_batch_size(b, len(data.train), "batch size in batch_sizes") for b in batch_sizes]
    ceiling_repeats = positive_int(ceiling_repeats, "ceiling_repeats")
    rows = []
    for bs in sizes:
        lr = scaled_lr(base_lr, bs, base_batch) if lr_scaling else base_lr
        cfg = TrainConfig(steps=steps, epochs=epochs, lr=lr, device=device, seed=seed, progress=progress,
                          lr_warmup_steps=lr_warmup_steps if lr_scaling else 0)
        row = _sweep_row(model_fn(), data, bs, cfg, memory_budget_bytes, time_budget_s)
        release_cpu_memory()                  # keep the process's memory from ratcheting up row after row
        if ceiling and row.fits:
            row = _with_ceiling(row, model_fn(), data, cfg, ceiling_repeats, ceiling_fn or measure_ceiling)
            release_cpu_memory()
        rows.append(row)
    return SweepResult(rows, device_label(device))


def _with_ceiling(row: SweepRow, model: nn.Module, data: ImageData, cfg: TrainConfig, repeats: int,
                  ceiling_fn: Callable[..., RunResult]) -> SweepRow:
    """``row`` with its ceiling: ``model`` trained as many steps as the row, on resident real batches."""
    ceiling_cfg = replace(cfg, steps=row.steps, epochs=None, evaluate=False, profile_model=False)  # samples/s only
    try:
        run = ceiling_fn(model, row.batch_size, ceiling_cfg, image_shape=tuple(data.image_shape),
                         num_classes=data.num_classes, repeats=repeats, sample_from=data.train)
    except torch.cuda.OutOfMemoryError:     # the resident batches on top of the step: the row stands, unbounded
        del model
        _free_device_memory()
        return replace(row, note=f"{row.note}; " * bool(row.note) + "ceiling not measured (out of memory)")
    ceiling_sps = float(run.samples_per_s_median)
    return replace(row, ceiling_samples_per_s=ceiling_sps, fraction_of_ceiling=row.samples_per_s / ceiling_sps)


def _sweep_row(model: nn.Module, data: ImageData, batch_size: int, cfg: TrainConfig, memory_budget_bytes: int | None,
               time_budget_s: float | None) -> SweepRow:
    """Train ``model`` at ``batch_size``, or a row saying why it does not fit (over the budget, out of memory)."""
    if memory_budget_bytes is not None:
        need = build_memory_model(model, data.image_shape).predict(batch_size).total_bytes
        if need > memory_budget_bytes:
            return SweepRow(batch_size, False, cfg.lr, math.nan, math.nan, need, None, 0,
                            f"does not fit: predicted {need / 1e6:.0f} MB > budget")
    deadline = Deadline(time_budget_s) if time_budget_s is not None else None
    stop = (lambda record, progress: deadline.expired) if deadline is not None else None
    try:
        res = train(model, make_loader(data.train, batch_size, shuffle=True, seed=cfg.seed), cfg,
                    val_loader=make_loader(data.val, min(256, len(data.val))), callback=stop)
    except torch.cuda.OutOfMemoryError:
        del model
        _free_device_memory()
        return SweepRow(batch_size, False, cfg.lr, math.nan, math.nan, None, None, 0, "does not fit (out of memory)")
    return SweepRow(batch_size, True, cfg.lr, res.samples_per_s_median, res.step_time_median_s, res.peak_mem_bytes,
                    res.val_accuracy, len(res.steps))


def _free_device_memory() -> None:
    """Hand what a failed run held back to the device (after an out-of-memory error)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
