"""The performance model: when do R data-parallel replicas beat one?

One epoch of N samples at per-replica batch B takes ``(N/B) * T_comp`` on one worker and
``(N/(R*B)) * (T_comp + T_sync)`` on R replicas, so replicas pay when ``T_sync < (R-1) * T_comp``;
hence "the per-worker workload must be large" (Goyal et al. 2017, "Accurate, Large Minibatch SGD",
abstract). ``T_sync`` comes from the alpha-beta cost of an all-reduce of the
gradient bytes (``labkit.comm.collectives.allreduce_cost``; Patarasuk & Yuan 2009 for the ring).
On a CPU box with fewer cores than replicas the replicas share cores, so ``T_comp`` grows by
``R * threads / cores``: the model says so rather than hiding it.

Model parallelism has its own cost, the pipeline bubble: its formula lives with the pipeline
(:func:`labkit.parallel.pipeline.schedule_sim.predicted_bubble`).
"""
from __future__ import annotations

import numbers
from typing import Sequence

import numpy as np

from labkit.comm.collectives import allreduce_cost
from labkit.core.validation import positive_int, positive_number


def epoch_time_s(n_samples: int, batch: int, t_comp_s: float, t_sync_s: float = 0.0, world_size: int = 1) -> float:
    """Epoch time: (N/B)*T_comp alone, (N/(R*B))*(T_comp + T_sync) with R replicas."""
    n_samples, batch = positive_int(n_samples, "n_samples"), positive_int(batch, "batch")
    world_size, t_comp_s = positive_int(world_size, "world_size"), positive_number(t_comp_s, "t_comp_s")
    _check_sync_time(t_sync_s)
    if world_size == 1:
        return n_samples / batch * t_comp_s
    return n_samples / (world_size * batch) * (t_comp_s + t_sync_s)


def predicted_speedup(t_comp_s: float, t_sync_s: float, world_size: int, compute_slowdown: float = 1.0) -> float:
    """Epoch-time ratio alone / with R replicas: R*T_comp / (slowdown*T_comp + T_sync)."""
    world_size = positive_int(world_size, "world_size")
    if world_size == 1:
        return 1.0
    return world_size * t_comp_s / (compute_slowdown * t_comp_s + t_sync_s)


def pays_off(t_comp_s: float, t_sync_s: float, world_size: int) -> bool:
    """True when R replicas beat one: T_sync < (R-1) * T_comp."""
    return t_sync_s < (world_size - 1) * t_comp_s


def sync_time_s(nbytes: int, world_size: int, latency_s: float, bandwidth_bytes_per_s: float,
                algorithm: str = "ring") -> float:
    """T_sync of an all-reduce of ``nbytes`` gradients: the alpha-beta model with beta = 1/bandwidth."""
    world_size = positive_int(world_size, "world_size")
    bandwidth_bytes_per_s = positive_number(bandwidth_bytes_per_s, "bandwidth_bytes_per_s",
                                            hint="e.g. 10e9 for 10 GB/s")
    return allreduce_cost(algorithm, world_size, int(nbytes), latency_s, 1.0 / bandwidth_bytes_per_s)


def core_sharing_slowdown(world_size: int, cores: int, threads_per_rank: int = 1) -> float:
    """How much slower each replica computes when R*threads exceed the cores (1.0 when they fit)."""
    world_size, cores = positive_int(world_size, "world_size"), positive_int(cores, "cores")
    threads_per_rank = positive_int(threads_per_rank, "threads_per_rank")
    return max(1.0, world_size * threads_per_rank / cores)


def fit_alpha_beta(sizes_bytes: Sequence[int], times_s: Sequence[float], world_size: int,
                   algorithm: str = "ring") -> tuple[float, float]:
    """Least-squares latency alpha (s) and inverse bandwidth beta (s/byte) from all-reduce timings."""
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(times_s, dtype=float)
    if len(sizes) < 2 or len(sizes) != len(times):
        raise ValueError("need at least two (size, time) pairs of equal length to fit alpha and beta")
    if positive_int(world_size, "world_size") < 2:
        return 0.0, 0.0
    # the model is linear in (alpha, beta): cost = a_coef*alpha + b_coef(n)*beta
    a_coef = np.array([allreduce_cost(algorithm, world_size, int(n), 1.0, 0.0) for n in sizes])
    b_coef = np.array([allreduce_cost(algorithm, world_size, int(n), 0.0, 1.0) for n in sizes])
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([a_coef, b_coef], 1), times, rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def _check_sync_time(t_sync_s: float) -> None:
    """T_sync may be 0 (one replica, or a free link) but never negative."""
    if isinstance(t_sync_s, bool) or not isinstance(t_sync_s, numbers.Real) or not t_sync_s >= 0:
        raise ValueError(f"t_sync_s must be a number >= 0, got {t_sync_s!r}")

