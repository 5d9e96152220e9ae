"""How one rung's recipe is trained and measured: its data path, its fp32 math mode, and the numbers kept.

Every recipe is trained by the instrumented loop (:func:`labkit.training.loop.train`) for the same number of samples, so
throughput *and* accuracy after a fixed budget compare like for like. Rungs before TF32 run strict IEEE fp32
(cuDNN would otherwise run fp32 convolutions in TF32 by default and credit the gain to other rungs).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

from labkit.core.contention import share_mark, share_since
from labkit.core.data import make_device_loader, validate_batch_size, validate_num_workers
from labkit.ladder.config import LadderConfig
from labkit.ladder.rungs import Recipe
from labkit.training.batch_rules import scaled_lr
from labkit.training.config import TrainConfig
from labkit.training.flops import checked_mfu, fp32_math_of, math_mode_of, peak_flops_per_s
from labkit.training.loop import RunResult, evaluate_accuracy, train
from labkit.training.run_spec import RunSpec

if TYPE_CHECKING:
    from labkit.core.device_loader import BatchLoader, DeviceLoader


@dataclass(frozen=True)
class Measurement:
    """What one recipe measured: throughput over the steady window, start-up cost, memory, accuracy."""

    samples_per_s: float
    step_time_s: float
    data_wait_fraction: float
    peak_mem_bytes: int | None
    flops_per_sample: float | None
    val_accuracy: float | None
    startup_s: float
    steps: int
    samples_trained: int
    math_mode: str = "fp32"          # 'fp32' (strict) | 'tf32' | 'bf16' | 'fp16': the peak MFU is taken against
    stopped_early: bool = False      # under SLOW_RUNG_FRACTION of its base's speed: stopped, accuracy not measured
    stop_cpu_share: float | None = None   # the CPU share this process got up to the look that stopped it


SLOW_RUNG_FRACTION = 0.5    # a rung under half its base recipe's speed cannot be carried forward: it stops early
SLOW_CHECK_STEPS = 10       # steady steps measured before a rung is judged that slow


def train_loader(dataset: Dataset, recipe: Recipe, seed: int, device: str = "cpu") -> DataLoader | DeviceLoader:
    """The recipe's training batches: a DataLoader, or (``device_data``) tensors held on ``device``.

    The DataLoader's shuffle has its own generator, so workers never change the order (a DataLoader draws its
    workers' base seed from ``generator`` whenever an iterator starts).
    """
    batch = validate_batch_size(recipe.batch_size, len(dataset))
    if recipe.device_data:
        return make_device_loader(dataset, batch, device=device, shuffle=True, drop_last=True, seed=seed)
    extra = {"prefetch_factor": recipe.prefetch_factor,
             "persistent_workers": recipe.persistent_workers} if validate_num_workers(recipe.num_workers) else {}
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=recipe.num_workers, drop_last=True,
                      pin_memory=recipe.pin_memory and torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(seed + 1), **extra)


def steps_for_budget(budget_samples: int, global_batch: int, min_steps: int) -> int:
    """Steps that train on ``budget_samples`` samples at ``global_batch`` (at least ``min_steps``)."""
    return max(min_steps, budget_samples // global_batch)


def summarise_run(result: RunResult, warmup_steps: int, sync_every_step: bool) -> tuple[float, float, float]:
    """(samples/s, step time s, start-up s) over the steady window, one estimator for every recipe.

    With per-step sync the window is the sum of steady step times; without it, the loop's own window
    rate (the only honest figure when steps are not synchronised). Start-up = the warm-up steps' excess
    over steady steps (compile time, worker start-up, first allocations).
    """
    records = list(result.steps)
    steady = records[warmup_steps:] or records
    if sync_every_step:
        samples_per_s = sum(r.samples for r in steady) / sum(r.step_time_s for r in steady)
    else:
        samples_per_s = float(result.samples_per_s_median)
    step_time_s = (sum(r.samples for r in steady) / len(steady)) / samples_per_s
    warm = records[:warmup_steps] if len(records) > warmup_steps else []
    startup_s = max(0.0, sum(r.step_time_s for r in warm) - len(warm) * step_time_s)
    return samples_per_s, step_time_s, startup_s


def run_spec(recipe: Recipe, *, lr: float = 0.05, seed: int = 0, lr_warmup_steps: int = 0) -> RunSpec:
    """The run a recipe describes (SGD, momentum 0.9): its batch, precision, memory format and compilation."""
    return RunSpec(batch_size=recipe.batch_size, lr=lr, precision=recipe.precision, tf32=recipe.tf32,
                   channels_last=recipe.channels_last, compile=recipe.compile, lr_warmup_steps=lr_warmup_steps,
                   seed=seed)


def rung_run(recipe: Recipe, config: LadderConfig, steps: int, *, seed: int | None = None) -> RunSpec:
    """The run a rung trains for ``steps``, made once: the recipe's batch, precision, format and compilation; the LR
    scaled linearly from ``config.lr`` at ``lr_ref_batch`` to the global batch, warmed up linearly over
    ``lr_warmup_fraction`` of the steps only when it was scaled up (Goyal et al. 2017, sections 2.1-2.2); the
    ladder's seed (``seed``: another)."""
    warm = int(steps * config.lr_warmup_fraction) if recipe.global_batch > config.lr_ref_batch else 0
    return run_spec(recipe, lr=scaled_lr(config.lr, recipe.global_batch, config.lr_ref_batch),
                    seed=config.seed if seed is None else seed, lr_warmup_steps=warm)


def train_config(recipe: Recipe, run: RunSpec, *, steps: int, warmup_steps: int, device: str) -> TrainConfig:
    """The loop's TrainConfig for a rung's run (also what the hardware ceiling is measured with)."""
    return TrainConfig(run=run, steps=steps, warmup_steps=warmup_steps, device=device,
                       sync_every_step=recipe.sync_every_step, evaluate=False, progress=False,
                       profile_model=not recipe.compile)   # FLOP probes would recompile a compiled model


def measure_model(model: nn.Module, loader: BatchLoader, val_loader: Iterable[tuple[torch.Tensor, torch.Tensor]] | None,
                  recipe: Recipe, run: RunSpec, *, steps: int, warmup_steps: int, device: str,
                  trainer: Callable[..., RunResult] | None = None, eval_model: nn.Module | None = None,
                  stop_below_sps: float | None = None) -> Measurement:
    """Train ``model`` as ``run`` (``recipe``'s rung, :func:`rung_run`) for ``steps`` in this process and measure it.

    Accuracy is read from ``eval_model`` (default ``model``): the plain module, never a compiled or DDP
    wrapper, so evaluation neither recompiles nor issues collectives. ``stop_below_sps``: stop once the steady
    steps run below it (:func:`slow_rung_check`); such a run keeps its throughput and has no accuracy.
    """
    cfg = train_config(recipe, run, steps=steps, warmup_steps=warmup_steps, device=device)
    extra, seen = {}, {"cpu_share": None}
    if stop_below_sps is not None and steps > warmup_steps + SLOW_CHECK_STEPS:
        cfg, extra, seen = slow_rung_check(cfg, stop_below_sps, steps)
    with fp32_math_of(run):                 # evaluation in the run's math too
        result = (trainer or train)(model, loader, cfg, **extra)
        stopped = bool(getattr(result, "stopped_early", False))
        acc = evaluate_accuracy(eval_model or model, val_loader, device) \
            if val_loader is not None and not stopped else None
    sps, step_s, startup_s = summarise_run(result, warmup_steps, recipe.sync_every_step)
    peak = result.peak_mem_bytes
    if peak is None and recipe.compile and torch.device(device).type == "cpu":
        peak = _memory_model_bytes(eval_model or model, loader, run)
    mode = getattr(result, "math_mode", None) or math_mode_of(run.precision, bool(run.tf32), torch.device(device).type)
    return Measurement(sps, step_s, float(result.data_wait_fraction), peak, result.flops_per_sample, acc,
                       startup_s, len(result.steps), sum(r.samples for r in result.steps), mode, stopped,
                       seen["cpu_share"] if stopped else None)


def slow_rung_check(cfg: TrainConfig, stop_below_sps: float, steps: int) -> tuple[TrainConfig, dict, dict]:
    """(config, train kwargs, what the look saw) that stop a run too slow even with the cores to itself.

    The look reads the timing marks back (a device sync on a GPU), so it comes once a third of the way in there,
    and after the first ``SLOW_CHECK_STEPS`` steady steps on a CPU, where reading back costs nothing. The steady
    steps' median rate is divided by the CPU share this process got since the run began (a neighbour that took
    half the core halves the rate, not the recipe's speed): only a rung under ``stop_below_sps`` after that
    stops, so a busy machine never throws away a rung that could have been kept. ``seen['cpu_share']`` holds
    the share of the last look.
    """
    first = cfg.warmup_steps + SLOW_CHECK_STEPS
    every = first if (cfg.device or "cpu").startswith("cpu") else max(first, steps // 3)
    since, seen = share_mark(), {"cpu_share": None}

    def check(record, progress) -> bool:
        steady = progress.records[cfg.warmup_steps:]
        if len(steady) < SLOW_CHECK_STEPS:
            return False
        seen["cpu_share"] = share = share_since(since).share
        return statistics.median(r.samples_per_s for r in steady) / share < stop_below_sps

    return dataclasses.replace(cfg, log_every=every), {"callback": check}, seen


def _memory_model_bytes(model, loader, run: RunSpec) -> int | None:
    """The memory model's training-memory estimate for the un-compiled module (CPU, compiled rung)."""
    try:
        x, _ = next(iter(loader))
        return int(run.memory_model(model, tuple(x.shape[1:])).predict(run.batch_size).total_bytes)
    except Exception:  # noqa: BLE001 - an estimate that cannot be made is reported as unknown
        return None


def mfu_of(flops_per_sample: float | None, samples_per_s: float, device: str, mode: str) -> float | None:
    """Model FLOPs utilisation against the peak of the math mode actually run, or None where it is unknown."""
    if flops_per_sample is None or not math.isfinite(samples_per_s):
        return None
    peak, note = peak_flops_per_s(device, mode)
    return checked_mfu(flops_per_sample * samples_per_s, peak, note)     # never above 100%: a wrong peak warns
