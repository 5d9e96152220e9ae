"""Charts and tables of the parallel lessons' measurements: speedup predicted vs measured, and a pipeline's
schedule picture (notebook 05's GPipe and notebook 05b's live schedules, drawn from one timeline type).

Kept apart from ``scaling`` and ``pipeline`` because every rank of a measured run imports those modules:
a rank never draws, so it need not load matplotlib and pandas (about 50 MB and a second per process).
"""
from __future__ import annotations

from dataclasses import asdict

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from labkit.parallel.pipeline.schedule_sim import Span
from labkit.parallel.data.scaling import ScalingPoint


def points_to_dataframe(points: list[ScalingPoint]) -> pd.DataFrame:
    """A table of ScalingPoints (with relative_error) as a pandas DataFrame."""
    return pd.DataFrame([{**asdict(p), "relative_error": p.relative_error} for p in points])


def plot_predicted_vs_measured(points: list[ScalingPoint], ax: Axes | None = None) -> Axes:
    """Bar chart of predicted and measured speedup per world size R, with ideal R marked."""
    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    xs = np.arange(len(points))
    ax.bar(xs - 0.2, [p.predicted_speedup for p in points], 0.4, label="predicted")
    ax.bar(xs + 0.2, [p.measured_speedup for p in points], 0.4, label="measured")
    ax.plot(xs, [p.world_size for p in points], "k_", ms=30, label="ideal (R)")
    ax.set_xticks(xs, [f"R={p.world_size}" for p in points])
    ax.set(ylabel="speedup over R=1", title="Data-parallel speedup: model vs measurement")
    ax.legend(fontsize=8)
    return ax


KIND_COLOURS = {"F": "C0", "B": "C1", "I": "C2", "W": "C4"}


def plot_schedule(spans: list[Span], ax: Axes | None = None, title: str = "", posts: list | None = None) -> Axes:
    """The familiar schedule picture of a run, live or simulated: a row per rank, F blue, B orange, I green,
    W purple; a rank's second stage hatched; the micro-batch number on each box; white is the bubble. ``posts``
    (sends and receives a rank posted) are ticks: a send a black triangle above its row, a receive a grey one
    below."""
    ax = ax or plt.subplots(figsize=(9, 1.6))[1]
    t0 = min(s.start_s for s in spans)
    for p in posts or []:
        send = p.what.startswith("send")
        ax.plot(1e3 * (p.time_s - t0), p.rank + (-0.45 if send else 0.45), "v" if send else "^", ms=3,
                color="k" if send else "0.6")
    first_stage = {r: min(s.stage for s in spans if s.rank == r) for r in {s.rank for s in spans}}
    for s in spans:
        start_ms, width_ms = 1e3 * (s.start_s - t0), 1e3 * s.duration_s
        ax.barh(s.rank, width_ms, left=start_ms, color=KIND_COLOURS[s.kind], edgecolor="k", lw=0.3,
                hatch="//" if s.stage != first_stage[s.rank] else None)
        ax.text(start_ms + width_ms / 2, s.rank, str(s.micro_batch), ha="center", va="center", fontsize=6)
    ax.set(yticks=sorted(first_stage), xlabel="time (ms)", ylabel="rank", title=title)
    ax.invert_yaxis()
    return ax
