"""Facts about this machine: cores, memory, installed packages, and the thread settings that fit them.

Torch-free, so TensorFlow-only child processes size their thread pools with the same core count as the rest
of the kit. :func:`cpu_count` is the one place the kit sizes intra-op threads, DataLoader workers and rank
counts from: the CPUs this process may use (its affinity mask and its cgroup's CPU quota, as on Binder and in
containers), never ``os.cpu_count()``, which counts the whole host.
"""
from __future__ import annotations

import importlib
import math
import os
from importlib import metadata
from pathlib import Path

import psutil

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))
# OpenMP threads that finish their share of an operator spin for the next one by default. With a neighbour on
# one of two cores, the spinning thread steals the core its partner needs: the ResNet-18 step measured 1.1-3.7 s
# instead of 0.14-0.27 s with one thread (issue 22). PASSIVE makes idle threads sleep; set before torch loads.
THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def cgroup_cpu_limit(cpu_max: Path = CGROUP_V2_CPU_MAX,
                     v1_files: tuple[Path, Path] = CGROUP_V1_QUOTA) -> float | None:
    """CPUs the cgroup quota allows (quota / period, e.g. 1.5), or None when there is no quota."""
    try:
        quota, _, period = cpu_max.read_text().strip().partition(" ")
        if quota != "max":
            return int(quota) / int(period or 100_000)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(f.read_text().strip()) for f in v1_files)
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def affinity_cpu_count() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count where there is none, as on macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def cpu_count(affinity: int | None = None, quota: float | None = None) -> int:
    """Cores this process may use: the affinity mask, capped by the cgroup quota rounded up (at least 1)."""
    cores = affinity if affinity is not None else affinity_cpu_count()
    limit = quota if quota is not None else cgroup_cpu_limit()
    return max(1, min(cores, math.ceil(limit)) if limit else cores)


def fit_threads_to_machine(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set the OpenMP settings the kit runs with (unless the user set them) in ``env`` -> what was set.

    Must run before torch loads (``import labkit`` does it); ``OMP_NUM_THREADS`` becomes :func:`cpu_count`, so
    torch's intra-op pool matches the CPUs the quota allows, not the host's core count.
    """
    env = os.environ if env is None else env
    wanted = {**THREAD_ENV, "OMP_NUM_THREADS": str(cpu_count())}
    chosen = {k: v for k, v in wanted.items() if k not in env}
    env.update(chosen)
    return chosen


def idle_cpus(window_s: float = 0.3) -> float:
    """CPUs of this process's affinity mask that every program together left idle over ``window_s`` (this
    process sleeps meanwhile, so it measures the neighbours): 1.0 on a 2-core box with one core busy."""
    per_cpu = psutil.cpu_percent(interval=window_s, percpu=True)
    try:
        allowed = [c for c in os.sched_getaffinity(0) if c < len(per_cpu)]
    except AttributeError:  # macOS
        allowed = list(range(len(per_cpu)))
    return sum(1.0 - per_cpu[c] / 100.0 for c in allowed)


def total_ram_bytes() -> int:
    """Physical memory of the machine."""
    return int(psutil.virtual_memory().total)


def package_version(name: str) -> str | None:
    """Installed version of a package, or None when it is missing."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def module_importable(module: str) -> bool:
    """True when ``import module`` works."""
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False
