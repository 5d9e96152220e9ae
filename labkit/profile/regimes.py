"""The third wall, overhead: a step's fixed cost from step time against batch size, and the regime by batch.

A step costs about ``t(b) = c + s x b``: ``c`` is paid once per step whatever the batch (operator dispatch and
kernel launches, Python, the optimizer's loop over parameters), ``s`` per sample. The intercept ``c`` of a
robust line through the measured step times is the fixed cost. Per batch size the step is
*overhead-bound* while ``c`` is the largest of the three costs (``c``, FLOPs / peak, bytes / bandwidth), then
*memory-* or *compute-bound*. Throughput ``b / t(b)`` reaches 90% of its ceiling ``1/s`` at ``b = 9c/s``: the
knee of notebook 02's throughput curve (:func:`labkit.training.batch_size.knee_batch`) is where the fixed cost
has shrunk to a tenth of the step.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import nn

from labkit.core.clock import interleaved, paired_median
from labkit.core.step import TrainStep
from labkit.core.timing import time_fn
from labkit.training.batch_size import knee_batch

if TYPE_CHECKING:
    from matplotlib.axes import Axes

KNEE_FRACTION = 0.9            # notebook 02's knee: the smallest batch reaching 90% of the best samples/s


@dataclass(frozen=True)
class OverheadFit:
    """Step time against batch size: every round, the median, and the line ``c + s x b`` through the medians."""

    batch_sizes: tuple[int, ...]
    rounds_s: tuple[tuple[float, ...], ...]     # per batch size, the step time of each interleaved round (a median)
    intercept_s: float                          # c: the fixed cost per step
    per_sample_s: float                         # s: the cost of one more sample

    @property
    def step_time_s(self) -> list[float]:
        """Per batch size, its fastest round: as a roof is its best repeat, load only ever adds time."""
        return [min(r) for r in self.rounds_s]

    def predicted_knee(self) -> float:
        """Batch where b / (c + s b) reaches 90% of 1 / s: 9c / s (inf when s <= 0)."""
        ratio = KNEE_FRACTION / (1 - KNEE_FRACTION)
        return ratio * self.intercept_s / self.per_sample_s if self.per_sample_s > 0 else float("inf")

    def fitted_knee(self) -> int | None:
        """Notebook 02's rule applied to the fitted line on the same batch sizes: the knee the fit predicts."""
        line = [b / (self.intercept_s + self.per_sample_s * b) for b in self.batch_sizes]
        return knee_batch(list(self.batch_sizes), line, KNEE_FRACTION) if min(line) > 0 else None

    def measured_knee(self) -> int | None:
        """Notebook 02's knee on these step times: the smallest batch with 90% of the best samples/s."""
        return knee_batch(list(self.batch_sizes), [b / t for b, t in zip(self.batch_sizes, self.step_time_s)],
                          KNEE_FRACTION)

    def per_sample_gain(self, small: int, large: int) -> float | None:
        """How many times less time per sample ``large`` takes than ``small``, paired round by round."""
        rounds = dict(zip(self.batch_sizes, self.rounds_s))
        per_sample_small = [t / small for t in rounds[small]]
        per_sample_large = [t / large for t in rounds[large]]
        return paired_median(per_sample_small, per_sample_large)


def fit_overhead(batch_sizes: Sequence[int], rounds_s: Sequence[Sequence[float]]) -> OverheadFit:
    """The line ``c + s x b`` through the fastest round of each batch size, fitted robustly: s is the median of
    the slopes between every pair of points, c the median of t - s x b (Theil 1950, Sen 1968), so one batch
    size that a load spike slowed cannot tilt the line, as it would a least-squares fit."""
    if len(batch_sizes) < 2 or len(batch_sizes) != len(rounds_s) or len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError("fit_overhead needs step times for at least two different batch sizes, one list per size")
    points = list(zip(batch_sizes, (min(r) for r in rounds_s)))
    slope = statistics.median((t2 - t1) / (b2 - b1) for i, (b1, t1) in enumerate(points) for b2, t2 in points[i + 1:])
    intercept = statistics.median(t - slope * b for b, t in points)
    return OverheadFit(tuple(batch_sizes), tuple(tuple(r) for r in rounds_s), float(intercept), float(slope))


def measure_step_times(model: nn.Module, make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                       batch_sizes: Sequence[int], *, rounds: int = 3, repeats: int = 2,
                       device: torch.device | None = None) -> OverheadFit:
    """The kit's one training step (:class:`labkit.core.step.TrainStep`) timed at each batch size, the sizes
    interleaved round by round, then fitted.

    On a CPU the step runs on one intra-op thread meanwhile: with two, a larger batch spreads over both cores and a
    busy neighbour slows it more than batch 1 (whose small operators barely use the second), which bends the line
    and moved the fitted fixed cost from 1.37 t(1) on a quiet run to 0.16 t(1) beside a busy notebook. On one
    thread a neighbour slows every size alike, and the process's CPU share says how much."""
    device = device or next(model.parameters()).device
    model = model.to(device).train()
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), device=device)
    batches = {b: tuple(t.to(device) for t in make_batch(b)) for b in batch_sizes}

    def timed(b: int) -> Callable[[], float]:
        return lambda: time_fn(lambda: step(*batches[b]), warmup=1, repeats=repeats, device=device).median_s

    before = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        results = interleaved({str(b): timed(b) for b in batch_sizes}, rounds=rounds)
    finally:
        torch.set_num_threads(before)
    return fit_overhead(list(batch_sizes), [results[str(b)] for b in batch_sizes])


@dataclass(frozen=True)
class RegimeRow:
    """One batch size: measured step time, the three costs, and which wall is the limit."""

    batch_size: int
    step_time_s: float
    overhead_s: float
    memory_s: float
    compute_s: float

    @property
    def regime(self) -> str:
        costs = {"overhead": self.overhead_s, "memory": self.memory_s, "compute": self.compute_s}
        return max(costs, key=costs.get)


def regime_rows(fit: OverheadFit, compute_s: tuple[float, float], memory_s: tuple[float, float],
                roofline_fixed_s: float) -> list[RegimeRow]:
    """Per batch size: the overhead (the fit's fixed cost c less the fixed part the roofline itself predicts,
    e.g. the weights' and optimizer's memory traffic), and the roofline's compute and memory seconds, each
    given as (fixed part, per-sample part) from the operator accounting at two batch sizes."""
    overhead_s = max(0.0, fit.intercept_s - roofline_fixed_s)
    return [RegimeRow(b, t, overhead_s, memory_s[0] + b * memory_s[1], compute_s[0] + b * compute_s[1])
            for b, t in zip(fit.batch_sizes, fit.step_time_s)]


def linear_in_batch(small: int, small_total: float, large: int, large_total: float) -> tuple[float, float]:
    """(fixed part, per-sample part) of a total measured at two batch sizes (a step's roofline seconds)."""
    if large <= small:
        raise ValueError(f"need two different batch sizes, small < large; got {small}, {large}")
    per_sample = (large_total - small_total) / (large - small)
    return small_total - small * per_sample, per_sample


def plot_regimes(rows: Sequence[RegimeRow], knee: int | None = None, ax: Axes | None = None) -> Axes:
    """Step time and the three costs against batch size (log-log), each point coloured by its regime."""
    import matplotlib.pyplot as plt  # lazy: plotting only where a figure is drawn

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    bs = [r.batch_size for r in rows]
    ax.loglog(bs, [r.step_time_s for r in rows], "k-o", label="measured step time")
    for name, style in (("overhead_s", "--"), ("memory_s", ":"), ("compute_s", "-.")):
        ax.loglog(bs, [getattr(r, name) for r in rows], style, label=name.replace("_s", " (s)"))
    colours = {"overhead": "tab:red", "memory": "tab:blue", "compute": "tab:green"}
    for r in rows:
        ax.scatter([r.batch_size], [r.step_time_s], color=colours[r.regime], s=60, zorder=3)
    if knee is not None:
        ax.axvline(knee, color="grey", ls="--", label=f"knee (notebook 02's rule) at {knee}")
    ax.set_xlabel("batch size")
    ax.set_ylabel("seconds per step")
    ax.set_title("Which wall, by batch size (dot colour: red overhead, blue memory, green compute)")
    ax.legend(fontsize=7)
    return ax
