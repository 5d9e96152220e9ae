"""Checked exercises for notebooks 00-02: throughput from step times, data wait, busy time, Adam memory, LR.

Each reference is the kit's own implementation or a few lines next to it; each :class:`Mistake` is the wrong
answer learners typically write. The notebook shows a stub, and ``ExerciseBook.check`` judges it.
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Callable

import torch
from torch import nn

from labkit.core.exercises import Exercise, Mistake, tolerance
from labkit.memory.model import MemoryModel
from labkit.training.batch_rules import scaled_lr
from labkit.training.config import TrainConfig
from labkit.training.run_spec import RunSpec
from labkit.training.stepper import Stepper, warmup_factor
from labkit.training.target_exercises import CRITICAL_BATCH, NOISE_SCALE  # noqa: F401 - notebook 02b's, checked as ex.*


# ------------------------------------------------------------------------------------ 00: samples per second
def samples_per_s_reference(step_times_s: list[float], batch_size: int, warmup_steps: int) -> float:
    """Throughput of the steady state: batch / median step time after the warm-up (as ``training.loop``)."""
    return batch_size / statistics.median(step_times_s[warmup_steps:])


def _step_time_cases(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        warm = rng.randint(1, 3)
        steady = [rng.uniform(0.01, 0.02) for _ in range(rng.randint(5, 12))]
        cases.append({"step_times_s": [rng.uniform(0.2, 1.0) for _ in range(warm)] + steady,
                      "batch_size": rng.choice([16, 32, 64]), "warmup_steps": warm})
    return cases


SAMPLES_PER_S = Exercise(
    "samples_per_s", "samples/s of the steady state from per-step times (skip the warm-up, take the median)",
    samples_per_s_reference, _step_time_cases,
    (Mistake("mean_with_warmup", lambda step_times_s, batch_size, warmup_steps:
             batch_size / statistics.mean(step_times_s), "the first steps pay for allocation and autotuning: drop "
             "the warm-up steps, and use the median so one slow step does not move the answer"),
     Mistake("median_with_warmup", lambda step_times_s, batch_size, warmup_steps:
             batch_size / statistics.median(step_times_s), "skip the first `warmup_steps` steps before the median"),
     Mistake("mean_after_warmup", lambda step_times_s, batch_size, warmup_steps:
             batch_size / statistics.mean(step_times_s[warmup_steps:]), "use the median of the steady steps, "
             "not the mean: a single hiccup (another process, a page fault) should not move the figure")),
    "samples/s = batch_size / (typical time of one steady step)")


# ------------------------------------------------------------------------------------ 01: data wait, busy time
def data_wait_fraction_reference(wait_s: float, compute_s: float) -> float:
    """Share of the step the accelerator waits for data: wait / (wait + compute) (as ``LoaderResult``)."""
    return wait_s / (wait_s + compute_s)


def _wait_cases(seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"wait_s": rng.uniform(0.0, 2.0), "compute_s": rng.uniform(0.1, 2.0)} for _ in range(8)]


DATA_WAIT = Exercise(
    "data_wait_fraction", "the share of each step spent waiting for the next batch, from the phase times",
    data_wait_fraction_reference, _wait_cases,
    (Mistake("ratio", lambda wait_s, compute_s: wait_s / compute_s, "divide by the whole step (wait + compute), "
             "not by the compute alone: a share of the step lies between 0 and 1"),
     Mistake("complement", lambda wait_s, compute_s: compute_s / (wait_s + compute_s), "that is the busy share; "
             "the question asks for the waiting share")),
    "wait share = time waiting / time of the whole step")


def busy_fraction_reference(kernels: list[tuple[float, float]], window_s: float) -> float:
    """What NVML's 'utilization' reports: the share of the window in which at least one kernel ran (interval
    union, as ``profile.traces.gpu_busy_s``), however few cores each kernel used."""
    busy, end_so_far = 0.0, 0.0
    for start, end in sorted((max(0.0, s), min(window_s, e)) for s, e in kernels):
        if end > end_so_far:
            busy += end - max(start, end_so_far)
            end_so_far = end
    return busy / window_s


def _kernel_cases(seed: int = 2) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        starts = sorted(round(rng.uniform(0, 0.9), 3) for _ in range(rng.randint(3, 8)))
        cases.append({"kernels": [(s, round(s + rng.uniform(0.01, 0.3), 3)) for s in starts], "window_s": 1.0})
    return cases


BUSY_FRACTION = Exercise(
    "busy_fraction", "GPU 'utilization' as NVML samples it: the share of a window in which any kernel was running",
    busy_fraction_reference, _kernel_cases,
    (Mistake("sum_of_durations", lambda kernels, window_s: sum(e - s for s, e in kernels) / window_s,
             "kernels overlap (streams): adding their durations counts the overlap twice and can exceed 100%; "
             "merge the intervals first"),
     Mistake("first_to_last", lambda kernels, window_s: (max(e for _, e in kernels) - min(s for s, _ in kernels))
             / window_s, "the gaps between kernels are idle: count only time covered by some kernel")),
    "merge overlapping (start, end) intervals, add their lengths, divide by the window")


# ------------------------------------------------------------------------------------ 02: Adam memory, LR
def adam_step_bytes_reference(num_params: int, saved_activation_bytes: int, bytes_per_value: int = 4) -> int:
    """Parameters + gradients + Adam's two moments + saved activations: the kit's memory model's parts."""
    model = MemoryModel(param_bytes=num_params * bytes_per_value, param_elements=num_params, optimizer="adam",
                        activation_bytes_per_sample=saved_activation_bytes, activation_fixed_bytes=0.0,
                        param_dtype={2: "bfloat16", 4: "float32", 8: "float64"}[bytes_per_value])
    parts = model.predict(1)
    return parts.params_bytes + parts.grads_bytes + parts.optimizer_bytes + parts.activations_bytes


def _adam_cases(seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    return [{"num_params": rng.randint(10_000, 20_000_000), "saved_activation_bytes": rng.randint(0, 10**9),
             "bytes_per_value": rng.choice([2, 4])} for _ in range(8)]


ADAM_STEP_BYTES = Exercise(
    "adam_step_bytes", "bytes of one Adam training step: parameters, gradients, optimizer state, saved activations",
    adam_step_bytes_reference, _adam_cases,
    (Mistake("adam_state_once", lambda num_params, saved_activation_bytes, bytes_per_value=4:
             3 * num_params * bytes_per_value + saved_activation_bytes, "you counted 3 values per parameter: "
             "weight, gradient AND two Adam moments (first and second, Kingma & Ba 2015) make 4"),
     Mistake("no_optimizer_state", lambda num_params, saved_activation_bytes, bytes_per_value=4:
             2 * num_params * bytes_per_value + saved_activation_bytes, "Adam keeps state too: two moments per "
             "parameter, as large as the weights each"),
     Mistake("no_activations", lambda num_params, saved_activation_bytes, bytes_per_value=4:
             4 * num_params * bytes_per_value, "the activations saved for the backward pass live through the "
             "step as well")),
    "4 values per parameter (weight, gradient, 2 Adam moments) x bytes per value, plus the saved activations")


def warmup_lr_reference(step: int, base_lr: float, base_batch: int, batch_size: int, warmup_steps: int) -> float:
    """LR at ``step``: the linear-scaled LR (Goyal et al. 2017, 2.1) times the kit's warm-up ramp (2.2)."""
    return scaled_lr(base_lr, batch_size, base_batch) * warmup_factor(step, warmup_steps)


def _lr_cases(seed: int = 4) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(10):
        n = rng.randint(2, 10)
        cases.append({"step": rng.randint(0, 2 * n), "base_lr": rng.choice([0.01, 0.05, 0.1]), "base_batch": 32,
                      "batch_size": rng.choice([64, 128, 256, 512]), "warmup_steps": n})
    return cases + [{"step": 0, "base_lr": 0.1, "base_batch": 32, "batch_size": 256, "warmup_steps": 5}]


def _no_warmup(step: int, base_lr: float, base_batch: int, batch_size: int, warmup_steps: int) -> float:
    return scaled_lr(base_lr, batch_size, base_batch)


def _ramp_from_zero(step: int, base_lr: float, base_batch: int, batch_size: int, warmup_steps: int) -> float:
    return scaled_lr(base_lr, batch_size, base_batch) * min(1.0, step / warmup_steps)


def lr_in_training(lr_at_step: Callable[..., float], base_lr: float = 0.05, base_batch: int = 32,
                   batch_size: int = 128, warmup_steps: int = 4) -> str:
    """Train a tiny model with the kit's own step (``training.stepper``) and set the LR it used at each step
    beside the learner's function."""
    lr = scaled_lr(base_lr, batch_size, base_batch)
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    run = RunSpec(lr=lr, momentum=0.0, lr_warmup_steps=warmup_steps, batch_size=batch_size)
    config = TrainConfig(steps=warmup_steps + 2, run=run, progress=False, profile_model=False, evaluate=False)
    optimizer = run.build_optimizer(model)
    stepper = Stepper(model, optimizer, config, torch.device("cpu"))
    batch = (torch.randn(batch_size, 8), torch.randint(0, 3, (batch_size,)))
    used, yours = [], []
    for i in range(warmup_steps + 2):
        stepper.step(i, batch)
        used.append(optimizer.param_groups[0]["lr"])
        yours.append(lr_at_step(step=i, base_lr=base_lr, base_batch=base_batch, batch_size=batch_size,
                                warmup_steps=warmup_steps))
    agree = all(math.isclose(a, b, rel_tol=tolerance(WARMUP_LR)) for a, b in zip(used, yours))  # as the check judges
    return (f"training batch {batch_size} from a recipe tuned at {base_batch}, the kit's loop set LR "
            f"{', '.join(f'{v:.4g}' for v in used)} at steps 0-{warmup_steps + 1}; "
            + ("your function gives the same" if agree else f"yours gives {', '.join(f'{v:.4g}' for v in yours)}"))


WARMUP_LR = Exercise(
    "warmup_lr", "the LR at a step for a new batch size: linear scaling, then a linear warm-up from 1/10",
    warmup_lr_reference, _lr_cases,
    (Mistake("no_warmup", _no_warmup, "during the first `warmup_steps` steps the LR ramps up linearly from a "
             "tenth of the scaled LR; only after that is it the full scaled LR"),
     Mistake("ramp_from_zero", _ramp_from_zero, "the kit's ramp starts at 1/10 of the target, not at 0 "
             "(a zero LR wastes the first step): factor = 0.1 + 0.9 * step / warmup_steps"),
     Mistake("unscaled", lambda step, base_lr, base_batch, batch_size, warmup_steps:
             base_lr * warmup_factor(step, warmup_steps), "scale the LR with the batch first: "
             "lr = base_lr * batch_size / base_batch")),
    "lr = base_lr * batch_size / base_batch, times 0.1 + 0.9 * step / warmup_steps while step < warmup_steps",
    measure=lr_in_training)


def adam_cases_for(num_params: int, saved_activation_bytes: int) -> list[dict]:
    """The notebook's own model first (its counted parameters and saved activations), then random cases."""
    return [{"num_params": int(num_params), "saved_activation_bytes": int(saved_activation_bytes),
             "bytes_per_value": 4}] + _adam_cases()[:4]


def steady_cases_for(step_times_s: list[float], batch_size: int, warmup_steps: int) -> list[dict]:
    """The notebook's measured step times first (when usable), then random cases."""
    usable = math.isfinite(sum(step_times_s)) and len(step_times_s) > warmup_steps
    extra = [{"step_times_s": list(step_times_s), "batch_size": batch_size, "warmup_steps": warmup_steps}]
    return (extra if usable else []) + _step_time_cases()
