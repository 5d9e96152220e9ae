"""The profiler's step schedule: which training steps ``torch.profiler`` skips, warms up on and records.

``wait`` steps untouched (let caches and the allocator settle), ``warmup`` steps traced but thrown away
(the tracer's own start-up cost), ``active`` steps kept, the whole cycle ``repeat`` times, after
``skip_first`` steps. The arithmetic here says how many steps to run and which ones end up in the traces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.profiler import schedule

from labkit.core.validation import checked_int, positive_int


@dataclass(frozen=True)
class ProfileSchedule:
    """The profiler's step schedule; ``steps_needed`` steps must run for every cycle to complete."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "skip_first"):
            checked_int(getattr(self, name), name, minimum=0, hint="it counts training steps")
        positive_int(self.active, "active", hint="with active=0 the profiler records no step at all")
        positive_int(self.repeat, "repeat", hint="torch's repeat=0 means 'forever', which never finishes here")

    @property
    def cycle_steps(self) -> int:
        """Steps in one wait + warmup + active cycle."""
        return self.wait + self.warmup + self.active

    @property
    def steps_needed(self) -> int:
        """Training steps to run so that every cycle completes and writes its trace."""
        return self.skip_first + self.cycle_steps * self.repeat

    @property
    def profiled_steps(self) -> int:
        """Steps that end up in the traces."""
        return self.active * self.repeat

    def active_step_numbers(self) -> list[int]:
        """Indices (0-based, as in ``ProfilerStep#N``) of the recorded steps."""
        return [self.skip_first + c * self.cycle_steps + self.wait + self.warmup + i
                for c in range(self.repeat) for i in range(self.active)]

    def to_torch(self) -> Callable:
        """The same schedule as ``torch.profiler.schedule``."""
        return schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat,
                        skip_first=self.skip_first)
