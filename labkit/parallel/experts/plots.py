"""The figures of notebook 15, drawn from the objects the runs returned: which experts sit on which rank and the
token-copies each received, tokens per expert before and after training with the load-balancing loss, and the
layer placed on two nodes (who holds what, the bytes each placement sent over the slow link).

Kept apart from the runs because every rank imports those modules, and a rank has no use for matplotlib.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle


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


def plot_node_placements(layouts: dict[str, dict[int, str]], link_bytes: dict[str, tuple[float, float]],
                         per_node: int = 2) -> np.ndarray:
    """One panel per placement: the nodes as boxes, each rank coloured by what it holds (``layouts``: placement ->
    rank -> label), and the link between the nodes labelled with (measured, predicted) bytes per node per step."""
    axes = np.atleast_1d(plt.subplots(1, len(layouts), figsize=(4.2 * len(layouts), 3.2))[1])
    labels = sorted({label for ranks in layouts.values() for label in ranks.values()})
    colours = plt.get_cmap("tab10")
    for ax, (name, ranks) in zip(axes, layouts.items()):
        nodes = len(ranks) // per_node
        for node in range(nodes):
            x = node * 1.5
            ax.add_patch(Rectangle((x, 0), 1.1, 2.1, fill=False, lw=1.5))
            ax.text(x + 0.55, 2.18, f"node {node}", ha="center", fontsize=9)
            for local in range(per_node):
                rank = node * per_node + local
                ax.add_patch(Rectangle((x + 0.08, 0.1 + local), 0.94, 0.9, alpha=0.35,
                                       color=colours(labels.index(ranks[rank]) % 10)))
                ax.text(x + 0.55, 0.55 + local, f"rank {rank}\n{ranks[rank]}", ha="center", va="center", fontsize=7)
        measured, predicted = link_bytes[name]
        ax.plot([1.1, 1.5], [1.05, 1.05], color="k", lw=3)
        ax.text(1.3, -0.35, f"link: {measured / 1e3:,.0f} kB/step\n(model {predicted / 1e3:,.0f} kB)", ha="center",
                fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(-0.1, 1.5 * nodes - 0.3)
        ax.set_ylim(-0.75, 2.4)
        ax.axis("off")
    return axes
