"""The all-reduce benchmark's rows for a notebook: a pandas DataFrame, and busbw plotted against message size.

Kept apart from :mod:`labkit.comm.bench` because every rank of a benchmark imports that module (it holds the
function the ranks run), and the ranks need neither pandas nor matplotlib.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Sequence

import matplotlib.pyplot as plt
import pandas as pd

from labkit.comm.bench import BenchRow


def rows_to_dataframe(rows: Sequence[BenchRow]) -> pd.DataFrame:
    """The rows as a pandas DataFrame (one column per BenchRow field)."""
    return pd.DataFrame([asdict(r) for r in rows])


def plot_busbw(rows: Sequence[BenchRow], ax: plt.Axes | None = None) -> plt.Axes:
    """busbw (GB/s) against message size, one line per (world size, backend); returns the axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    groups: dict[tuple[int, str], list[BenchRow]] = {}
    for r in rows:
        groups.setdefault((r.world_size, r.backend), []).append(r)
    for (world, backend), group in sorted(groups.items()):
        group = sorted(group, key=lambda r: r.size_bytes)
        ax.plot([r.size_bytes for r in group], [r.busbw_gb_s for r in group], marker="o",
                label=f"{world} ranks, {backend}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all_reduce busbw = S/t x 2(n-1)/n (nccl-tests)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax
