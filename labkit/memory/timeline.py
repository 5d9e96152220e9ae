"""When is training memory at its peak? A walk through the backward pass, layer by layer.

The sum "parameters + gradients + optimizer state + activations" is not the peak: the backward pass
frees a layer's saved activations right after that layer's gradient is computed, while parameter
gradients appear one layer at a time, and each layer briefly holds its output's and input's gradient.
We record, per leaf module in forward order, the saved-for-backward bytes it was first to save, its
parameters' bytes and its input/output bytes, then replay the backward pass in reverse order. On an
H100 this replay predicts the measured step peak within 5% (bf16 all rows; fp32 from batch 64; see
``data/recorded_h100_reference.json``). What it cannot see from shapes: cuDNN's convolution workspaces,
chosen on the GPU; measure them there (:mod:`labkit.memory.workspaces`) and the replay adds each one at the
moment its layer runs, forward or backward.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from labkit.memory.probe import leaf_modules
from labkit.memory.saved import SavedStorages, storage_bytes, watch_saved


@dataclass(frozen=True)
class LayerMemory:
    """One leaf module's memory terms at one batch size, in bytes."""

    saved_bytes: float           # storages this layer was the first to save for backward
    grad_bytes: float            # its trainable parameters (their gradients have the same size)
    io_bytes: float              # its input + output (the gradients flowing through it have these sizes)


@dataclass(frozen=True)
class LayerWorkspace:
    """Bytes one layer call borrows on top of the tensors it takes and returns."""

    forward_bytes: int
    backward_bytes: int


@dataclass(frozen=True)
class LayerLine:
    """A layer's terms as lines in the batch size: ``per_sample * batch + fixed``."""

    saved_per_sample: float
    saved_fixed: float
    grad_bytes: float
    io_per_sample: float
    io_fixed: float

    def at(self, batch_size: int, act_scale: float = 1.0) -> LayerMemory:
        """This layer's terms at ``batch_size`` (activation terms rescaled by ``act_scale``)."""
        saved = (self.saved_per_sample * batch_size + self.saved_fixed) * act_scale
        io = (self.io_per_sample * batch_size + self.io_fixed) * act_scale
        return LayerMemory(max(0.0, saved), self.grad_bytes, max(0.0, io))


def layer_memory(model: nn.Module, inputs: torch.Tensor,
                 autocast: contextlib.AbstractContextManager | None = None) -> list[LayerMemory]:
    """Per leaf module, in forward order: saved, gradient and input/output bytes of one forward pass."""
    saved = SavedStorages(exclude=model.parameters())
    leaves = leaf_modules(model)
    rows: list[list[float]] = []

    def before(mod, args):
        grads = sum(p.numel() * p.element_size() for p in mod.parameters(recurse=False) if p.requires_grad)
        rows.append([0.0, float(grads), float(sum(storage_bytes(a) for a in args))])

    def after(mod, args, out):
        rows[-1][2] += storage_bytes(out)

    def on_save(t: torch.Tensor) -> None:
        if rows and saved.on_save(t):
            rows[-1][0] += storage_bytes(t)

    handles = [m.register_forward_pre_hook(before) for m in leaves]
    handles += [m.register_forward_hook(after) for m in leaves]
    try:
        with watch_saved(on_save), (autocast or contextlib.nullcontext()):
            out = model(inputs)
        del out
    finally:
        for h in handles:
            h.remove()
    return [LayerMemory(*r) for r in rows]


def fit_layer_lines(small: list[LayerMemory], large: list[LayerMemory], b_small: int,
                    b_large: int) -> tuple[LayerLine, ...]:
    """Lines through two probe batches, layer by layer (the layers must match)."""
    if len(small) != len(large):
        raise ValueError("the two probe passes ran different layers; is the model's forward data-dependent?")
    span = b_large - b_small
    lines = []
    for s, big in zip(small, large):
        saved_ps, io_ps = (big.saved_bytes - s.saved_bytes) / span, (big.io_bytes - s.io_bytes) / span
        lines.append(LayerLine(saved_ps, s.saved_bytes - saved_ps * b_small, s.grad_bytes,
                               io_ps, s.io_bytes - io_ps * b_small))
    return tuple(lines)


def forward_peak_bytes(layers: list[LayerMemory], workspaces: Sequence[LayerWorkspace] = ()) -> float:
    """Peak bytes of saved activations while the forward pass walks the layers (no gradients exist yet).

    At layer i: everything saved by layers < i, plus layer i's input and output, plus its workspace.
    Without workspaces this never beats the backward peak; a large forward workspace can.
    """
    saved = peak = 0.0
    for i, layer in enumerate(layers):
        peak = max(peak, saved + layer.io_bytes + (workspaces[i].forward_bytes if workspaces else 0))
        saved += layer.saved_bytes
    return peak


def backward_peak_bytes(layers: list[LayerMemory], workspaces: Sequence[LayerWorkspace] = ()) -> float:
    """Peak bytes of saved activations + gradients while the backward pass walks the layers in reverse.

    At layer i: everything saved by layers <= i is still alive, gradients of layers > i exist, and
    layer i holds the gradients of its input and output and of its own parameters, plus its workspace.
    """
    live_saved = sum(layer.saved_bytes for layer in layers)
    grads_done = peak = 0.0
    for i in reversed(range(len(layers))):
        layer = layers[i]
        held = live_saved + grads_done + layer.io_bytes + layer.grad_bytes
        peak = max(peak, held + (workspaces[i].backward_bytes if workspaces else 0))
        live_saved -= layer.saved_bytes
        grads_done += layer.grad_bytes
    return peak
