"""One timed training step (the inside of :func:`labkit.training.loop.train`): copy, forward, backward, update.

Phase boundaries are marks of a :class:`labkit.core.timing.PhaseClock`: CUDA events by default (nothing
here waits for the GPU; the loop reads the marks once per window), a device sync per mark with
``sync_every_step=True``, the host clock (:mod:`labkit.core.clock`) on a CPU. The loss stays on the device until
the loop reads it.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from labkit.core.dtypes import autocast
from labkit.core.timing import PhaseClock
from labkit.memory.model import MemoryBreakdown, build_memory_model
from labkit.memory.probe import preserved_state
from labkit.training.config import TrainConfig
from labkit.training.flops import count_training_flops

NAN = math.nan


class Stepper:
    """Holds model, optimizer, loss, AMP state; ``step(i, batch)`` returns the phase times of one step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, device: torch.device,
                 clock: PhaseClock | None = None) -> None:
        self.model, self.optimizer, self.config, self.device = model, optimizer, config, device
        self.loss_fn = nn.CrossEntropyLoss()
        self.clock = clock or PhaseClock(device, config.sync_every_step)
        self.scaler = torch.amp.GradScaler("cuda") if config.amp_dtype == "fp16" else None
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_loss: torch.Tensor | None = None
        self.last_inputs: torch.Tensor | None = None
        model.train()

    def _autocast(self):
        return autocast(self.device.type, self.config.amp_dtype)

    def _set_lr(self, i: int) -> None:
        """Linear warm-up from lr/10 to lr over ``lr_warmup_steps`` (Goyal et al. 2017, gradual warm-up)."""
        n = self.config.lr_warmup_steps
        if n and i <= n:
            frac = 0.1 + 0.9 * min(1.0, i / n)
            for group, base in zip(self.optimizer.param_groups, self.base_lrs):
                group["lr"] = base * frac

    def _forward(self, i: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            if i > 0:
                return self.loss_fn(self.model(x), y)
            try:
                out = self.model(x)
            except RuntimeError as err:
                raise ValueError(f"{type(self.model).__name__} does not accept batches of shape {tuple(x.shape)}: "
                                 f"{str(err).splitlines()[0]}. Build the model for this data's image shape "
                                 "(see labkit.build_model)") from None
            if out.ndim != 2 or out.shape[0] != x.shape[0]:
                raise ValueError(f"model output has shape {tuple(out.shape)}; expected (batch, classes)")
            return self.loss_fn(out, y)

    def step(self, i: int, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        """Run one step on ``batch`` = (inputs, targets); returns its phase marks, loss tensor and samples."""
        x, y = batch
        mark = self.clock.mark
        t0 = mark()
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        if self.config.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        t1 = mark()
        self._set_lr(i)
        loss = self._forward(i, x, y)
        t2 = mark()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        t3 = mark()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t4 = mark()
        self.last_loss, self.last_inputs = loss.detach(), x
        return dict(marks=(t0, t1, t2, t3, t4), loss=self.last_loss, samples=int(x.shape[0]))

    def probe(self) -> tuple[float, MemoryBreakdown] | tuple[None, None]:
        """(training FLOPs per sample, MemoryBreakdown at the run's batch size) from 2- and 4-sample probes."""
        if self.last_inputs is None:
            return None, None
        x = self.last_inputs
        shape = tuple(x.shape[1:])
        with preserved_state(self.model), self._autocast():
            flops = count_training_flops(self.model, x[:2].clone() if x.shape[0] >= 2 else x.clone())
        flops_per_sample = flops / min(2, x.shape[0])
        mem = build_memory_model(self.model, shape, self.config.optimizer, self.config.momentum,
                                 amp_dtype=self.config.amp_dtype)
        return flops_per_sample, mem.predict(int(x.shape[0]))
