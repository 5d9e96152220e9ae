"""One timed training step (the inside of :func:`labkit.training.loop.train`): the kit's one step, marked.

Phase boundaries are marks of a :class:`labkit.core.timing.PhaseClock`: CUDA events by default (nothing
here waits for the GPU; the loop reads the marks once per window), a device sync per mark with
``sync_every_step=True``, the host clock (:mod:`labkit.core.clock`) on a CPU. The loss stays on the device until
the loop reads it.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from labkit.core.dtypes import autocast
from labkit.core.step import TrainStep
from labkit.core.timing import PhaseClock
from labkit.memory.model import MemoryBreakdown
from labkit.memory.probe import preserved_state
from labkit.training.config import TrainConfig
from labkit.training.flops import count_training_flops

NAN = math.nan


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The share of the full LR at ``step``: linear from 1/10 to 1 over ``warmup_steps`` (Goyal et al. 2017, 2.2)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return 0.1 + 0.9 * max(0, step) / warmup_steps


class _MarkAtEnd:
    """The step's ``phase``: a clock mark as each phase ends, after one at the start (five marks per step)."""

    __slots__ = ("mark", "marks")

    def __init__(self, mark) -> None:
        self.mark, self.marks = mark, [mark()]

    def __call__(self, name: str) -> _MarkAtEnd:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        self.marks.append(self.mark())
        return False


class Stepper:
    """The loop's side of the one step (:class:`labkit.core.step.TrainStep`): learning-rate warm-up, a clock
    mark at each phase boundary, the last loss and inputs; ``step(i, batch)`` returns the phase marks."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, device: torch.device,
                 clock: PhaseClock | None = None) -> None:
        self.model, self.optimizer, self.config, self.device = model, optimizer, config, device
        self.train_step = TrainStep(model, optimizer, options=config.spec.step_options(), device=device)
        self.clock = clock or PhaseClock(device, config.sync_every_step)
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.per_phase = config.timing == "phases"
        self.last_inputs: torch.Tensor | None = None
        model.train()

    def _autocast(self):
        return autocast(self.device.type, self.config.spec.precision)

    def _set_lr(self, i: int) -> None:
        """Linear warm-up from lr/10 to lr over ``lr_warmup_steps`` (Goyal et al. 2017, gradual warm-up)."""
        n = self.config.spec.lr_warmup_steps
        if n and i <= n:
            frac = warmup_factor(i, n)
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base * frac

    def step(self, i: int, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[tuple, torch.Tensor, int]:
        """Run one step on ``batch`` = (inputs, targets); returns (its marks, its loss tensor, its samples).

        ``timing='phases'``: a mark at the start and after each phase (five); ``timing='step'``: one mark at the
        end, the cheapest honest instrument (one event a step on a GPU, nothing else on its critical path)."""
        self._set_lr(i)
        if self.per_phase:
            marks = _MarkAtEnd(self.clock.mark)
            loss, samples, self.last_inputs = self.train_step(batch[0], batch[1], phase=marks)
            return tuple(marks.marks), loss, samples
        loss, samples, self.last_inputs = self.train_step(batch[0], batch[1])
        return (self.clock.mark(),), loss, samples

    def probe(self) -> tuple[float, MemoryBreakdown] | tuple[None, None]:
        """(training FLOPs per sample, MemoryBreakdown at the run's batch size) from 2- and 4-sample probes."""
        if self.last_inputs is None:
            return None, None
        x = self.last_inputs
        shape = tuple(x.shape[1:])
        with preserved_state(self.model), self._autocast():
            flops = count_training_flops(self.model, x[:2].clone() if x.shape[0] >= 2 else x.clone())
        flops_per_sample = flops / min(2, x.shape[0])
        mem = self.config.spec.memory_model(self.model, shape)
        return flops_per_sample, mem.predict(int(x.shape[0]))
