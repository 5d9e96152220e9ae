"""The loop's read-back window and the public payload a ``train(..., callback=)`` receives.

Steps are timed with marks that are read back once per window (one device sync per window on a GPU,
none per step), and the losses of the window come back in one transfer. Only then are the
:class:`labkit.training.loop.StepRecord` rows built, so a callback sees finished, honest rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from labkit.core.timing import PhaseClock


@dataclass(frozen=True)
class PendingStep:
    """One step whose marks have been recorded but not read back yet."""

    step: int
    epoch: int
    start_mark: object          # end of the previous step (or the clock restart after a callback)
    marks: tuple                # (before copy, after copy, after forward, after backward, after update)
    loss: torch.Tensor          # detached, still on the device
    samples: int


def settle(pending: list[PendingStep], clock: PhaseClock) -> list[dict]:
    """Read a window back: one wait for the device, one loss transfer; StepRecord field dicts.

    ``data_wait_s`` is the time from the previous step's end to this step's first work: on a GPU with
    events that is the time the GPU sat idle waiting for the batch (host waits that overlap queued GPU
    work cost nothing and count nothing); on a CPU or with sync, the host's wait for the loader.
    """
    if not pending:
        return []
    clock.settle()
    losses = torch.stack([p.loss.float() for p in pending]).tolist()
    rows = []
    for p, loss in zip(pending, losses):
        t0, t1, t2, t3, t4 = p.marks
        step_time_s = clock.elapsed_s(p.start_mark, t4)
        rows.append(dict(step=p.step, epoch=p.epoch, data_wait_s=clock.elapsed_s(p.start_mark, t0),
                         h2d_s=clock.elapsed_s(t0, t1), forward_s=clock.elapsed_s(t1, t2),
                         backward_s=clock.elapsed_s(t2, t3), optimizer_s=clock.elapsed_s(t3, t4),
                         step_time_s=step_time_s, loss=float(loss), samples=p.samples,
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
    optimizer, lr, momentum, weight_decay, amp_dtype
                  the optimizer settings of the run (``lr`` is the current one, after LR warm-up):
                  what the memory model (``labkit.memory.model.build_memory_model``) needs
    device        the torch device string, e.g. 'cuda:0' or 'cpu'
    """

    records: tuple
    steps_done: int
    total_steps: int
    model: nn.Module
    last_inputs: torch.Tensor | None
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    amp_dtype: str | None
    device: str
