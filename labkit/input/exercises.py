"""Checked exercises for notebook 04: how many loader workers hide the loading, and threads per worker.

The worker count is checked against its formula and then measured: the same slow dataset is loaded with no
workers and with the learner's count (``input.loaders.benchmark_loader``), and the data wait of both is shown.
"""
from __future__ import annotations

import math
import random
import warnings

import torch
from torch.utils.data import TensorDataset

from labkit.core.exercises import Exercise, Mistake
from labkit.input.loaders import ExpensiveTransform, LoaderConfig, TransformedDataset, benchmark_loader, \
    simulated_step

MEASURE_DELAY_S, MEASURE_BATCH, MEASURE_STEP_S = 0.004, 8, 0.012
MAX_MEASURED_WORKERS = 8


def workers_reference(load_s_per_batch: float, step_s: float) -> int:
    """Fewest workers whose combined loading keeps up with the steps: ceil(load / step), at least 1."""
    return max(1, math.ceil(load_s_per_batch / step_s - 1e-9))


def _worker_cases(seed: int = 16) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"load_s_per_batch": 0.03, "step_s": 0.01}, {"load_s_per_batch": 0.005, "step_s": 0.02}]
    return cases + [{"load_s_per_batch": round(rng.uniform(0.001, 0.2), 4), "step_s": round(rng.uniform(0.005, 0.05), 4)}
                    for _ in range(8)]


def measure_wait(workers: object) -> str:
    """Load a slow dataset with no workers and with the learner's count; report the data wait of each."""
    n = min(MAX_MEASURED_WORKERS, int(workers(load_s_per_batch=MEASURE_DELAY_S * MEASURE_BATCH, step_s=MEASURE_STEP_S)))
    base = TensorDataset(torch.zeros(8 * MEASURE_BATCH, 4), torch.zeros(8 * MEASURE_BATCH, dtype=torch.long))
    data = TransformedDataset(base, ExpensiveTransform(MEASURE_DELAY_S, "io"))
    waits = {}
    for k in (0, n):
        config = LoaderConfig(num_workers=k, prefetch_factor=2 if k else None)
        with warnings.catch_warnings():   # sleeping 'io' workers need no core each: torch's core-count warning
            warnings.simplefilter("ignore", UserWarning)
            result = benchmark_loader(data, config, batch_size=MEASURE_BATCH, epochs=1,
                                      step_fn=simulated_step(MEASURE_STEP_S))
        waits[k] = result.data_wait_fraction
    return (f"loading {MEASURE_DELAY_S * MEASURE_BATCH * 1e3:.0f} ms/batch, step {MEASURE_STEP_S * 1e3:.0f} ms: "
            f"data wait {100 * waits[0]:.0f}% of the run with 0 workers, {100 * waits[n]:.0f}% with {n} "
            "(worker start-up included)")


WORKERS = Exercise(
    "loader_workers", "the fewest DataLoader workers whose loading keeps up with the training step",
    workers_reference, _worker_cases,
    (Mistake("floor", lambda load_s_per_batch, step_s: max(1, math.floor(load_s_per_batch / step_s)),
             "round UP: 2.5 workers' worth of loading needs 3 workers, or the step waits every few batches"),
     Mistake("zero_allowed", lambda load_s_per_batch, step_s: math.ceil(load_s_per_batch / step_s - 1e-9)
             if load_s_per_batch > step_s else 0,
             "with 0 workers the loading runs in the training process, between the steps: even fast loading then "
             "adds to every step; one worker overlaps it"),
     Mistake("inverted", lambda load_s_per_batch, step_s: max(1, math.ceil(step_s / load_s_per_batch)),
             "each worker delivers one batch per load time; you need load/step of them to deliver one per step")),
    "each worker delivers a batch every load_s_per_batch; you need one batch every step_s",
    measure=measure_wait)


def threads_reference(cores: int, workers: int) -> int:
    """Intra-op threads per process so that the training process and its workers do not oversubscribe the
    cores: cores // (workers + 1), at least 1."""
    return max(1, cores // (workers + 1))


def _thread_cases(seed: int = 17) -> list[dict]:
    rng = random.Random(seed)
    return [{"cores": 2, "workers": 1}] + [{"cores": rng.choice([2, 4, 8, 16, 32, 64]), "workers": rng.randint(0, 12)}
                                           for _ in range(9)]


THREADS = Exercise(
    "threads_per_process", "torch threads per process when the training process runs beside W loader workers",
    threads_reference, _thread_cases,
    (Mistake("all_cores", lambda cores, workers: cores, "every process taking all cores oversubscribes them "
             "W+1 times over: threads then wait for each other (the thread sweep's right-hand side)"),
     Mistake("forgot_trainer", lambda cores, workers: max(1, cores // max(1, workers)),
             "count the training process too: W workers + 1 trainer share the cores"),
     Mistake("zero", lambda cores, workers: cores // (workers + 1), "never fewer than 1 thread")),
    "share the cores among the W workers and the training process, at least one thread each")
