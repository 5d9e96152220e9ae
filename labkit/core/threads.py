"""Torch's intra-op threads matched to the CPUs that are free now, for a long CPU run on a shared machine.

The kit starts torch with one intra-op thread per CPU the process may use (:func:`labkit.core.machine.cpu_count`)
and ``OMP_WAIT_POLICY=PASSIVE``. That is not enough once a neighbour holds one of those CPUs: some of oneDNN's
CPU kernels (the bf16 and channels_last convolutions among them) make their threads wait for each other in
spinning barriers that no OpenMP setting reaches, so a thread whose partner was descheduled burns its core
waiting. On the 2-core CI box with one core busy, notebook 10's bf16 + channels_last rung took 57 s with two
threads and 2.8 s with one (issue 22). Notebook 04 measures the same effect on a ResNet-18 step.
:func:`matched_threads` looks how idle the allowed CPUs are for a moment, runs the block with that many threads
and restores the pool afterwards.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from labkit.core.machine import cpu_count, idle_cpus


@dataclass(frozen=True)
class ThreadFit:
    """What :func:`matched_threads` saw and chose: ``threads`` for ``idle`` free CPUs of the ``allowed`` ones."""

    threads: int
    allowed: int
    idle: float | None           # None: not measured (a GPU run keeps the pool as it is)
    before: int

    def describe(self) -> str:
        """One line for a result's notes."""
        if self.idle is None:
            return f"intra-op threads left at {self.threads} (the work runs on the GPU)"
        return (f"intra-op threads: {self.threads} of the {self.allowed} CPU(s) this process may use; other programs "
                f"left {self.idle:.1f} of them idle when the run began (threads matched to the free CPUs: "
                f"notebook 04 shows what an oversubscribed pool costs on a busy core)")


def free_cpu_count(allowed: int | None = None, idle: float | None = None, window_s: float = 0.3) -> tuple[int, float]:
    """(CPUs free for this process, measured idle CPUs): the idle ones, rounded half up, at least 1, at most allowed."""
    allowed = cpu_count() if allowed is None else allowed
    idle = idle_cpus(window_s) if idle is None else idle
    return max(1, min(allowed, math.floor(idle + 0.5))), idle


@contextmanager
def matched_threads(device: str | torch.device = "cpu", window_s: float = 0.3) -> Iterator[ThreadFit]:
    """Run the block with torch's intra-op pool sized to the CPUs free now (CPU only); restore it after."""
    before = torch.get_num_threads()
    if torch.device(device).type != "cpu":
        yield ThreadFit(before, cpu_count(), None, before)
        return
    threads, idle = free_cpu_count(window_s=window_s)
    torch.set_num_threads(threads)
    try:
        yield ThreadFit(threads, cpu_count(), idle, before)
    finally:
        torch.set_num_threads(before)
