"""The figures of notebook 15, drawn from the objects the runs returned: which experts sit on which rank and the
token-copies each received, and tokens per expert before and after training with the load-balancing loss.

Kept apart from the runs because every rank imports those modules, and a rank has no use for matplotlib.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes


def plot_placement(ranks: list[dict], ax: Axes | None = None, title: str = "") -> Axes:
    """Bars: token-copies each expert computed, coloured by the rank that holds it (expert e on rank e // (E/ep))."""
    ax = ax or plt.subplots(figsize=(7, 3))[1]
    colours = plt.get_cmap("tab10")
    for r in sorted(ranks, key=lambda r: r["rank"]):
        counts = r["received_per_expert"]
        experts = np.arange(len(counts)) + r["first"]
        ax.bar(experts, counts, color=colours(r["rank"] % 10), label=f"rank {r['rank']}")
    ax.set_xlabel("expert")
    ax.set_ylabel("token-copies computed")
    ax.set_title(title or "experts across ranks: the copies each one computed")
    ax.legend(fontsize="small")
    return ax


def plot_balance(runs: dict[str, dict], ax: Axes | None = None, experts_per_rank: int | None = None) -> Axes:
    """Grouped bars: token-copies per expert on a held-out batch, before training and after, per run (label -> the
    dict :func:`labkit.parallel.experts.balance.train_balance` returned); dotted lines split the ranks' experts."""
    ax = ax or plt.subplots(figsize=(8, 3))[1]
    first = next(iter(runs.values()))
    series = {"before training": first["before"], **{f"after, {name}": r["after"] for name, r in runs.items()}}
    width = 0.8 / len(series)
    experts = np.arange(len(first["before"]))
    for i, (label, counts) in enumerate(series.items()):
        ax.bar(experts + (i - (len(series) - 1) / 2) * width, counts, width, label=label)
    ax.axhline(np.mean(first["before"]), color="k", lw=0.8, ls="--", label="perfect balance")
    if experts_per_rank:
        for cut in range(experts_per_rank, len(experts), experts_per_rank):
            ax.axvline(cut - 0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(experts)
    ax.set_xlabel("expert")
    ax.set_ylabel("token-copies routed")
    ax.set_title("tokens per expert: a router skewed to expert 0, trained with and without the aux loss")
    ax.legend(fontsize="small")
    return ax
