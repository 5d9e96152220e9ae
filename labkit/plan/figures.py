"""The planner's ranking as a picture (notebook 14): each layout's predicted step time as one horizontal bar,
stacked by the named time terms of :class:`labkit.plan.planner.Prediction` (compute, each collective, the bubble).

The bars are drawn from the predictions themselves, so the segments of a bar add up to that layout's ``step_s``.
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from labkit.plan.planner import Prediction


def plot_step_terms(ranked: Sequence[Prediction], top: int = 5, title: str = "") -> Figure:
    """The first ``top`` predictions as horizontal bars, one stacked segment per time term (the first prediction's
    keys, in its order), the fastest at the top, each bar labelled with its layout and its total step time."""
    shown = list(ranked[:top])
    if not shown:
        raise ValueError("no predictions to draw")
    terms = list(shown[0].time)
    labels = [p.layout.label() for p in shown]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(shown) + 1.4))
    left = [0.0] * len(shown)
    for term in terms:
        widths = [float(p.time.get(term, 0.0)) for p in shown]
        ax.barh(labels, widths, left=left, label=term)
        left = [a + w for a, w in zip(left, widths)]
    for y, total in enumerate(left):                    # each bar's end is its step time: say it
        ax.annotate(f"{total:.3g} s", (total, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.invert_yaxis()                                   # rank 1 on top
    ax.set_xlim(0, max(left) * 1.1)
    ax.set(xlabel="predicted seconds per step, by term", title=title or f"the planner's top {len(shown)} layouts")
    ax.legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    fig.tight_layout()
    return fig
