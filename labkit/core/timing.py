"""Honest timing in one place: warm up, mark the device's own timeline, repeat, report the median.

d2l's timer forgets to synchronise the GPU, so it times kernel *launches*; this one does not. On CUDA
the marks are CUDA events read back after the last repeat (one sync in all), so timing does not stall
the queue between repeats; on a CPU they are host readings of :mod:`labkit.core.clock`, the kit's one clock.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from labkit.core.clock import TimingResult, now_s, process_time_s
from labkit.core.device import device_label
from labkit.core.validation import checked_int, positive_int


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for queued GPU work so that a clock read means 'done', not 'launched'."""
    if device is None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_fn(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 5,
            device: str | torch.device | None = None) -> TimingResult:
    """Time ``fn()`` honestly: ``warmup`` untimed calls, then ``repeats`` calls between device-time marks."""
    checked_int(warmup, "warmup", minimum=0)
    positive_int(repeats, "repeats")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = PhaseClock(dev)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    marks = [clock.mark()]
    for _ in range(repeats):
        fn()
        marks.append(clock.mark())
    clock.settle()
    times = [clock.elapsed_s(a, b) for a, b in zip(marks, marks[1:])]
    return TimingResult(times, device_label(device), clock.mode)


class Stopwatch:
    """``with Stopwatch(device) as sw: ...`` then ``sw.elapsed_s`` (synchronised at both ends).

    ``cpu_time=True`` measures this process's CPU time when the device is a CPU (robust to other processes
    sharing the cores); on a GPU it is always synchronised wall time.
    """

    def __init__(self, device: str | torch.device | None = None, *, cpu_time: bool = False) -> None:
        self.device = device
        on_cpu = device is not None and torch.device(device).type == "cpu"
        self._read = process_time_s if cpu_time and on_cpu else now_s
        self.elapsed_s = float("nan")

    def __enter__(self) -> "Stopwatch":
        synchronize(self.device)
        self._start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.elapsed_s = self._read() - self._start


class EventPool:
    """CUDA timing events made once per run and handed out again after each read-back.

    Why: creating and destroying an event costs driver calls on the step's critical path; on launch-bound steps
    (an H200 running the small CNN at 1.7 ms a step) five fresh events a step cost a fifth of the step. A pool makes
    the events a run needs once (at most two windows' worth) and reuses them, so a run's allocations do not grow
    with its steps; ``created`` counts them (the test of that promise).
    """

    def __init__(self) -> None:
        self._free: list = []
        self.created = 0

    def take(self) -> torch.cuda.Event:
        """A free event (a new one only when none is free)."""
        if self._free:
            return self._free.pop()
        self.created += 1
        return torch.cuda.Event(enable_timing=True)

    def give_back(self, events: Iterable[object]) -> None:
        """Return events whose times have been read (a recorded event may be recorded again)."""
        self._free.extend(e for e in events if isinstance(e, torch.cuda.Event))


class PhaseClock:
    """Phase boundaries that never stall the GPU unless asked to.

    ``mode='events'`` (CUDA default) records pooled ``torch.cuda.Event`` marks on the stream (:class:`EventPool`);
    they are read back a window at a time after the GPU has passed them, so the timed loop runs as fast as a bare
    one. ``mode='sync'`` synchronises at every mark (what a naive timer does: the lesson on its cost).
    ``mode='host'`` (CPU) reads the kit's clock: CPU kernels finish before the call returns.
    """

    MODES = ("events", "sync", "host")

    def __init__(self, device: torch.device, sync_every_step: bool = False) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.mode = "sync" if sync_every_step else "events"
        else:
            self.mode = "host"
        self.pool = EventPool()

    def mark(self) -> torch.cuda.Event | float:
        """A time mark: a recorded CUDA event (from the pool), or a clock reading."""
        if self.mode == "events":
            event = self.pool.take()
            event.record()
            return event
        if self.mode == "sync":
            synchronize(self.device)
        return now_s()

    def settle(self, upto: torch.cuda.Event | float | None = None) -> None:
        """Wait until the GPU has passed ``upto`` (default: everything queued); no-op off 'events' mode.

        Waiting on an older mark leaves the newer work queued: the GPU never runs dry for a read-back.
        """
        if self.mode != "events":
            return
        if isinstance(upto, torch.cuda.Event):
            upto.synchronize()
        else:
            synchronize(self.device)

    def release(self, marks: Iterable[object]) -> None:
        """Marks already read: their events go back to the pool."""
        if self.mode == "events":
            self.pool.give_back(marks)

    def elapsed_s(self, start: torch.cuda.Event | float, end: torch.cuda.Event | float) -> float:
        """Seconds between two marks (settle past ``end`` first in 'events' mode)."""
        if self.mode == "events":
            return start.elapsed_time(end) / 1e3
        return end - start
