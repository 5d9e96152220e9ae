"""Checked exercises for notebook 07: the speed-up of R data-parallel replicas and the time a ring all-reduce takes
(T_sync), from the cost model (:mod:`labkit.parallel.data.costmodel`).
"""
from __future__ import annotations

import random

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.data.costmodel import predicted_speedup, sync_time_s

# ------------------------------------------------------------------------------------ 07: replicas
def speedup_reference(t_comp_s: float, t_sync_s: float, world_size: int) -> float:
    """Epoch-time speed-up of R replicas over one: R T_comp / (T_comp + T_sync) (``costmodel``)."""
    return predicted_speedup(t_comp_s, t_sync_s, world_size)


def _speedup_cases(seed: int = 12) -> list[dict]:
    rng = random.Random(seed)
    return [{"t_comp_s": rng.uniform(0.01, 1.0), "t_sync_s": rng.uniform(0.0, 1.0), "world_size": rng.randint(2, 64)}
            for _ in range(10)]


SPEEDUP = Exercise(
    "speedup", "the speed-up of R synchronous replicas, each step T_comp of compute then T_sync of all-reduce",
    speedup_reference, _speedup_cases,
    (Mistake("ignores_sync", lambda t_comp_s, t_sync_s, world_size: float(world_size),
             "R replicas do R batches per step, but every step now also waits T_sync: R T_comp / (T_comp + T_sync)"),
     Mistake("no_r", lambda t_comp_s, t_sync_s, world_size: t_comp_s / (t_comp_s + t_sync_s),
             "each step of R replicas processes R batches: multiply by R"),
     Mistake("sync_times_r", lambda t_comp_s, t_sync_s, world_size:
             world_size * t_comp_s / (t_comp_s + world_size * t_sync_s),
             "T_sync is the all-reduce's time for the whole step, paid once per step, not once per replica")),
    "time for R batches alone: R T_comp; with R replicas: T_comp + T_sync")


def ring_sync_time_reference(nbytes: int, world_size: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """T_sync of a ring all-reduce, alpha-beta model: 2(R-1) alpha + 2(R-1)/R N / bandwidth (``costmodel``)."""
    return sync_time_s(nbytes, world_size, latency_s, bandwidth_bytes_per_s, algorithm="ring")


def _sync_cases(seed: int = 13) -> list[dict]:
    rng = random.Random(seed)
    return [{"nbytes": 4 * rng.randint(1, 25_000_000), "world_size": rng.randint(2, 64),
             "latency_s": rng.choice([5e-6, 2e-5, 1e-4]), "bandwidth_bytes_per_s": rng.choice([1e9, 12.5e9, 4.5e11])}
            for _ in range(10)]


RING_SYNC_TIME = Exercise(
    "ring_sync_time_s", "T_sync of a ring all-reduce of N gradient bytes: latency alpha per step, bandwidth B",
    ring_sync_time_reference, _sync_cases,
    (Mistake("one_phase", lambda nbytes, world_size, latency_s, bandwidth_bytes_per_s:
             (world_size - 1) * (latency_s + nbytes / world_size / bandwidth_bytes_per_s),
             "reduce-scatter AND all-gather: 2(R-1) steps, not R-1"),
     Mistake("whole_buffer", lambda nbytes, world_size, latency_s, bandwidth_bytes_per_s:
             2 * (world_size - 1) * (latency_s + nbytes / bandwidth_bytes_per_s),
             "each ring step moves one chunk of N/R bytes, not all N")),
    "2(R-1) steps, each paying alpha plus one chunk of N/R bytes at the bandwidth")


def speedup_cases_for(t_comp_s: float, t_sync_s: float, world_size: int) -> list[dict]:
    """The notebook's measured T_comp and T_sync first, then random cases."""
    return [{"t_comp_s": float(t_comp_s), "t_sync_s": float(t_sync_s), "world_size": world_size}] + _speedup_cases()
