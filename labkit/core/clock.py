"""The kit's one clock: every read of time outside the device's own timeline happens here.

Torch-free, so TensorFlow-only child processes and the launcher use the same clock as the training loop.
Host elapsed time (:func:`now_s`), wall-clock stamps that other processes can compare (:func:`timestamp_s`),
timeouts (:class:`Deadline`), repeated host timings (:func:`host_times_s`) and fair comparisons under drifting
load (:func:`interleaved`, :func:`paired_median`) all come from here; device-aware timing (CUDA events,
synchronisation) builds on it in :mod:`labkit.core.timing`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TypeVar

from labkit.core.validation import checked_int, positive_int, positive_number

T = TypeVar("T")


def now_s() -> float:
    """Host time in seconds for elapsed-time arithmetic (monotonic, high resolution; not a date)."""
    return time.perf_counter()


def process_time_s() -> float:
    """CPU seconds this process has used: on a shared machine, robust to other processes' load."""
    return time.process_time()


def thread_time_s() -> float:
    """CPU seconds the calling thread has used: how much of a core one rank's step really got."""
    return time.thread_time()


def timestamp_s() -> float:
    """Wall-clock seconds since the epoch: comparable across processes (e.g. which rank failed first)."""
    return time.time()


def host_times_s(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5) -> list[float]:
    """Seconds per call of ``fn()`` on the host clock: ``warmup`` untimed calls, then ``repeats`` timed ones.

    For work that has finished when ``fn`` returns (CPU work, a TensorFlow result read back with ``.numpy()``),
    in processes without torch; work queued on a GPU needs :func:`labkit.core.timing.time_fn`, which marks the
    device's own timeline.
    """
    checked_int(warmup, "warmup", minimum=0)
    positive_int(repeats, "repeats")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = now_s()
        fn()
        times.append(now_s() - start)
    return times


class Deadline:
    """A timeout that a polling loop checks: ``deadline = Deadline(30); while not deadline.expired: ...``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = positive_number(timeout_s, "timeout_s", hint="a number of seconds")
        self._end = time.monotonic() + self.timeout_s

    @property
    def remaining_s(self) -> float:
        """Seconds left (0.0 once expired)."""
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._end


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation, as numpy does."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class TimingResult:
    """Repeated timings of one piece of work; every figure in seconds."""

    times_s: list[float] = field(repr=False)
    device: str
    clock: str = "host"            # 'events' (CUDA events), 'sync' or 'host' (now_s): see core.timing.PhaseClock

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def p10_s(self) -> float:
        return percentile(self.times_s, 10)

    @property
    def p90_s(self) -> float:
        return percentile(self.times_s, 90)

    def __str__(self) -> str:
        how = {"events": ", CUDA events", "sync": ", synchronised"}.get(self.clock, "")
        return (f"median {self.median_s * 1e3:.2f} ms (p10 {self.p10_s * 1e3:.2f}, "
                f"p90 {self.p90_s * 1e3:.2f}, n={len(self.times_s)}{how}) on {self.device}")


def interleaved(runs: Mapping[str, Callable[[], T]], rounds: int = 3) -> dict[str, list[T]]:
    """Call every run once per round, in turn, for ``rounds`` rounds -> each run's results in round order.

    Load on a shared machine drifts over seconds (the same CPU step reads 750 or 1,200 samples/s a few
    seconds apart on the CI box); back-to-back blocks then compare spells, not runs. Interleaved, a slow
    spell hits every run alike, so the best (or median) of each is a fair comparison.
    """
    rounds = positive_int(rounds, "rounds")
    if not runs:
        raise ValueError("interleaved needs at least one run, e.g. {'ceiling': lambda: measure_ceiling(...)}")
    results: dict[str, list[T]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            results[name].append(run())
    return results


def paired_median(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> float | None:
    """Median over rounds of numerator / denominator, each pair measured in the same round (None: no pair).

    The two runs of one round ran seconds apart, so load that starts or stops between rounds spoils one
    round's ratio, not the comparison; comparing each side's fastest round instead would pit a quiet round
    of one against a busy round of the other.
    """
    ratios = [n / d for n, d in zip(numerators, denominators)
              if n is not None and d is not None and math.isfinite(n) and math.isfinite(d) and d > 0]
    return statistics.median(ratios) if ratios else None
