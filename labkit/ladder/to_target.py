"""The ladder's verdict by time to a target accuracy: each rung's recipe trained until it reaches the target,
timed MLPerf-style (clock started before the rung touches its data, several seeds, olympic mean and spread), and
the winner is the rung fastest to the target, so a rung faster per sample that misses the target does not win.

Single-process rungs only: a multi-process (DDP) rung would need every rank to stop on one evaluation, which the
kit's rung worker does not do; such a rung is listed with that reason. See :mod:`labkit.training.time_to_target`
for the timing rules and their sources.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd

from labkit.core.data import ImageData
from labkit.core.env import seed_everything
from labkit.core.models import build_model
from labkit.ladder.config import LadderConfig
from labkit.ladder.measure import rung_run, steps_for_budget, train_config, train_loader
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.rungs import Recipe
from labkit.training.flops import fp32_math_of
from labkit.training.time_to_target import TimeToTarget, time_runs
from labkit.training.to_target import reach_target, validation_batches

EVALS_PER_EPOCH = 4          # how often a run checks the target: its granularity is a quarter epoch
AIRBENCH_94_S = 2.59         # airbench94_muon.py: 94.01% mean on CIFAR-10 in 2.59 s, one 400 W A100, torch 2.4.1
AIRBENCH_SOURCE = ("KellerJordan/cifar10-airbench README (airbench94_muon.py, 94.01% in 2.59 s on a 400 W A100); the "
                   "paper, Jordan 2024, arXiv 2404.00498, reports 3.29 s for its airbench94 (compiled)")


@dataclass(frozen=True)
class RungTime:
    """One rung's time to the target (None where it was not timed, with the reason)."""

    rung: int
    title: str
    batch_size: int
    samples_per_s: float
    time: TimeToTarget | None
    reason: str = ""


def run_rung_to_target(row: LadderRow, config: LadderConfig, data: ImageData, model_fn: Callable, device: str,
                       target: float, max_epochs: int, seed: int) -> bool:
    """Train rung ``row``'s recipe from a fresh model until ``target`` (or ``max_epochs``); True if reached."""
    return rung_steps_to_target(row, config, data, model_fn, device, target, max_epochs, seed) is not None


def rung_steps_to_target(row: LadderRow, config: LadderConfig, data: ImageData, model_fn: Callable, device: str,
                         target: float, max_epochs: int, seed: int) -> int | None:
    """Train rung ``row``'s recipe from a fresh model until ``target`` (or ``max_epochs``); the optimizer steps it
    took, or None where it missed (steps are set by the seed; seconds are not)."""
    recipe = Recipe(**row.recipe)
    per_epoch = max(1, len(data.train) // recipe.global_batch)
    max_steps = max_epochs * per_epoch
    budget_steps = steps_for_budget(config.budget_epochs * len(data.train), recipe.global_batch, 1)
    run = rung_run(recipe, config, budget_steps, seed=seed).replace(lr=row.lr)   # at the LR the row was measured with
    seed_everything(run.seed)
    model = model_fn()
    loader = train_loader(data.train, recipe, run.seed, device)                  # the data is touched from here
    cfg = train_config(recipe, run, steps=max_steps, warmup_steps=0, device=device)
    with fp32_math_of(run):
        steps, _, _ = reach_target(model, loader, cfg, validation_batches(data, device), target,
                                   max(1, per_epoch // EVALS_PER_EPOCH), eval_model=model)
    return steps


def rungs_to_target(result: LadderResult, config: LadderConfig, data: ImageData, *, target: float,
                    seeds: Sequence[int], rungs: Sequence[int] | None = None, max_epochs: int = 10,
                    model_fn: Callable | None = None, device: str = "cpu") -> list[RungTime]:
    """Time each measured rung (default all; ``rungs`` picks some) to ``target`` over ``seeds``."""
    model_fn = model_fn or functools.partial(build_model, config.model, data.num_classes, tuple(data.image_shape))
    chosen = [r for r in result.rows if r.measured and (rungs is None or r.rung in rungs)]
    times = []
    for row in chosen:
        if (row.world_size or 1) > 1:
            times.append(RungTime(row.rung, row.title, row.batch_size, row.samples_per_s, None,
                                  "multi-process rung: its ranks do not stop together at the target"))
            continue
        run = functools.partial(run_rung_to_target, row, config, data, model_fn, device, target, max_epochs)
        times.append(RungTime(row.rung, row.title, row.batch_size, row.samples_per_s,
                              time_runs(lambda seed: run(seed=seed), seeds, f"rung {row.rung}")))
    return times


def winner(times: Sequence[RungTime]) -> RungTime | None:
    """The rung with the least olympic-mean time among those that reached the target (None if none did)."""
    done = [t for t in times if t.time is not None and t.time.reached]
    return min(done, key=lambda t: t.time.olympic_mean_s) if done else None


def fastest_per_sample(times: Sequence[RungTime]) -> RungTime:
    """The timed rung with the highest samples/s: the old ladder's crown."""
    return max((t for t in times if t.time is not None), key=lambda t: t.samples_per_s)


def time_table(times: Sequence[RungTime]) -> pd.DataFrame:
    """One row per rung: samples/s, each seed's seconds, olympic mean and spread, or why it was not timed."""
    rows = []
    for t in times:
        tt = t.time
        rows.append({"rung": t.rung, "title": t.title, "batch": t.batch_size, "samples/s": round(t.samples_per_s, 1),
                     "seconds per seed": "" if tt is None else ", ".join(
                         f"{s:.2f}" if math.isfinite(s) else "missed" for s in tt.times_s),
                     "olympic mean (s)": math.nan if tt is None else tt.olympic_mean_s,
                     "spread": math.nan if tt is None else tt.spread,
                     "note": t.reason or ("" if tt.reached else "missed the target: cannot win")})
    return pd.DataFrame(rows)


def airbench_blocker(config: LadderConfig, dataset: str, device: str, full_mode: bool) -> str | None:
    """Why the best rung's time to 94% on CIFAR-10 cannot be set against airbench's figure here (None: it can)."""
    if not full_mode or not device.startswith("cuda"):
        return "airbench's figure is for one A100 GPU in full mode; this run is on a CPU in fast mode"
    if dataset != "cifar10":
        return f"airbench's figure is for CIFAR-10; this ladder trained on {dataset}"
    if config.train_limit is not None:
        return (f"the ladder trains on {config.train_limit:,} of CIFAR-10's 50,000 images, too few for 94%: run "
                "LadderConfig.full(train_limit=None)")
    return None
