"""The batch-size dashboard's runs as data: what each run measured, and the fair comparisons between runs.

Runs at different batch sizes see different numbers of samples per step, so the comparisons here are by
samples seen and by training seconds (Goyal et al. 2017 and the time-to-accuracy benchmarks, e.g. DAWNBench,
Coleman et al. 2017, judge a recipe by the time it takes to reach a target accuracy). No widgets: the
dashboard draws what these functions compute, and tests call them directly.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import pandas as pd

from labkit.training.batch_size import knee_batch
from labkit.training.run_spec import RunSpec

SPREAD_WARN = 0.05      # repeats of the same settings whose final accuracies differ by more are flagged


@dataclass
class DashboardRun:
    """One dashboard run: the run as described and checked once (its RunSpec), and what was measured while it ran."""

    spec: RunSpec                                   # model, batch size, optimizer, lr (scaled), precision, seed
    total_steps: int
    lr_rule: str = "same lr"
    points: list = field(default_factory=list)      # dicts: step, samples_seen, train_s, samples_per_s, step_time_ms, loss
    accuracy: list = field(default_factory=list)    # dicts: step, samples_seen, train_s, accuracy
    memory: object | None = None                    # labkit MemoryBreakdown (predicted) at this batch
    limit: object | None = None                     # labkit BatchLimit: what fits this model here (the bars' scale)
    measured_bytes: int | None = None               # GPU: peak minus the baseline; CPU: counted activations + rest
    reserved_bytes: int | None = None               # GPU: the caching allocator's reserve above the peak
    ceiling_samples_per_s: float | None = None      # device-resident ceiling (labkit.training.ceiling) at this batch
    started_s: float | None = None                  # clock reading when Run was pressed
    update_s: list = field(default_factory=list)    # seconds after Run when the plots were redrawn
    result: object | None = None                    # labkit RunResult when finished
    stopped: bool = False
    error: str | None = None

    @property
    def model(self) -> str:
        """The model's name (the spec's)."""
        return self.spec.model

    @property
    def batch_size(self) -> int:
        """Samples per step (the spec's)."""
        return self.spec.batch_size

    @property
    def lr(self) -> float:
        """The learning rate trained with, after any scaling (the spec's)."""
        return self.spec.lr

    @property
    def seed(self) -> int:
        """The run's seed (the spec's)."""
        return self.spec.seed

    @property
    def label(self) -> str:
        """How plots, bars and the readout name the run."""
        return f"{self.model} bs={self.batch_size}"

    @property
    def settings(self) -> tuple:
        """What makes two runs repeats of each other."""
        return (self.model, self.batch_size, self.lr_rule, self.total_steps)

    def add_step(self, step: int, samples: int, step_time_s: float, samples_per_s: float, loss: float) -> None:
        """Record one finished step; samples seen and training seconds accumulate (evaluation not counted)."""
        prev = self.points[-1] if self.points else {"samples_seen": 0, "train_s": 0.0}
        self.points.append(dict(step=step, samples_seen=prev["samples_seen"] + samples,
                                train_s=prev["train_s"] + step_time_s, samples_per_s=samples_per_s,
                                step_time_ms=1e3 * step_time_s, loss=loss))

    def add_accuracy(self, accuracy: float) -> None:
        """Record a validation accuracy at the newest step."""
        last = self.points[-1] if self.points else {"step": 0, "samples_seen": 0, "train_s": 0.0}
        if self.accuracy and self.accuracy[-1]["step"] == last["step"]:
            self.accuracy.pop()
        self.accuracy.append(dict(step=last["step"], samples_seen=last["samples_seen"], train_s=last["train_s"],
                                  accuracy=float(accuracy)))

    @property
    def final_accuracy(self) -> float | None:
        """The newest validation accuracy (the full evaluation once the run has ended)."""
        return self.accuracy[-1]["accuracy"] if self.accuracy else None


def time_to_target(run: DashboardRun, target: float) -> tuple[float, int] | None:
    """(training seconds, samples seen) at the first evaluation reaching ``target`` accuracy; None if none did."""
    for point in run.accuracy:
        if point["accuracy"] >= target:
            return point["train_s"], point["samples_seen"]
    return None


def throughput_spread(run: DashboardRun, warmup_steps: int = 2) -> tuple[float, float, float] | None:
    """(median, p10, p90) samples/s over the run's steps after warm-up (the finished run's own numbers if any)."""
    if run.result is not None:
        res = run.result
        return res.samples_per_s_median, res.samples_per_s_p10, res.samples_per_s_p90
    rates = sorted(p["samples_per_s"] for p in run.points[warmup_steps:]) or sorted(
        p["samples_per_s"] for p in run.points)
    if not rates:
        return None
    pick = lambda q: rates[min(len(rates) - 1, int(q * (len(rates) - 1) + 0.5))]  # noqa: E731
    return statistics.median(rates), pick(0.1), pick(0.9)


def repeat_spreads(runs: list[DashboardRun]) -> dict[tuple, tuple[float, float, int]]:
    """Per settings run more than once: (lowest, highest final accuracy, number of repeats)."""
    groups: dict[tuple, list[float]] = {}
    for run in runs:
        if run.final_accuracy is not None and run.result is not None and not run.stopped:
            groups.setdefault(run.settings, []).append(run.final_accuracy)
    return {key: (min(accs), max(accs), len(accs)) for key, accs in groups.items() if len(accs) > 1}


def spread_warnings(runs: list[DashboardRun], threshold: float = SPREAD_WARN) -> list[str]:
    """One line per repeated setting whose final accuracies differ by more than ``threshold``."""
    lines = []
    for (model, batch, rule, steps), (low, high, n) in repeat_spreads(runs).items():
        if high - low > threshold:
            lines.append(f"{model} bs={batch} ({rule}, {steps} steps) run {n} times: final accuracy {low:.2f} to "
                         f"{high:.2f}; a difference this size between two settings may be noise, not the setting")
    return lines


def _memory_cells(run: DashboardRun) -> dict:
    predicted = run.memory.total_bytes / 1e6 if run.memory is not None else None
    measured = run.measured_bytes / 1e6 if run.measured_bytes is not None else None
    return {"predicted_MB": predicted, "measured_MB": measured}


def results_table(runs: list[DashboardRun], target: float) -> pd.DataFrame:
    """Per run: samples/s (median, p10-p90), peak memory, time and samples to ``target`` accuracy, LR rule."""
    rows = []
    for i, run in enumerate(runs, 1):
        spread = throughput_spread(run)
        reached = time_to_target(run, target)
        rows.append({"run": i, "model": run.model, "batch": run.batch_size, "seed": run.seed,
                     "lr_rule": run.lr_rule, "lr": run.lr, "steps": len(run.points),
                     "samples/s": spread[0] if spread else None,
                     "samples/s p10-p90": f"{spread[1]:.0f}-{spread[2]:.0f}" if spread else "",
                     **_memory_cells(run),
                     "final_acc": run.final_accuracy,
                     f"s_to_{target:.2f}": reached[0] if reached else None,
                     f"samples_to_{target:.2f}": reached[1] if reached else None,
                     "state": "error" if run.error else "stopped" if run.stopped else
                     "done" if run.result is not None else "running"})
    return pd.DataFrame(rows)


def update_latency(run: DashboardRun) -> tuple[float | None, float | None]:
    """(seconds from Run to the first plotted point, median seconds between plot updates) of one run."""
    if not run.update_s:
        return None, None
    gaps = [b - a for a, b in zip(run.update_s, run.update_s[1:])]
    return run.update_s[0], statistics.median(gaps) if gaps else None


def knee_of_runs(runs: list[DashboardRun], model: str) -> int | None:
    """The knee (:func:`labkit.training.batch_size.knee_batch`) of ``model``'s finished runs, once 3+ batches ran."""
    best: dict[int, float] = {}
    for run in runs:
        spread = throughput_spread(run) if run.model == model and run.result is not None else None
        if spread is not None:
            best[run.batch_size] = max(best.get(run.batch_size, 0.0), spread[0])
    if len(best) < 3:
        return None
    sizes = sorted(best)
    return knee_batch(sizes, [best[b] for b in sizes])
