"""The figures of notebook 18, drawn from the objects the code ran: the grid of ranks coloured by each axis's groups
(from a :class:`labkit.comm.mesh.Mesh`), and the bytes each axis sent per composition against its formula and rival.

Kept apart from the runs because every rank imports those modules, and a rank has no use for matplotlib.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from labkit.comm.mesh import Mesh


def draw_axis_groups(mesh: Mesh, axis: str, ax: Axes) -> Axes:
    """The mesh's ranks as boxes (tp along x, the slower axes down), each coloured by its group along ``axis``."""
    colours = plt.get_cmap("tab10")
    columns = mesh.tp
    for g, ranks in enumerate(mesh.members(axis)):
        for rank in ranks:
            x, y = rank % columns, rank // columns
            ax.add_patch(plt.Rectangle((x, -y), 0.9, 0.9, color=colours(g % 10), alpha=0.8))
            c = mesh.coords(rank)
            where = ",".join(f"{a}{c[a]}" for a in mesh.active_axes())
            ax.text(x + 0.45, -y + 0.45, f"rank {rank}\n{where}", ha="center", va="center", fontsize=8)
    rows = mesh.world_size // columns
    ax.set_xlim(-0.1, columns)
    ax.set_ylim(-rows + 0.9, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{mesh.label()}: {axis} groups {mesh.members(axis)}", fontsize=9)
    return ax


def mesh_figure(meshes: dict[str, Mesh]) -> Figure:
    """One row per named mesh, one panel per axis in use: which ranks talk to which along each axis."""
    widest = max(len(m.active_axes()) for m in meshes.values())
    fig, axes = plt.subplots(len(meshes), widest, figsize=(3.6 * widest, 2.6 * len(meshes)), squeeze=False)
    for row, (name, mesh) in zip(axes, meshes.items()):
        for ax, axis in zip(row, mesh.active_axes()):
            draw_axis_groups(mesh, axis, ax)
        for ax in row[len(mesh.active_axes()):]:
            ax.axis("off")
        row[0].text(-0.3, 0.5, name, transform=row[0].transAxes, rotation=90, va="center", fontsize=11)
    fig.tight_layout()
    return fig


def plot_axis_bytes(rows: list[dict], ax: Axes | None = None) -> Axes:
    """Bars: bytes per step the busiest rank sent on each axis of each composition; a black tick marks the formula,
    a red cross the rival (rows from :func:`labkit.parallel.compose.runs.bytes_rows`)."""
    ax = ax or plt.subplots(figsize=(10, 3.5))[1]
    labels = [f"{r['composition']}\n{r['axis']}" for r in rows]
    xs = np.arange(len(rows))
    colours = plt.get_cmap("tab10")
    axes_seen = sorted({r["axis"] for r in rows})
    ax.bar(xs, [r["measured_bytes"] / 1024 for r in rows], color=[colours(axes_seen.index(r["axis"])) for r in rows],
           label="counted (bars, coloured by axis)")
    ax.scatter(xs, [r["predicted_bytes"] / 1024 for r in rows], marker="_", s=400, color="k", label="formula", zorder=3)
    ax.scatter(xs, [r["rival_bytes"] / 1024 for r in rows], marker="x", color="tab:red", label="rival", zorder=3)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("KiB sent per rank per step")
    ax.set_title("bytes per axis per composition: counted, formula, rival")
    ax.legend(fontsize="small")
    return ax
