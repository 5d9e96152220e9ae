"""The course map as a picture (notebook 00): one box per notebook, a column per part, an arrow from each
prerequisite to the notebook that needs it, drawn from :func:`labkit.core.course.course_rows` with matplotlib alone.

Each box names its place on the learning path, its number and topic, its reading minutes and what beyond a CPU some
of its checks need. A prerequisite that another prerequisite already needs is drawn dotted. Boxes carry the notebook's file name as their ``gid`` and arrows ``"prerequisite->notebook"``,
so a test (or a reader of the SVG) can tell which is which.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from labkit.core.course import GPU, GPUS, MPI, NAMESPACES, PARTS, TENSORFLOW, CourseRow

BOX_W, BOX_H = 2.5, 0.62          # data units; a column is COLUMN_W wide, a row ROW_H tall
COLUMN_W, ROW_H = 3.3, 0.95
SHORT_NEEDS = {NAMESPACES: "netns", TENSORFLOW: "TF", MPI: "MPI", GPU: "GPU", GPUS: "2+ GPUs"}


def box_positions(rows: list[CourseRow]) -> dict[str, tuple[float, float]]:
    """Lower-left corner of each notebook's box: the column of its part, rows in reading order from the top."""
    parts = [p for p in PARTS if any(r.lesson.part == p for r in rows)]
    where: dict[str, tuple[float, float]] = {}
    for column, part in enumerate(parts):
        mine = [r for r in rows if r.lesson.part == part]
        for i, row in enumerate(mine):
            where[row.file] = (column * COLUMN_W, -i * ROW_H)
    return where


def implied_prerequisites(rows: list[CourseRow]) -> set[tuple[str, str]]:
    """(prerequisite, notebook) pairs that another prerequisite of the notebook already needs: the figure draws
    them faint, so the direct line of each notebook stands out."""
    before = {r.file: set(r.prerequisite_files) for r in rows}
    reach: dict[str, set[str]] = {}

    def ancestors(file: str) -> set[str]:
        if file not in reach:
            reach[file] = set().union(*({p} | ancestors(p) for p in before[file])) if before[file] else set()
        return reach[file]

    return {(p, r.file) for r in rows for p in r.prerequisite_files
            if any(p in ancestors(other) for other in r.prerequisite_files if other != p)}


def _label(row: CourseRow) -> str:
    needs = ", ".join(SHORT_NEEDS[n] for n in row.lesson.needs)
    second = f"{row.reading_minutes:.0f} min" + (f" · {needs}" if needs else "")
    return f"{row.order}. {row.lesson.number} {row.lesson.topic}\n{second}"


def _arrow(start: FancyBboxPatch, end: FancyBboxPatch, gid: str, implied: bool) -> FancyArrowPatch:
    """An arrow between two boxes: straight down to the next box of a column, bowed left to a later one of the same
    column, else from the right edge of one to the left edge of the other."""
    (xa, ya), (xb, yb) = (start.get_x(), start.get_y()), (end.get_x(), end.get_y())
    if xa == xb and abs(ya - yb) <= ROW_H + 1e-9:
        a, b, style = (xa + BOX_W / 2, ya), (xb + BOX_W / 2, yb + BOX_H), "arc3"
    elif xa == xb:
        a, b, style = (xa, ya + BOX_H / 2), (xb, yb + BOX_H / 2), "arc3,rad=0.35"
    else:
        bend = 0.12 if yb <= ya else -0.12
        a, b, style = (xa + BOX_W, ya + BOX_H / 2), (xb, yb + BOX_H / 2), f"arc3,rad={bend}"
    return FancyArrowPatch(a, b, connectionstyle=style, arrowstyle="-|>", mutation_scale=9, zorder=1, gid=gid,
                           linewidth=0.6 if implied else 0.9, linestyle=":" if implied else "-", shrinkA=1, shrinkB=1,
                           color="0.55" if implied else "0.25", alpha=0.5 if implied else 0.8)


def draw_course(rows: list[CourseRow], ax: Axes) -> Axes:
    """Draw the course on ``ax``: part titles over their columns, a box per notebook, an arrow per prerequisite."""
    where = box_positions(rows)
    colours = plt.get_cmap("Pastel1")
    boxes: dict[str, FancyBboxPatch] = {}
    parts = [p for p in PARTS if any(r.lesson.part == p for r in rows)]
    for column, part in enumerate(parts):
        ax.text(column * COLUMN_W + BOX_W / 2, BOX_H + 0.25, textwrap.fill(part, 26), ha="center", va="bottom",
                fontsize=8.5, weight="bold")
    for row in rows:
        x, y = where[row.file]
        box = FancyBboxPatch((x, y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=0.08", zorder=2,
                             facecolor=colours(PARTS.index(row.lesson.part) % 9), edgecolor="0.3", gid=row.file)
        ax.add_patch(box)
        ax.text(x + BOX_W / 2, y + BOX_H / 2, _label(row), ha="center", va="center", fontsize=7.5, zorder=3)
        boxes[row.file] = box
    implied = implied_prerequisites(rows)
    for row in rows:
        for before in row.prerequisite_files:
            ax.add_patch(_arrow(boxes[before], boxes[row.file], f"{before}->{row.file}", (before, row.file) in implied))
    deepest = min(y for _, y in where.values())
    ax.set_xlim(-0.5, (len(parts) - 1) * COLUMN_W + BOX_W + 0.2)
    ax.set_ylim(deepest - 0.2, BOX_H + 0.9)
    ax.axis("off")
    return ax


def course_figure(rows: list[CourseRow]) -> Figure:
    """The learning path as a figure: the numbers in the boxes are the reading order, arrows point to what a
    notebook needs first."""
    parts = {r.lesson.part for r in rows}
    tallest = max(sum(r.lesson.part == p for r in rows) for p in parts)
    fig, ax = plt.subplots(figsize=(2.75 * len(parts) + 0.4, 0.8 * tallest + 1.2))
    draw_course(rows, ax)
    ax.set_title("The learning path: read in the boxes' order; an arrow points from a notebook to one that needs it "
                 "(dotted: also needed through another)", fontsize=9)
    fig.tight_layout()
    return fig
