"""Notebook 09's pitfalls as pictures, each drawn from the evidence its run returned
(:mod:`labkit.parallel.debug.data_pitfalls`): what a too-small per-replica batch costs in samples/s, what the
sampler's padding does to a distributed accuracy, and how many samples the ranks read without a
``DistributedSampler`` and with one.
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from labkit.parallel.debug.data_pitfalls import ShardedEvalEvidence

CLAIM_FACTOR = 2.0          # notebook 09's claim: the big batch trains over 2x the samples/s of the small one


def plot_samples_per_s(samples_per_s: Mapping[int, float], device: str, ax: Axes | None = None) -> Axes:
    """Measured samples/s per per-replica batch size, one bar each, against the claim's line.

    Each bar has its rate written on it; the dashed line is ``CLAIM_FACTOR`` times the smallest batch's rate, the
    bar the larger batches must clear."""
    if not samples_per_s:
        raise ValueError("no throughputs to draw: pass {batch size: samples/s}")
    ax = ax or plt.subplots(figsize=(5, 3))[1]
    sizes = sorted(samples_per_s)
    rates = [samples_per_s[b] for b in sizes]
    bars = ax.bar([f"batch {b}" for b in sizes], rates, color=[f"C{i}" for i in range(len(sizes))])
    for bar, rate in zip(bars, rates):
        ax.text(bar.get_x() + bar.get_width() / 2, rate, f"{rate:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(CLAIM_FACTOR * rates[0], color="k", ls="--", lw=1,
               label=f"{CLAIM_FACTOR:g}x batch {sizes[0]}'s rate")
    ax.set(ylabel="samples/s (one training step)", title=f"throughput per replica on {device}",
           ylim=(0, 1.15 * max(rates + [CLAIM_FACTOR * rates[0]])))
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_eval_accuracy(ev: ShardedEvalEvidence, ax: Axes | None = None) -> Axes:
    """The exact accuracy beside the padded sampler's and the unpadded shards', one bar each.

    Each bar says how many samples it evaluated; a dashed line at the exact accuracy shows which bar misses it."""
    ax = ax or plt.subplots(figsize=(5, 3))[1]
    names = ["exact", "padded sampler", "unpadded shards"]
    accs = [ev.exact_accuracy, ev.padded_accuracy, ev.fixed_accuracy]
    seen = [None, ev.padded_samples_seen, ev.fixed_samples_seen]
    bars = ax.bar(names, accs, color=["0.6", "C3", "C2"])
    for bar, acc, n in zip(bars, accs, seen):
        ax.text(bar.get_x() + bar.get_width() / 2, acc, f"{acc:.3f}" + (f"\nover {n} samples" if n else ""),
                ha="center", va="bottom", fontsize=8)
    ax.axhline(ev.exact_accuracy, color="k", ls="--", lw=1)
    ax.set(ylabel="accuracy", ylim=(0, 1.25), title="distributed evaluation: padding counts samples twice")
    return ax


def plot_shard_reads(without: Mapping[str, int], with_sampler: Mapping[str, int], ax: Axes | None = None) -> Axes:
    """Samples the ranks read in one epoch without a sampler and with one, beside the distinct samples.

    Drawn from :func:`labkit.parallel.debug.data_pitfalls.shard_coverage`'s counts: each bar stacked by rank (one
    segment per rank's ``per_rank`` reads), the distinct samples as a hatched bar beside it."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    for x, (name, cov) in enumerate((("no sampler", without), ("DistributedSampler", with_sampler))):
        ranks = cov["samples_read"] // cov["per_rank"]           # every rank reads per_rank samples
        for r in range(ranks):
            ax.bar(x - 0.2, cov["per_rank"], 0.38, bottom=r * cov["per_rank"], color=f"C{r % 10}",
                   edgecolor="w", lw=0.5)
        ax.bar(x + 0.2, cov["distinct"], 0.38, color="0.85", edgecolor="k", hatch="..", lw=0.5)
        ax.text(x - 0.2, cov["samples_read"], f"{cov['samples_read']:,} read\n({ranks} ranks)", ha="center",
                va="bottom", fontsize=8)
        ax.text(x + 0.2, cov["distinct"], f"{cov['distinct']:,}\ndistinct", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([0, 1], ["no sampler", "DistributedSampler"])
    top = max(without["samples_read"], with_sampler["samples_read"])
    ax.set(ylabel="samples in one epoch", title="one colour per rank: what the ranks read", ylim=(0, 1.25 * top))
    return ax
