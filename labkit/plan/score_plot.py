"""The self-score's figure (notebook 14), drawn from the rows :func:`labkit.plan.score.score_rows` made: each layout's
measured step time against the planner's prediction, marked by the axes it uses, and the error per axis.

Kept apart from :mod:`labkit.plan.score` so the ranks, which import the runner, never import matplotlib.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from labkit.plan.runnable import AXES


def plot_self_score(rows: list[dict], summary: list[dict]) -> Figure:
    """Left: measured against predicted ms per layout (the diagonal is a perfect prediction), each point labelled
    with its axes. Right: per axis, the median and worst step-time error (measured / predicted - 1)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for r in rows:
        left.scatter(r["predicted ms"], r["measured ms"], s=30)
        left.annotate(r["axes"], (r["predicted ms"], r["measured ms"]), fontsize=7, xytext=(3, 3),
                      textcoords="offset points")
    top = max(max(r["predicted ms"], r["measured ms"]) for r in rows) * 1.1
    left.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="measured = predicted")
    left.set(xlim=(0, top), ylim=(0, top), xlabel="predicted ms per step", ylabel="measured ms per step",
             title="every layout run: measured vs the planner")
    left.legend(fontsize=8, loc="upper left")
    ran = [s for s in summary if s["layouts"]]
    xs = range(len(ran))
    right.bar([x - 0.2 for x in xs], [100 * s["median step error"] for s in ran], width=0.4, label="median")
    right.bar([x + 0.2 for x in xs], [100 * s["worst step error"] for s in ran], width=0.4, label="worst")
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(list(xs), [f"{s['axis']}\n({s['layouts']})" for s in ran])
    right.set(ylabel="step-time error, %", title=f"error per axis (of {', '.join(AXES)}; layouts in brackets)")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
