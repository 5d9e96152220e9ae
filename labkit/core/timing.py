"""Honest timing in one place: warm up, mark the device's own timeline, repeat, report the median.

d2l's timer forgets to synchronise the GPU, so it times kernel *launches*; this one does not. On CUDA
the marks are CUDA events read back after the last repeat (one sync in all), so timing does not stall
the queue between repeats; on a CPU they are host readings of :mod:`labkit.core.clock`, the kit's one clock.
"""
from __future__ import annotations

from typing import Callable

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


class PhaseClock:
    """Phase boundaries that never stall the GPU unless asked to.

    ``mode='events'`` (CUDA default) records ``torch.cuda.Event`` marks on the stream; they are read
    back in one synchronisation per window (:meth:`settle`), so the timed loop runs as fast as a bare
    one. ``mode='sync'`` synchronises at every mark (what a naive timer does: the lesson on its cost).
    ``mode='host'`` (CPU) reads ``perf_counter``: CPU kernels finish before the call returns.
    """

    MODES = ("events", "sync", "host")

    def __init__(self, device: torch.device, sync_every_step: bool = False) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.mode = "sync" if sync_every_step else "events"
        else:
            self.mode = "host"

    def mark(self) -> torch.cuda.Event | float:
        """A time mark: a recorded CUDA event, or a perf_counter reading."""
        if self.mode == "events":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.mode == "sync":
            synchronize(self.device)
        return now_s()

    def settle(self) -> None:
        """Wait once for every recorded mark (the only sync of a window in 'events' mode)."""
        if self.mode == "events":
            synchronize(self.device)

    def elapsed_s(self, start: torch.cuda.Event | float, end: torch.cuda.Event | float) -> float:
        """Seconds between two marks (call :meth:`settle` first in 'events' mode)."""
        if self.mode == "events":
            return start.elapsed_time(end) / 1e3
        return end - start
