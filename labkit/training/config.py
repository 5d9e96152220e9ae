"""How long to train and what to measure, around one run: the loop's config.

What is trained and how (optimizer, learning rate, precision, memory format, warm-up, seed) is one
:class:`labkit.training.run_spec.RunSpec`, checked once where it is made; this value adds only the run's length and
the instruments, so no fact of the run is written or checked twice. Its own module because both the loop
(:mod:`labkit.training.loop`) and the step it drives (:mod:`labkit.training.stepper`) read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.validation import checked_int, positive_int
from labkit.training.run_spec import RunSpec

TIMINGS = ("phases", "step")
DEFAULT_RUN = RunSpec()     # SGD with momentum 0.9 at lr 0.05 in fp32: what a config without a run trains


@dataclass(frozen=True)
class TrainConfig:
    """How long (steps or epochs) and what to measure, for the run ``run`` (default: :data:`DEFAULT_RUN`).

    ``train`` trains the model and the batches it is handed; a given ``run`` must describe them: a loader whose
    batch size differs from ``run.batch_size`` is refused (build it with ``run.loader(dataset)``).
    """

    steps: int | None = None
    epochs: int | None = None
    run: RunSpec | None = None
    warmup_steps: int = 2
    device: str | None = None
    sync_every_step: bool = False   # True: a device sync at every phase boundary (the costly classic timer)
    read_every: int = 25            # read timing marks and losses back once per this many steps
    timing: str = "phases"          # 'phases': data wait, copy, forward, backward, update; 'step': whole steps only
    evaluate: bool = True
    progress: bool = True
    log_every: int = 1
    profile_model: bool = True      # count FLOPs and fit the memory model on a 2- and 4-sample probe

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps= or epochs= (e.g. TrainConfig(steps=50))")
        for name in ("steps", "epochs"):
            checked_int(getattr(self, name), name, allow_none=True)
        if self.run is not None and not isinstance(self.run, RunSpec):
            raise ValueError(f"run must be a labkit RunSpec (e.g. RunSpec(lr=0.1, batch_size=64)), got "
                             f"{type(self.run).__name__}")
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {TIMINGS} ('step' times whole steps only, the cheapest on a "
                             f"launch-bound GPU step), got {self.timing!r}")
        checked_int(self.warmup_steps, "warmup_steps", minimum=0)
        for name in ("log_every", "read_every"):
            positive_int(getattr(self, name), name)

    @property
    def spec(self) -> RunSpec:
        """The run trained: ``run``, or :data:`DEFAULT_RUN` when none was given."""
        return self.run if self.run is not None else DEFAULT_RUN

    @classmethod
    def fast(cls, **overrides: Any) -> TrainConfig:
        """A CPU-sized preset for tests and fast mode: 10 steps, no progress bar."""
        return cls(**{"steps": 10, "progress": False, **overrides})
