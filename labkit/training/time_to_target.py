"""Time to a target accuracy, the figure the trusted benchmarks report instead of samples/s.

MLPerf Training's rules (mlcommons.org, "MLPerf Training Rules", timing and results sections): the clock starts
before any training data is touched and stops when the quality target is reached; a result is several runs with
different seeds, the fastest and the slowest dropped and the rest averaged (the "olympic" mean). DAWNBench (Coleman
et al. 2018, arXiv 1806.01427) found time-to-accuracy varies little from run to run at a well-chosen threshold, and
that the threshold matters. Two ways here: :func:`time_runs` times whole runs that way; :func:`time_from_steps`
predicts each batch's time as steps to the target times its measured step time (McCandlish et al. 2018's S(B)
times a throughput sweep).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from labkit.core.clock import now_s


def olympic_mean(times_s: Sequence[float]) -> float:
    """The mean after dropping the fastest and the slowest run (MLPerf Training's olympic scoring); needs 3 runs."""
    if len(times_s) < 3:
        raise ValueError(f"the olympic mean drops two runs, so it needs 3 or more, got {len(times_s)}")
    kept = sorted(times_s)[1:-1]
    return statistics.fmean(kept)


@dataclass(frozen=True)
class TimeToTarget:
    """One recipe's timed runs to the target: per-seed seconds (inf = missed), olympic mean and spread."""

    label: str
    times_s: tuple[float, ...]
    seeds: tuple[int, ...]

    @property
    def missed(self) -> int:
        return sum(1 for t in self.times_s if not math.isfinite(t))

    @property
    def reached(self) -> bool:
        """At most one seed missed: the olympic drop may discard one slowest run, never two."""
        return self.missed <= 1

    @property
    def olympic_mean_s(self) -> float:
        """inf where more than one seed missed the target (MLPerf would not accept the result)."""
        return olympic_mean(self.times_s) if self.reached else math.inf

    @property
    def spread(self) -> float:
        """(slowest - fastest) / olympic mean over the seeds that reached the target."""
        done = [t for t in self.times_s if math.isfinite(t)]
        if len(done) < 2 or not math.isfinite(self.olympic_mean_s):
            return math.nan
        return (max(done) - min(done)) / self.olympic_mean_s

    def __str__(self) -> str:
        if not self.reached:
            return f"{self.label}: missed the target in {self.missed} of {len(self.times_s)} seeds"
        return (f"{self.label}: {self.olympic_mean_s:.2f} s olympic mean of {len(self.times_s)} seeds "
                f"(spread {self.spread:.0%})")


def time_runs(run_to_target: Callable[[int], bool], seeds: Sequence[int], label: str = "") -> TimeToTarget:
    """Time ``run_to_target(seed)`` (it loads the data, builds the model, trains; True = target reached) for each
    seed, the clock started before the call touches any data; a miss counts as inf."""
    if len(seeds) < 3:
        raise ValueError(f"give 3 or more seeds (the olympic mean drops two), got {list(seeds)}")
    times = []
    for seed in seeds:
        start = now_s()
        reached = run_to_target(seed)
        times.append(now_s() - start if reached else math.inf)
    return TimeToTarget(label, tuple(times), tuple(seeds))


def time_from_steps(steps: Mapping[int, float], step_time_s: Mapping[int, float]) -> dict[int, float]:
    """Seconds to the target per batch size: steps to the target x that batch's measured step time."""
    return {b: steps[b] * step_time_s[b] for b in steps if b in step_time_s}


def fastest(times_s: Mapping[object, float]) -> object:
    """The key with the least finite time (ValueError where none reached the target)."""
    finite = {k: t for k, t in times_s.items() if math.isfinite(t)}
    if not finite:
        raise ValueError("no entry reached the target")
    return min(finite, key=finite.get)
