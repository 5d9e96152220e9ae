"""The figures of notebook 13, drawn from the objects the code ran: the MLP's two weight matrices with each rank's
shard coloured where :func:`labkit.parallel.tensor.megatron.shard_state` cut it, with Megatron's f and g where they
sit (Shoeybi et al. 2019, arXiv:1909.08053, Figure 3a); and the 2 x 2 (TP x DP) mesh on two nodes, its TP and DP
groups drawn as two kinds of link (the groups :func:`labkit.cluster.tp_mesh.mesh_members` built).

Kept apart from the runs because every rank imports those modules, and a rank has no use for matplotlib.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from labkit.parallel.tensor.megatron import SPLITS, shard_state

MLP_WEIGHTS = ("mlp.fc1.weight", "mlp.fc2.weight")     # column-parallel, then row-parallel
F_TEXT = "f\nforward: identity\nbackward: all-reduce"
G_TEXT = "g\nforward: all-reduce\nbackward: identity"


def shard_blocks(state: Mapping[str, torch.Tensor], name: str, world_size: int) -> list[tuple[int, int, int, int]]:
    """Where each rank's shard of the (out, in) weight ``name`` sits in the whole matrix: (first row, rows, first
    column, columns) per rank, read off the views :func:`shard_state` returns (their offsets into the weight)."""
    full = state[name]
    out = []
    for rank in range(world_size):
        part = shard_state({name: full}, rank, world_size)[name]
        start = part.storage_offset() - full.storage_offset()          # a view: where its first element sits
        row0, col0 = divmod(start, full.stride(0))
        out.append((row0, part.shape[0], col0, part.shape[1]))
    return out


def _matrix(ax: Axes, blocks: list[tuple[int, int, int, int]], shape: tuple[int, int], x0: float, y0: float,
            label: str) -> None:
    """One weight (out, in) drawn in storage layout: in features across, out features down; a rank per colour."""
    colours = plt.get_cmap("tab10")
    rows, cols = shape
    for rank, (r0, nr, c0, nc) in enumerate(blocks):
        ax.add_patch(Rectangle((x0 + c0, y0 - r0 - nr), nc, nr, facecolor=colours(rank % 10), alpha=0.55,
                               edgecolor="k", lw=0.6, label=f"rank {rank}"))
        ax.text(x0 + c0 + nc / 2, y0 - r0 - nr / 2, f"rank {rank}\n({nr} x {nc})", ha="center", va="center",
                fontsize=7)
    ax.text(x0 + cols / 2, y0 + 6, label, ha="center", va="bottom", fontsize=8)
    ax.text(x0 - 3, y0, f"out\n{rows}", ha="right", va="top", fontsize=7)
    ax.text(x0 + cols / 2, y0 - rows - 4, f"in {cols}", ha="center", va="top", fontsize=7)


def _operator(ax: Axes, x: float, y: float, text: str) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=7, zorder=3,
            bbox={"boxstyle": "round", "fc": "lightyellow"})


def plot_mlp_split(state: Mapping[str, torch.Tensor], world_size: int, ax: Axes | None = None) -> Axes:
    """fc1 (column-parallel: each rank a block of rows, its own hidden units) then fc2 (row-parallel: the matching
    block of columns), each rank's shard coloured; f before fc1, GELU between (no communication), g after fc2."""
    for name in MLP_WEIGHTS:
        if name not in state:
            raise ValueError(f"state has no {name!r}: pass the unsplit layer's state_dict()")
    fc1, fc2 = (shard_blocks(state, n, world_size) for n in MLP_WEIGHTS)
    h, hidden = state[MLP_WEIGHTS[0]].shape[1], state[MLP_WEIGHTS[0]].shape[0]
    ax = ax or plt.subplots(figsize=(10, 4.2))[1]
    gap = max(h, hidden) * 0.6
    x1 = gap                                    # fc1 is h wide, hidden tall; fc2 hidden wide, h tall
    x2 = x1 + h + gap
    mid = hidden / 2
    arrow = {"arrowstyle": "->"}
    ax.annotate("", (x1 - 4, mid), (0, mid), arrowprops=arrow)                      # x -> f -> fc1
    ax.annotate("", (x2 - 4, mid), (x1 + h + 4, mid), arrowprops=arrow)             # fc1 -> GELU -> fc2
    ax.annotate("", (x2 + hidden + gap, mid), (x2 + hidden + 4, mid), arrowprops=arrow)   # fc2 -> g -> y
    _operator(ax, x1 / 2, mid, F_TEXT)
    _matrix(ax, fc1, (hidden, h), x1, hidden, f"fc1: {SPLITS['mlp.fc1']}-parallel\n(rows of W split)")
    ax.text(x1 + h + gap / 2, mid + 6, "GELU on each\nrank's own units:\nno communication", ha="center",
            va="bottom", fontsize=7)
    _matrix(ax, fc2, (h, hidden), x2, mid + h / 2, f"fc2: {SPLITS['mlp.fc2']}-parallel\n(columns of W split)")
    _operator(ax, x2 + hidden + gap / 2, mid, G_TEXT)
    ax.set_xlim(0, x2 + hidden + gap)
    ax.set_ylim(-20, hidden + 40)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"the MLP split over t = {world_size} ranks: fc1 by rows, fc2 by columns, one f and one g",
                 fontsize=10)
    return ax


def _rank_xy(rank: int, per_node: int) -> tuple[float, float]:
    node, local = divmod(rank, per_node)
    return node * 2.0 + 0.5, -local * 1.2


def _draw_nodes(ax: Axes, ranks: list[int], per_node: int, where: dict[str, dict[int, int]]) -> int:
    """Node boxes, the shaded slow link between neighbours, a box per rank with its TP and DP index; the node count."""
    nodes = -(-len(ranks) // per_node)
    bottom, height = -(per_node - 1) * 1.2 - 0.45, (per_node - 1) * 1.2 + 0.9
    for node in range(nodes - 1):                  # the slow link: the gap every cross-node link spans
        ax.add_patch(Rectangle((node * 2.0 + 1.05, bottom), 0.9, height, color="0.92", zorder=0))
    for node in range(nodes):
        ax.add_patch(Rectangle((node * 2.0, bottom), 1.0, height, fill=False, lw=1.5))
        ax.text(node * 2.0 + 0.5, 0.55, f"node {node}", ha="center", fontsize=9)
    for rank in ranks:
        x, y = _rank_xy(rank, per_node)
        ax.add_patch(Rectangle((x - 0.3, y - 0.25), 0.6, 0.5, facecolor="whitesmoke", edgecolor="k", zorder=3))
        ax.text(x, y, f"rank {rank}\ntp {where['tp'].get(rank, 0)}, dp {where['dp'].get(rank, 0)}", ha="center",
                va="center", fontsize=8, zorder=4)
    return nodes


def _draw_links(ax: Axes, groups: Sequence[Sequence[int]], per_node: int, style: str, label: str) -> None:
    """A link between consecutive members of each group: solid red for TP, dashed blue for DP."""
    bend = 0.12 if style == "--" else -0.12                # two links between one pair of ranks stay apart
    for i, group in enumerate(groups):
        for a, b in zip(group, group[1:]):
            (xa, ya), (xb, yb) = _rank_xy(a, per_node), _rank_xy(b, per_node)
            ax.plot([xa + bend, xb + bend], [ya + bend, yb + bend], ls=style, lw=2.5, zorder=2,
                    color="tab:red" if style == "-" else "tab:blue", label=label if i == 0 else None)


def plot_mesh_groups(placements: Mapping[str, tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]],
                     per_node: int = 2, link_bytes: Mapping[str, float] | None = None) -> np.ndarray:
    """One panel per placement (name -> (TP groups, DP groups) as lists of global ranks, node-major): the nodes as
    boxes, each rank a box (with its index in its TP and DP group), TP groups as solid red links and DP groups as
    dashed blue ones. ``link_bytes``: the bytes one node sends over the slow link per step, written under its panel."""
    axes = np.atleast_1d(plt.subplots(1, len(placements), figsize=(4.4 * len(placements), 3.4))[1])
    low = -(per_node - 1) * 1.2
    for ax, (name, (tp_groups, dp_groups)) in zip(axes, placements.items()):
        ranks = sorted({r for g in (*tp_groups, *dp_groups) for r in g})
        where = {axis: {r: list(g).index(r) for g in groups for r in g}
                 for axis, groups in (("tp", tp_groups), ("dp", dp_groups))}
        nodes = _draw_nodes(ax, ranks, per_node, where)
        _draw_links(ax, tp_groups, per_node, "-", "TP group: 4 all-reduces per layer")
        _draw_links(ax, dp_groups, per_node, "--", "DP group: 1 gradient all-reduce per step")
        ax.text(1.5, low - 0.75, "shaded: the slow link between the nodes", ha="center", fontsize=8, color="grey")
        if link_bytes is not None and name in link_bytes:
            ax.text(1.5, low - 1.05, f"formula: {link_bytes[name] / 2 ** 10:,.0f} KiB per node per step",
                    ha="center", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(-0.2, nodes * 2.0 - 0.8)
        ax.set_ylim(low - 1.3, 0.9)
        ax.axis("off")
    axes[0].legend(loc="upper center", bbox_to_anchor=(1.1 if len(axes) > 1 else 0.5, -0.05), fontsize=8, ncol=2)
    return axes
