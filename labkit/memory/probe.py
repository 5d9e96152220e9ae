"""Probing a model without changing it: the leaf modules a probe hooks, a forward pass run only for its hooks,
and the state (BatchNorm statistics, gradients, train mode) every probe puts back. The first step of the memory
home: the timeline, the workspaces, the model and the checks all probe through here.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def leaf_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that do the work (no children): the layers the replay walks, in definition order."""
    return [m for m in model.modules() if not list(m.children())]


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Run a probe pass without side effects: buffers (BatchNorm statistics), grads and train mode restored."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in model.named_parameters()}
    was_training = model.training
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        for name, p in model.named_parameters():
            p.grad = grads[name]
        model.train(was_training)


def probe_forward(model: nn.Module, inputs: torch.Tensor, handles: list,
                  context: contextlib.AbstractContextManager | None = None) -> None:
    """One training-mode forward pass run only for its hooks: side-effect free, the hooks removed after."""
    try:
        with preserved_state(model), (context or contextlib.nullcontext()):
            model.train()
            out = model(inputs)
            del out
    finally:
        for h in handles:
            h.remove()
