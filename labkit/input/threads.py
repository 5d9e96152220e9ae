"""Thread-setting sweep for PyTorch: ``torch.set_num_threads`` on this machine.

Intra-op threads split *one* operator (a big matmul) across cores. Torch can change its pool at any time,
so the sweep runs in this process; TensorFlow's pools are swept in fresh processes by ``labkit.tf.threads``,
which also defines the result table both sweeps return (``ThreadSweep``, torch-free there).
"""
from __future__ import annotations

from typing import Callable

import torch

from labkit.core.machine import cpu_count
from labkit.core.timing import time_fn
from labkit.core.validation import positive_ints
from labkit.tf.threads import ThreadSweep, add_speedups


def default_thread_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the core count, plus the core count and twice it (oversubscribed)."""
    cores = cores or cpu_count()
    counts = {1, cores, 2 * cores}
    n = 2
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


def torch_matmul(size: int = 512) -> Callable[[], object]:
    """A compute-bound workload: one (size x size) float32 matmul."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    return lambda: a @ b


def sweep_torch_threads(thread_counts: list[int] | None = None, *, fn: Callable[[], object] | None = None,
                        size: int = 512, warmup: int = 2, repeats: int = 7) -> ThreadSweep:
    """Time ``fn`` (default: a matmul) under each ``torch.set_num_threads`` value; restores the old value."""
    counts = default_thread_counts() if thread_counts is None else thread_counts
    counts = positive_ints(counts, "thread_counts")
    fn = fn or torch_matmul(size)
    before, rows = torch.get_num_threads(), []
    try:
        for n in counts:
            torch.set_num_threads(n)
            t = time_fn(fn, warmup=warmup, repeats=repeats, device="cpu")
            rows.append({"setting": f"{n} threads", "intra": n, "inter": None, "median_s": t.median_s,
                         "p10_s": t.p10_s, "p90_s": t.p90_s})
    finally:
        torch.set_num_threads(before)
    return ThreadSweep("torch", add_speedups(rows), cpu_count(), f"{size}x{size} matmul" if size else "custom")
