"""Published data-parallel scaling points, each traced to a primary source (``data/published_scaling.csv``).

Today that is Goyal et al. 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
arXiv:1706.02677, abstract): ~90% scaling efficiency from 8 to 256 GPUs. Every row names its reference and
how any derived number was derived.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes

from labkit.core.data import verify_data_file

PUBLISHED_FILE = "published_scaling.csv"


def load_published_scaling() -> pd.DataFrame:
    """The cited published scaling points (``data/published_scaling.csv``, checksum verified)."""
    return pd.read_csv(verify_data_file(PUBLISHED_FILE), comment="#")


def plot_published_scaling(df: pd.DataFrame | None = None, ax: Axes | None = None) -> Axes:
    """Published speedups over each paper's baseline against ideal linear scaling (log-log)."""
    df = load_published_scaling() if df is None else df
    ax = ax or plt.subplots(figsize=(5, 4))[1]
    scale = df["workers"] / df["baseline_workers"]
    top = float(scale.max())
    ax.plot([1, top], [1, top], "k--", lw=1, label="ideal (linear)")
    for (source, setup), group in df.assign(scale=scale).groupby(["source", "setup"]):
        ax.plot(group["scale"], group["speedup_vs_baseline"], "o-", label=f"{setup}\n({source})")
    ax.set(xlabel="workers / baseline workers", ylabel="speedup over baseline", xscale="log", yscale="log",
           title="Published data-parallel scaling")
    ax.legend(fontsize=7)
    return ax

