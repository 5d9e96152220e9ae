"""How much CPU a run actually got: "the machine was busy" as a number, never a guess.

A process that wants a core and gets one runs; on a shared machine (Binder, a laptop with a browser, a CI
runner) it also waits in the scheduler's run queue while other processes hold the cores. Linux counts both per
thread in ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on a CPU, nanoseconds runnable but waiting), so the
share of a core a process got while it wanted one is ``on_cpu / (on_cpu + waiting)``: 1.0 on a quiet machine,
0.5 when it shares its core with one spinning neighbour. Time blocked on a socket or a sleep is neither, so a rank
waiting for its peers in an all-reduce does not look starved. Where schedstat is missing (macOS), the share
falls back to process CPU time over wall time. Torch-free: ranks, TensorFlow children and the kernel all use it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from labkit.core.clock import now_s, process_time_s, timestamp_s
from labkit.core.gpu_neighbours import gpu_neighbours

_NS = 1e-9
MIN_SHARE = 1e-3        # a process that ran at all got more than this; keeps a share usable as a divisor


@dataclass(frozen=True)
class SchedTotals:
    """Seconds a process's live threads spent on a CPU and waiting runnable for one (since they started)."""

    on_cpu_s: float
    waiting_s: float


def sched_totals(pid: int | None = None) -> SchedTotals | None:
    """Sum of every thread's schedstat for ``pid`` (default: this process); None where the kernel has none."""
    task_dir = Path(f"/proc/{pid or os.getpid()}/task")
    on_cpu_ns = waiting_ns = 0
    try:
        for task in task_dir.iterdir():
            try:
                fields = (task / "schedstat").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue                    # a thread that ended between the listing and the read
            on_cpu_ns, waiting_ns = on_cpu_ns + int(fields[0]), waiting_ns + int(fields[1])
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    return SchedTotals(on_cpu_ns * _NS, waiting_ns * _NS)


@dataclass(frozen=True)
class CpuShare:
    """What one process got over one measured stretch: CPU seconds, run-queue seconds, wall seconds."""

    on_cpu_s: float
    waiting_s: float | None         # None: no schedstat here, the share is CPU time over wall time
    wall_s: float

    @property
    def share(self) -> float:
        """Fraction of a core the process got while it wanted one (1.0: never waited for a CPU).

        The totals are summed over the process's threads, and a thread that ends between the two readings (a
        DataLoader's pin-memory thread) takes its totals with it: a difference can come out negative, so the wait
        counts from zero and the share stays in (0, 1] (a busy run measured 1.07 of a core, which the verdict's
        load refused)."""
        if self.waiting_s is not None:
            wanted_s = self.on_cpu_s + max(0.0, self.waiting_s)
            return 1.0 if wanted_s <= 0 else min(1.0, max(MIN_SHARE, self.on_cpu_s / wanted_s))
        return 1.0 if self.wall_s <= 0 else min(1.0, max(MIN_SHARE, self.on_cpu_s / self.wall_s))

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready, for a rank to send home with its timings."""
        return {"on_cpu_s": self.on_cpu_s, "waiting_s": self.waiting_s, "wall_s": self.wall_s}


ShareMark = tuple[SchedTotals | None, float, float]


def share_mark() -> ShareMark:
    """Where this process stands now (scheduler totals, CPU time, wall time): the start of a measured stretch."""
    return sched_totals(), process_time_s(), now_s()


def share_since(mark: ShareMark) -> CpuShare:
    """What this process got since ``mark`` (:func:`share_mark`): a look in the middle of a run, no block needed."""
    sched0, cpu0, wall0 = mark
    sched1, wall_s = sched_totals(), now_s() - wall0
    if sched0 is not None and sched1 is not None:
        return CpuShare(sched1.on_cpu_s - sched0.on_cpu_s, sched1.waiting_s - sched0.waiting_s, wall_s)
    return CpuShare(process_time_s() - cpu0, None, wall_s)


class ShareMeter:
    """``with ShareMeter() as meter: work()`` then ``meter.result``: the CPU share this process got meanwhile, and
    ``meter.gpu_neighbours``: the processes outside this one's tree that computed on a GPU meanwhile
    (:mod:`labkit.core.gpu_neighbours`; empty on a machine without a GPU)."""

    def __init__(self) -> None:
        self.result: CpuShare | None = None
        self.gpu_neighbours: dict[str, float] = {}
        self._start: tuple[SchedTotals | None, float, float] | None = None
        self._stamp_s = 0.0

    def __enter__(self) -> "ShareMeter":
        self._start = share_mark()
        self._stamp_s = timestamp_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = share_since(self._start)  # type: ignore[arg-type]
        self.gpu_neighbours = gpu_neighbours(self._stamp_s)

    @property
    def share(self) -> float:
        """The measured share (1.0 before the block has ended)."""
        return 1.0 if self.result is None else self.result.share


def combined_share(shares: list[CpuShare]) -> CpuShare:
    """Several stretches of one process (e.g. every round of one run) as one: totals, not a mean of ratios."""
    if not shares:
        raise ValueError("combined_share needs at least one measured stretch")
    waits = [s.waiting_s for s in shares]
    waiting = None if any(w is None for w in waits) else sum(waits)  # type: ignore[arg-type]
    return CpuShare(sum(s.on_cpu_s for s in shares), waiting, sum(s.wall_s for s in shares))


def describe_shares(shares: Mapping[str, float]) -> str:
    """'rank 0 got 0.46 of a core, rank 1 got 0.51' for a verdict's reason line."""
    return ", ".join(f"{name} got {share:.2f} of a core" for name, share in shares.items())


SPIN_CODE = "while True: pass"


@contextmanager
def spinning_cores(count: int = 1) -> Iterator[list[int]]:
    """Keep ``count`` plain processes spinning (one core each) for the block; always stopped after -> their pids.

    The stand-in for a busy laptop or a Binder neighbour: the lessons that teach oversubscription and the
    busy-machine test run (``make test-busy``) start one, measure, and stop it.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an integer >= 0 (spinning processes), got {count!r}")
    procs = [subprocess.Popen([sys.executable, "-c", SPIN_CODE], stdin=subprocess.DEVNULL)
             for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
