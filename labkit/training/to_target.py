"""Steps and examples to a target accuracy, and the critical batch size they imply (McCandlish et al. 2018, "An
Empirical Model of Large-Batch Training", arXiv 1812.06162, section 2.3 and eq. 2.11).

Train to a target validation accuracy at several batch sizes and seeds with the kit's loop
(:func:`labkit.training.loop.train`, stopped by its callback when the target is reached), record the steps S and
examples E = B * S, and fit the paper's trade-off S/S_min - 1 = (E/E_min - 1)^-1, which with E = B * S is the
straight line S = S_min + E_min / B in 1/B. B_crit = E_min / S_min is where it turns: well below it, doubling the
batch halves the steps; well above it, the steps stop falling. The fit's uncertainty comes from resampling the
seeds (a bootstrap), so a claim the runs cannot decide says so.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from labkit.core.clock import now_s
from labkit.core.data import ImageData, make_loader
from labkit.core.env import seed_everything
from labkit.core.progress import progress_bar
from labkit.core.validation import positive_int
from labkit.training.batch_rules import scaled_lr
from labkit.training.config import TrainConfig
from labkit.training.loop import RunResult, evaluate_accuracy, train
from labkit.training.run_spec import RunSpec


@dataclass(frozen=True)
class TargetRun:
    """One run to the target: steps and examples when reached (None if not within ``max_steps``), its time."""

    batch_size: int
    seed: int
    lr: float
    target: float
    reached: bool
    steps: int | None
    examples: int | None
    accuracy: float
    wall_s: float
    step_time_s: float


def capped_lr(base_lr: float, batch_size: int, base_batch: int, max_lr: float) -> float:
    """Goyal et al. 2017's linear scaling, capped at ``max_lr``: past some batch the scaled LR diverges, and the
    same schedule family then keeps its largest stable step (a tuned LR levels off the same way)."""
    return min(scaled_lr(base_lr, batch_size, base_batch), max_lr)


def validation_batches(data: ImageData, device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole validation set as one batch on ``device``, prepared once (an evaluation every step stays cheap)."""
    x, y = next(iter(make_loader(data.val, len(data.val))))
    return [(x.to(device), y.to(device))]


def reach_target(model: nn.Module, loader: Iterable, config: TrainConfig, val: Iterable, target: float,
                 eval_every: int = 1, eval_model: nn.Module | None = None) -> tuple[int | None, float, RunResult]:
    """Train with the kit's loop (``config.steps`` at most), evaluating every ``eval_every`` steps and stopping at
    ``target``: (steps to the target or None, the last accuracy, the run). ``eval_model``: the plain module to
    evaluate where the loop trains a compiled wrapper of it (evaluation then never recompiles)."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be an accuracy in (0, 1], got {target!r}")
    positive_int(eval_every, "eval_every")
    config = dataclasses.replace(config, log_every=eval_every, read_every=eval_every, evaluate=False, progress=False,
                                 profile_model=False)            # no FLOP probe inside the timed run
    seen: list[float] = []

    def stop_at_target(record, progress) -> bool:
        seen.append(evaluate_accuracy(eval_model or progress.model, val))
        return seen[-1] >= target

    run = train(model, loader, config, callback=stop_at_target)
    reached = bool(seen) and seen[-1] >= target
    return (len(run.steps) if reached else None), (seen[-1] if seen else math.nan), run


def train_to_target(model_fn: Callable[[], nn.Module], data: ImageData, batch_size: int, *, target: float, lr: float,
                    seed: int = 0, max_steps: int = 2000, eval_every: int = 1, device: str | None = None,
                    momentum: float = 0.9) -> TargetRun:
    """Train a fresh model (SGD with momentum, constant LR) until validation accuracy reaches ``target`` or
    ``max_steps`` pass; the clock starts before the data is touched (MLPerf's rule)."""
    positive_int(max_steps, "max_steps")
    start = now_s()
    seed_everything(seed)
    model = model_fn()
    cfg = TrainConfig(steps=max_steps, run=RunSpec(batch_size=batch_size, lr=lr, momentum=momentum, seed=seed),
                      device=device, profile_model=False, timing="step", warmup_steps=0)
    loader = make_loader(data.train, batch_size, shuffle=True, drop_last=True, seed=seed)
    steps, accuracy, run = reach_target(model, loader, cfg, validation_batches(data, device or "cpu"), target,
                                        eval_every)
    return TargetRun(batch_size, seed, lr, target, steps is not None, steps,
                     steps * batch_size if steps is not None else None, accuracy, now_s() - start,
                     float(run.step_time_median_s))


def fit_critical_batch(steps: Sequence[float], examples: Sequence[float],
                       weights: Sequence[float] | None = None) -> tuple[float, float]:
    """(S_min, E_min) by least squares of S = S_min + E_min / B, with B = E / S (McCandlish et al., eq. 2.11)."""
    s = np.asarray(steps, dtype=float)
    e = np.asarray(examples, dtype=float)
    if s.shape != e.shape or s.size < 2 or np.any(s <= 0) or np.any(e <= 0):
        raise ValueError("need two or more positive (steps, examples) pairs of equal length")
    inv_b = s / e
    if np.ptp(inv_b) == 0:
        raise ValueError("all pairs have the same batch size; the fit needs two or more batch sizes")
    w = np.sqrt(np.ones_like(s) if weights is None else np.asarray(weights, dtype=float))
    a = np.stack([np.ones_like(s), inv_b], axis=1) * w[:, None]
    (s_min, e_min), *_ = np.linalg.lstsq(a, s * w, rcond=None)
    return float(s_min), float(e_min)


def critical_batch(s_min: float, e_min: float) -> float:
    """B_crit = E_min / S_min (inf where the fit finds no floor of steps: S_min <= 0)."""
    return e_min / s_min if s_min > 0 else math.inf


@dataclass(frozen=True)
class CriticalBatchFit:
    """The fitted trade-off, B_crit with its bootstrap 68% interval, and the mean steps per batch it was fit to."""

    s_min: float
    e_min: float
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    mean_steps: dict[int, float]
    seeds: int
    steps_stderr: dict[int, float] = dataclasses.field(default_factory=dict)   # standard error of each mean

    def steps_at(self, batch_size: float) -> float:
        """The fitted S(B) = S_min + E_min / B."""
        return self.s_min + self.e_min / batch_size

    @property
    def spread_factor(self) -> float:
        """How many times wider the top of the interval is than its bottom (inf: unbounded)."""
        return self.b_crit_high / self.b_crit_low if self.b_crit_low > 0 else math.inf

    def __str__(self) -> str:
        return (f"S_min = {self.s_min:.1f} steps, E_min = {self.e_min:.0f} samples, B_crit = {self.b_crit:.0f} "
                f"(68% interval {self.b_crit_low:.0f}-{self.b_crit_high:.0f}, {self.seeds} seeds per batch)")


def _fit_means(means: dict[int, float]) -> tuple[float, float]:
    bs = sorted(means)
    s = [means[b] for b in bs]
    return fit_critical_batch(s, [b * v for b, v in zip(bs, s)], [1.0 / v ** 2 for v in s])   # relative errors


def fit_runs(runs: Sequence[TargetRun], *, bootstrap: int = 400, seed: int = 0) -> CriticalBatchFit:
    """Fit S_min, E_min and B_crit to the runs that reached the target (mean steps per batch, relative least
    squares), with a 68% interval from resampling each batch size's seeds."""
    by_batch: dict[int, list[int]] = {}
    for r in runs:
        if r.reached:
            by_batch.setdefault(r.batch_size, []).append(r.steps)
    if len(by_batch) < 3:
        raise ValueError(f"only {len(by_batch)} batch sizes reached the target; the fit needs 3 or more "
                         "(lower the target or raise max_steps)")
    means = {b: statistics.fmean(v) for b, v in sorted(by_batch.items())}
    s_min, e_min = _fit_means(means)
    rng = np.random.default_rng(seed)
    draws = [critical_batch(*_fit_means({b: float(np.mean(rng.choice(v, len(v)))) for b, v in by_batch.items()}))
             for _ in range(bootstrap)]
    low, high = np.percentile(draws, [16, 84])
    stderr = {b: statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else math.inf for b, v in by_batch.items()}
    return CriticalBatchFit(s_min, e_min, critical_batch(s_min, e_min), float(low), float(high), means,
                            min(len(v) for v in by_batch.values()), stderr)


def runs_to_target(model_fn: Callable[[], nn.Module], data: ImageData, batch_sizes: Sequence[int],
                   seeds: Sequence[int], *, target: float, lr_for: Callable[[int], float], max_steps: int,
                   device: str | None = None, progress: bool = True) -> list[TargetRun]:
    """:func:`train_to_target` for every batch size and seed (LR from ``lr_for(batch)``), with a progress bar."""
    runs = []
    with progress_bar(total=len(batch_sizes) * len(seeds), desc="to target", unit="run", enabled=progress) as bar:
        for b in batch_sizes:
            for seed in seeds:
                runs.append(train_to_target(model_fn, data, b, target=target, lr=lr_for(b), seed=seed,
                                            max_steps=max_steps, device=device))
                bar.update(1)
    return runs
