"""The batch-size sweep: a fresh model trained per batch size, and the trade-offs it shows.

Throughput, step time, peak memory and validation accuracy per batch size, and the knee past which a bigger
batch buys little speed. The sweep can scale the learning rate linearly with the batch and warm it up
(Goyal et al. 2017, "Accurate, Large Minibatch SGD", sections 2.1-2.2; :mod:`labkit.training.batch_rules`).
With ``ceiling=True`` each row also gets its hardware ceiling (:mod:`labkit.training.ceiling`: the same model,
recipe and steps on real batches already on the device) and the fraction of it the real loader reached.

Throughput on a shared machine: load only ever slows a run down, and it comes and goes. On the 2-core CI box a
process busy on one core slowed ResNet-18's two-thread steps in a Jupyter kernel from 54 to 8 samples/s at
batch 32 (25 to 0.35 at batch 1), so a sweep that timed each size once, one after the other, compared spells
rather than batch sizes: batch 1 timed before the load came (23 samples/s) beat batch 32 timed under it (8),
although batch 32 is 2.2x faster on a quiet machine. ``rounds`` > 1 times every size several times, the sizes
taking turns (:func:`labkit.core.clock.interleaved`), and keeps each row's fastest round; comparisons
between sizes (:meth:`SweepResult.ratio`) go round by round (:func:`labkit.core.clock.paired_median`), so a load
that starts or stops mid-sweep spoils one round, not the comparison. A ceiling is an upper bound, so it is the
fastest of its rounds, and ``fraction_of_ceiling`` holds the loader's median round against it.
"""
from __future__ import annotations

import gc
import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch import nn

from labkit.core.clock import Deadline, interleaved, paired_median
from labkit.core.data import ImageData, make_loader, validate_batch_size
from labkit.core.device import device_label, get_device
from labkit.core.validation import positive_int
from labkit.memory.host import release_cpu_memory
from labkit.memory.model import MemoryModel
from labkit.training.batch_rules import scaled_lr
from labkit.training.ceiling import CEILING_REPEATS, measure_ceiling
from labkit.training.config import TrainConfig
from labkit.training.run_spec import RunSpec
from labkit.training.loop import RunResult, train

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
    fraction_of_ceiling: float | None = None     # median round's samples/s over the fastest ceiling
    round_samples_per_s: tuple[float, ...] = ()  # every round's samples/s in round order; samples_per_s is the best
    round_step_time_s: tuple[float, ...] = ()    # every round's step time; step_time_s is the fastest round's
    round_ceiling_samples_per_s: tuple[float | None, ...] = ()   # every round's ceiling (None: not measured)


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

    def ratio(self, batch: int, other_batch: int, of: str = "samples_per_s") -> float | None:
        """``of`` (samples_per_s or step_time_s) at ``batch`` over ``other_batch``, round by round (median).

        Each round's two runs ran seconds apart (:func:`labkit.core.clock.paired_median`), so load that came or
        went between rounds spoils one round, not the comparison. None where either size did not run.
        """
        rounds = {"samples_per_s": "round_samples_per_s", "step_time_s": "round_step_time_s"}
        if of not in rounds:
            raise ValueError(f"of must be one of {sorted(rounds)}, got {of!r}")
        ran = {r.batch_size: getattr(r, rounds[of]) for r in self.rows if r.fits}
        if batch not in ran or other_batch not in ran:
            return None
        return paired_median(ran[batch], ran[other_batch])

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


Round = tuple[float, float, "float | None"]     # one round at one size: (samples/s, step time s, ceiling samples/s)


def batch_size_sweep(model_fn: Callable[[], nn.Module], data: ImageData, batch_sizes: list[int], *,
                     steps: int | None = None, epochs: int | None = None, time_budget_s: float | None = None,
                     base_lr: float = 0.05, base_batch: int = 32, lr_scaling: bool = False, lr_warmup_steps: int = 5,
                     memory_budget_bytes: int | None = None, device: str | None = None, seed: int = 0,
                     progress: bool = True, rounds: int = 1, ceiling: bool = False,
                     ceiling_repeats: int | None = None,
                     ceiling_fn: Callable[..., RunResult] | None = None,
                     on_row: Callable[[SweepRow], None] | None = None) -> SweepResult:
    """Train a fresh model per batch size; throughput, step time, peak memory, val accuracy (and ceiling) per row.

    ``rounds`` > 1 times every size that ran ``rounds`` times, the sizes taking turns round by round, and keeps
    each row's fastest round (its samples/s and step time; every round's samples/s is in ``round_samples_per_s``).
    Round 1 is the training run that also gives the accuracy and memory; later rounds train a fresh model for
    as many steps, timing only. ``ceiling=True`` measures each row's hardware ceiling in every round with
    ``ceiling_fn`` (default :func:`labkit.training.ceiling.measure_ceiling`: a fresh model, the row's TrainConfig
    and steps, on real training batches resident on the device), fastest of ``ceiling_repeats`` runs per round
    (default: CEILING_REPEATS with one round, 1 where rounds repeat it); the row keeps the fastest, and its
    ``fraction_of_ceiling`` is the median round's samples/s over it.
    A row's peak memory is measured on a GPU; on a CPU it is the memory model's prediction (one memory model per
    sweep, :mod:`labkit.memory.model`, also used for ``memory_budget_bytes``).
    ``on_row`` receives each row when round 1 finishes it (the CLI saves it at once, so an interrupt loses none).
    """
    if not batch_sizes:
        raise ValueError("batch_sizes is empty; give e.g. [1, 8, 32, 128]")
    sizes = [validate_batch_size(b, len(data.train), "batch size in batch_sizes") for b in batch_sizes]
    rounds = positive_int(rounds, "rounds")
    repeats = positive_int(ceiling_repeats if ceiling_repeats is not None else CEILING_REPEATS if rounds == 1 else 1,
                           "ceiling_repeats")
    sweep = _Sweep(model_fn, data, memory_budget_bytes, time_budget_s,
                   (ceiling_fn or measure_ceiling) if ceiling else None, repeats)
    configs = {bs: TrainConfig(steps=steps, epochs=epochs, device=device, progress=progress, profile_model=False,
                               run=RunSpec(batch_size=bs, seed=seed,
                                           lr=scaled_lr(base_lr, bs, base_batch) if lr_scaling else base_lr,
                                           lr_warmup_steps=lr_warmup_steps if lr_scaling else 0))
               for bs in sizes}
    rows, timed = [], {}
    for bs in sizes:                        # round 1: each size's training run, then its ceiling
        rows.append(sweep.train_row(bs, configs[bs]))
        if rows[-1].fits:
            timed[str(bs)] = [(rows[-1].samples_per_s, rows[-1].step_time_s, sweep.ceiling(rows[-1], configs[bs]))]
        if on_row is not None:
            on_row(_fastest(rows[-1], timed.get(str(bs), []), ceiling))
    if rounds > 1 and timed:                # rounds 2..: the sizes take turns, so a slow spell hits them alike
        later = interleaved({str(r.batch_size): (lambda r=r: sweep.again(r, configs[r.batch_size]))
                             for r in rows if r.fits}, rounds - 1)
        timed = {key: timed[key] + later[key] for key in timed}
    release_cpu_memory()
    return SweepResult([_fastest(r, timed.get(str(r.batch_size), []), ceiling) for r in rows], device_label(device))


class _Sweep:
    """What every row of one sweep shares: the model factory, the data, the budgets, the ceiling, one memory model."""

    def __init__(self, model_fn: Callable[[], nn.Module], data: ImageData, memory_budget_bytes: int | None,
                 time_budget_s: float | None, ceiling_fn: Callable[..., RunResult] | None, ceiling_repeats: int):
        self.model_fn, self.data = model_fn, data
        self.budget_bytes, self.time_budget_s = memory_budget_bytes, time_budget_s
        self.ceiling_fn, self.ceiling_repeats = ceiling_fn, ceiling_repeats
        self.memory: MemoryModel | None = None

    def memory_model(self, model: nn.Module, cfg: TrainConfig) -> MemoryModel:
        """The sweep's memory model, built once from the first row's fresh model (every row has the same shapes)."""
        if self.memory is None:
            self.memory = cfg.spec.memory_model(model, self.data.image_shape)
        return self.memory

    def train_row(self, batch_size: int, cfg: TrainConfig) -> SweepRow:
        """Round 1 at ``batch_size``: train a fresh model (or say why it does not fit), then free what it held."""
        model = self.model_fn()
        on_cpu = get_device(cfg.device).type == "cpu"
        memory = self.memory_model(model, cfg) if on_cpu or self.budget_bytes is not None else None
        row = _sweep_row(model, self.data, batch_size, cfg, memory, self.budget_bytes, self.time_budget_s)
        if row.fits and on_cpu:
            row = replace(row, peak_mem_bytes=memory.predict(batch_size).total_bytes)
        del model
        release_cpu_memory()                  # keep the process's memory from ratcheting up row after row
        return row

    def again(self, row: SweepRow, cfg: TrainConfig) -> Round:
        """One more round at the row's batch: a fresh model trained the row's steps (timing only), then the ceiling."""
        timing = replace(cfg, steps=row.steps, epochs=None, evaluate=False)
        try:
            res = train(self.model_fn(), cfg.spec.loader(self.data.train), timing)
            measured = (res.samples_per_s_median, res.step_time_median_s)
        except torch.cuda.OutOfMemoryError:   # it fitted in round 1; a round that does not is left out
            _free_device_memory()
            measured = (math.nan, math.nan)
        round_ = (*measured, self.ceiling(row, cfg))
        release_cpu_memory()                  # once per size and round: what both runs held
        return round_

    def ceiling(self, row: SweepRow, cfg: TrainConfig) -> float | None:
        """The row's ceiling this round (None: not asked for, or out of memory), on a fresh model."""
        if self.ceiling_fn is None:
            return None
        ceiling_cfg = replace(cfg, steps=row.steps, epochs=None, evaluate=False)    # samples/s only
        try:
            run = self.ceiling_fn(self.model_fn(), row.batch_size, ceiling_cfg, repeats=self.ceiling_repeats,
                                  image_shape=tuple(self.data.image_shape), num_classes=self.data.num_classes,
                                  sample_from=self.data.train)
        except torch.cuda.OutOfMemoryError:   # the resident batches on top of the step: the row stands, unbounded
            _free_device_memory()
            return None
        return float(run.samples_per_s_median)


def _fastest(row: SweepRow, rounds: list[Round], ceiling: bool) -> SweepRow:
    """``row`` with its fastest round (samples/s, step time), every round, its fastest ceiling and the fraction."""
    if not row.fits:
        return row
    timed = [r for r in rounds if math.isfinite(r[0])]
    samples_per_s, step_time_s, _ = max(timed, key=lambda r: r[0])
    measured = [r[2] for r in rounds if r[2] is not None]
    best_ceiling = max(measured) if measured else None
    note = row.note
    if ceiling and best_ceiling is None:
        note = f"{note}; " * bool(note) + "ceiling not measured (out of memory)"
    median_samples_per_s = statistics.median(r[0] for r in timed)
    return replace(row, samples_per_s=samples_per_s, step_time_s=step_time_s, note=note,
                   round_samples_per_s=tuple(r[0] for r in rounds), round_step_time_s=tuple(r[1] for r in rounds),
                   round_ceiling_samples_per_s=tuple(r[2] for r in rounds), ceiling_samples_per_s=best_ceiling,
                   fraction_of_ceiling=None if best_ceiling is None else median_samples_per_s / best_ceiling)


def _sweep_row(model: nn.Module, data: ImageData, batch_size: int, cfg: TrainConfig, memory: MemoryModel | None,
               memory_budget_bytes: int | None, time_budget_s: float | None) -> SweepRow:
    """Train ``model`` at ``batch_size``, or a row saying why it does not fit (over the budget, out of memory)."""
    if memory_budget_bytes is not None:
        need = memory.predict(batch_size).total_bytes
        if need > memory_budget_bytes:
            return SweepRow(batch_size, False, cfg.spec.lr, math.nan, math.nan, need, None, 0,
                            f"does not fit: predicted {need / 1e6:.0f} MB > budget")
    deadline = Deadline(time_budget_s) if time_budget_s is not None else None
    stop = (lambda record, progress: deadline.expired) if deadline is not None else None
    try:
        res = train(model, cfg.spec.loader(data.train), cfg,
                    val_loader=make_loader(data.val, min(256, len(data.val))), callback=stop)
    except torch.cuda.OutOfMemoryError:
        del model
        _free_device_memory()
        return SweepRow(batch_size, False, cfg.spec.lr, math.nan, math.nan, None, None, 0, "does not fit (out of memory)")
    return SweepRow(batch_size, True, cfg.spec.lr, res.samples_per_s_median, res.step_time_median_s, res.peak_mem_bytes,
                    res.val_accuracy, len(res.steps))


def _free_device_memory() -> None:
    """Hand what a failed run held back to the device (after an out-of-memory error)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
