"""The steps-to-target / time-to-target view: what the batch-size dashboard's accuracy curves lead to.

Three panels from live runs: the S-E trade-off (McCandlish et al. 2018, arXiv 1812.06162, figure 1's shape) with
every measured run and the fitted hyperbola S/S_min - 1 = (E/E_min - 1)^-1; steps to the target by batch with
B_crit and B_simple marked; and time to the target by batch (steps x measured step time) with the fastest batch and
the throughput knee. The first panel is also drawn alone on any axes (:func:`draw_trade_off`: the measured batch
sizes, S_min, E_min and B_crit marked). Matplotlib's object API (no pyplot), as in :mod:`labkit.ui.batch_views`.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from labkit.training.noise_scale import NoiseScale
from labkit.training.to_target import CriticalBatchFit, TargetRun


def to_target_table(fit: CriticalBatchFit, runs: Sequence[TargetRun], time_s: Mapping[int, float]) -> pd.DataFrame:
    """One row per batch: seeds that reached the target, mean steps and examples, fitted steps, time to target."""
    rows = []
    for b in sorted({r.batch_size for r in runs}):
        mine = [r for r in runs if r.batch_size == b]
        steps = fit.mean_steps.get(b, math.nan)
        rows.append({"batch": b, "lr": mine[0].lr, "reached": f"{sum(r.reached for r in mine)}/{len(mine)}",
                     "steps S (mean)": steps, "examples E (mean)": b * steps, "S fitted": fit.steps_at(b),
                     "time to target (s)": time_s.get(b, math.nan)})
    return pd.DataFrame(rows)


def draw_trade_off(ax: Axes, fit: CriticalBatchFit, runs: Sequence[TargetRun]) -> Axes:
    """McCandlish et al.'s figure on ``ax``: steps S against examples E to the target, log-log. Each measured batch
    size is a point (mean S over the seeds, E = B x S), each seed a faint dot, the fit the hyperbola
    S/S_min - 1 = (E/E_min - 1)^-1 with its asymptotes S_min and E_min, and B_crit where S = 2 S_min, E = 2 E_min."""
    done = [r for r in runs if r.reached]
    ax.scatter([r.examples for r in done], [r.steps for r in done], s=10, alpha=0.3, color="tab:blue",
               label="each seed")
    bs = sorted(fit.mean_steps)
    ax.plot([b * fit.mean_steps[b] for b in bs], [fit.mean_steps[b] for b in bs], "o", color="tab:blue",
            label="each batch size (mean over seeds)")
    for b in bs:
        ax.annotate(f"B={b}", (b * fit.mean_steps[b], fit.mean_steps[b]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    grid = np.geomspace(bs[0] / 2, bs[-1] * 2, 200)
    s = np.array([fit.steps_at(b) for b in grid])
    keep = s > 0
    ax.plot(grid[keep] * s[keep], s[keep], color="black", label="fit: S/S_min - 1 = (E/E_min - 1)^-1")
    if fit.s_min > 0:
        ax.axhline(fit.s_min, ls=":", color="grey", label=f"S_min = {fit.s_min:.0f} steps")
    if fit.e_min > 0:
        ax.axvline(fit.e_min, ls="--", color="grey", label=f"E_min = {fit.e_min:,.0f} examples")
    if math.isfinite(fit.b_crit) and fit.b_crit > 0:
        ax.plot([2 * fit.e_min], [2 * fit.s_min], "*", ms=13, color="tab:red",
                label=f"B_crit = E_min/S_min = {fit.b_crit:.0f}: 2 S_min, 2 E_min")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("examples to target E")
    ax.set_ylabel("steps to target S")
    ax.set_title("the S-E trade-off")
    ax.legend(fontsize=7)
    return ax


def _marks(ax, fit: CriticalBatchFit, noise: NoiseScale | None) -> None:
    ax.axvspan(fit.b_crit_low, min(fit.b_crit_high, 1e9), color="tab:red", alpha=0.12)
    ax.axvline(fit.b_crit, color="tab:red", ls="--", label=f"B_crit {fit.b_crit:.0f}")
    if noise is not None and noise.b_simple > 0:
        ax.axvline(noise.b_simple, color="tab:green", ls="-.", label=f"B_simple {noise.b_simple:.0f}")


def to_target_figure(fit: CriticalBatchFit, runs: Sequence[TargetRun], time_s: Mapping[int, float], *,
                     noise: NoiseScale | None = None, knee: int | None = None) -> Figure:
    """The three panels: trade-off, steps by batch (fit, B_crit, B_simple), time by batch (fastest, knee)."""
    fig = Figure(figsize=(13, 3.8))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    draw_trade_off(ax1, fit, runs)
    bs = sorted(fit.mean_steps)
    ax2.plot(bs, [fit.mean_steps[b] for b in bs], "o", label="mean over seeds")
    grid = np.geomspace(bs[0], bs[-1], 100)
    ax2.plot(grid, [fit.steps_at(b) for b in grid], color="black", label="S_min + E_min / B")
    _marks(ax2, fit, noise)
    ax2.set_ylabel("steps to target")
    tb = sorted(b for b in time_s if math.isfinite(time_s[b]))
    ax3.plot(tb, [time_s[b] for b in tb], "s-", color="tab:purple")
    if tb:
        best = min(tb, key=lambda b: time_s[b])
        ax3.plot([best], [time_s[best]], "*", ms=14, color="gold", label=f"fastest: batch {best}")
    if knee is not None:
        ax3.axvline(knee, color="grey", ls="--", label=f"throughput knee {knee}")
    _marks(ax3, fit, None)
    ax3.set_ylabel("time to target (s)")
    for ax in (ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.legend(fontsize=7)
    ax2.set_yscale("log")
    ax2.set_title("steps to target")
    ax3.set_title("time to target = steps x step time")
    fig.tight_layout()
    return fig


def noise_scale_figure(points: Sequence[tuple[int, float, NoiseScale]]) -> Figure:
    """B_simple (± 1 standard error) and the training loss at the steps where it was measured."""
    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    steps = [p[0] for p in points]
    ax.errorbar(steps, [p[2].b_simple for p in points], yerr=[p[2].stderr for p in points], fmt="o-",
                color="tab:green", label="B_simple")
    ax.set_xlabel("step")
    ax.set_ylabel("B_simple (samples)")
    twin = ax.twinx()
    twin.plot(steps, [p[1] for p in points], "x:", color="tab:blue", label="training loss")
    twin.set_ylabel("loss")
    ax.set_title("the noise scale grows as the loss falls")
    fig.tight_layout()
    return fig
