"""The loop's read-back windows and the public payload a ``train(..., callback=)`` receives.

Steps are timed with marks that are read back a window at a time, and a window's losses come back in one
transfer. On a GPU a closed window is read only once the GPU has passed its last mark, while the next window's
work is already queued: the read-back never drains the queue (a whole-device sync happens only where a callback
asks for the newest rows, and at the end). Only then are the :class:`labkit.training.loop.StepRecord` rows built,
so a callback sees finished, honest rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from labkit.core.timing import PhaseClock
from labkit.training.run_spec import RunSpec

NAN = math.nan


@dataclass(frozen=True)
class PendingStep:
    """One step whose marks have been recorded but not read back yet."""

    step: int
    epoch: int
    start_mark: object          # end of the previous step (or the clock restart after a read-back)
    marks: tuple                # per phase: (before copy, after copy, after forward, after backward, after update);
    loss: torch.Tensor          # whole step: (after update,). The loss is detached, still on the device
    samples: int


def _losses_off_device(pending: list[PendingStep]) -> torch.Tensor:
    """The window's losses, copied to the host without waiting (pinned memory, queued behind the steps)."""
    losses = torch.stack([p.loss.float() for p in pending])
    if losses.device.type != "cuda":
        return losses
    host = torch.empty(losses.shape, dtype=losses.dtype, pin_memory=True)
    host.copy_(losses, non_blocking=True)
    return host


class Window:
    """Closed steps waiting to be read: their marks, their losses on the way to the host and a ``ready`` mark
    recorded after that copy (once the GPU passes it, everything in the window can be read without a full sync)."""

    def __init__(self, pending: list[PendingStep], clock: PhaseClock) -> None:
        self.pending = pending
        self.losses = _losses_off_device(pending)
        self.ready = clock.mark()

    def read(self, clock: PhaseClock) -> list[dict]:
        """StepRecord field dicts; the window's events go back to the clock's pool."""
        clock.settle(self.ready)
        rows = step_rows(self.pending, self.losses.tolist(), clock)
        marks = {id(m): m for p in self.pending for m in (p.start_mark, *p.marks)}   # a step's end starts the next
        clock.release([self.ready, *marks.values()])
        return rows


def settle(pending: list[PendingStep], clock: PhaseClock) -> list[dict]:
    """Read steps back at once (one wait for the device, one loss transfer): StepRecord field dicts."""
    if not pending:
        return []
    return Window(pending, clock).read(clock)


def step_rows(pending: list[PendingStep], losses: list[float], clock: PhaseClock) -> list[dict]:
    """Rows from read marks. ``data_wait_s`` runs from the previous step's end to this step's first work: on a GPU
    with events, the time the GPU sat idle waiting for the batch (host waits that overlap queued GPU work cost
    nothing and count nothing); on a CPU or with sync, the host's wait for the loader. Whole-step timing (one mark
    a step) leaves the phases NaN: they were not timed."""
    rows = []
    for p, loss in zip(pending, losses):
        step_time_s = clock.elapsed_s(p.start_mark, p.marks[-1])
        if len(p.marks) == 5:
            t0, t1, t2, t3, t4 = p.marks
            phases = (clock.elapsed_s(p.start_mark, t0), clock.elapsed_s(t0, t1), clock.elapsed_s(t1, t2),
                      clock.elapsed_s(t2, t3), clock.elapsed_s(t3, t4))
        else:
            phases = (NAN,) * 5
        rows.append(dict(step=p.step, epoch=p.epoch, data_wait_s=phases[0], h2d_s=phases[1], forward_s=phases[2],
                         backward_s=phases[3], optimizer_s=phases[4], step_time_s=step_time_s, loss=float(loss),
                         samples=p.samples,
                         samples_per_s=p.samples / step_time_s if step_time_s > 0 else float("inf")))
    return rows


@dataclass(frozen=True)
class TrainProgress:
    """What ``callback(record, progress)`` gets from :func:`labkit.training.loop.train` (public, stable contract).

    records       every StepRecord read back so far, in step order (``records[-1] is record``)
    steps_done    steps run so far; ``total_steps`` the steps the config asks for
    model         the module being trained (already on ``device``; in train mode)
    last_inputs   the last batch of inputs as the model saw it (on ``device``, after channels_last):
                  what an activation-memory measurement needs
    run           the run trained (:class:`labkit.training.run_spec.RunSpec`): its optimizer and precision are what
                  the memory model needs (``run.memory_model(model, sample_shape)``)
    lr            the current learning rate (after LR warm-up)
    device        the torch device string, e.g. 'cuda:0' or 'cpu'
    """

    records: tuple
    steps_done: int
    total_steps: int
    model: nn.Module
    last_inputs: torch.Tensor | None
    run: RunSpec
    lr: float
    device: str
