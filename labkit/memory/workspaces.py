"""GPU workspaces: the memory a training step borrows that no tensor shape shows.

cuDNN picks an algorithm for each convolution from its shapes, dtype and math mode, and borrows scratch
memory for it from PyTorch's caching allocator for the length of the call. No shape predicts it, so the
memory model cannot see it from a CPU. On the recorded H100 (``data/recorded_h100_reference.json``)
it is why fp32 steps at small batches sat above the model: ResNet-18 at batch 16 by 20 MB, the small CNN at
batch 64 by 48 MB, while its activations are 41 MB. So we measure it where it happens: each leaf layer
alone on the GPU, at the step's input shapes and dtypes, forward and backward, as the peak allocated minus
the tensors the call leaves behind. The memory model (:meth:`labkit.memory.model.MemoryModel.predict`)
adds each layer's workspace at the moment that layer runs; a workspace only raises the step's peak where
it is larger than the slack at that moment. cuBLAS's workspace is not here: cuBLAS allocates it once per
process and keeps it, so it sits in the baseline every measurement subtracts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from labkit.core.dtypes import autocast
from labkit.core.validation import positive_int
from labkit.memory.device import tensor_bytes
from labkit.memory.probe import leaf_modules, preserved_state, probe_forward
from labkit.memory.timeline import LayerWorkspace


@dataclass(frozen=True)
class TensorSpec:
    """What a layer was called with: enough to make a fresh tensor like it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass(frozen=True)
class LayerCall:
    """One call of a leaf module during the forward pass (in call order), its arguments as specs."""

    module: nn.Module
    args: tuple[Any, ...]               # TensorSpec for each tensor argument, anything else as it was passed


@dataclass(frozen=True)
class StepWorkspaces:
    """Every leaf call's workspace for one batch size (workspaces change with it: cuDNN re-chooses)."""

    batch_size: int
    layers: tuple[LayerWorkspace, ...]

    @property
    def largest_bytes(self) -> int:
        """The largest single workspace (forward or backward) in the step."""
        return max((max(w.forward_bytes, w.backward_bytes) for w in self.layers), default=0)


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), value.dtype, value.requires_grad)
    return value


def _record_calls(model: nn.Module, inputs: torch.Tensor, precision: str | None) -> list[LayerCall]:
    calls: list[LayerCall] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: calls.append(LayerCall(mod, tuple(map(_spec, args)))))
             for m in leaf_modules(model)]
    probe_forward(model, inputs, hooks, autocast(inputs.device.type, precision))
    return calls


def _scaled(a: Any, b: Any, b1: int, b2: int, batch_size: int) -> Any:
    """The argument at ``batch_size``, from the same argument at probe batches b1 and b2 (sizes are linear)."""
    if not isinstance(a, TensorSpec):
        return a
    if len(a.shape) != len(b.shape):
        raise ValueError("a layer saw tensors of different rank at two batch sizes; is the forward data-dependent?")
    shape = tuple(d1 + (d2 - d1) * (batch_size - b1) // (b2 - b1) for d1, d2 in zip(a.shape, b.shape))
    return TensorSpec(shape, a.dtype, a.requires_grad)


def layer_calls(model: nn.Module, sample_shape: tuple[int, ...], batch_size: int, precision: str | None = None,
                probe_batches: tuple[int, int] = (2, 3)) -> list[LayerCall]:
    """Every leaf call of one forward pass at ``batch_size``, found from two tiny passes (no big activations)."""
    batch_size = positive_int(batch_size, "batch_size")
    dev = next(model.parameters()).device
    b1, b2 = probe_batches
    small = _record_calls(model, torch.randn(b1, *sample_shape, device=dev), precision)
    large = _record_calls(model, torch.randn(b2, *sample_shape, device=dev), precision)
    if [c.module for c in small] != [c.module for c in large]:
        raise ValueError("the two probe passes called different layers; is the model's forward data-dependent?")
    return [LayerCall(s.module, tuple(_scaled(a, b, b1, b2, batch_size) for a, b in zip(s.args, big.args)))
            for s, big in zip(small, large)]


def _fresh(arg: Any, device: torch.device) -> tuple[Any, torch.Tensor | None]:
    """(what to pass the layer, the leaf to differentiate against or None) for one recorded argument."""
    if not isinstance(arg, TensorSpec):
        return arg, None
    if not arg.dtype.is_floating_point:
        return torch.zeros(arg.shape, dtype=arg.dtype, device=device), None
    leaf = torch.randn(arg.shape, dtype=arg.dtype, device=device, requires_grad=arg.requires_grad)
    return (leaf.clone(), leaf) if arg.requires_grad else (leaf, None)   # a clone: in-place layers (ReLU) work


def _outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _outputs(v)]
    return []


class CudaMeter:
    """The caching allocator's counters on one device (tests substitute their own meter on a CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> int:
        """Wait for queued work, reset the peak, and return what is allocated now."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def stop(self) -> tuple[int, int]:
        """Wait for queued work; (peak allocated since start, allocated now)."""
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device)), int(torch.cuda.memory_allocated(self.device))


def measure_call(call: LayerCall, device: torch.device, precision: str | None = None, repeats: int = 2,
                 meter: CudaMeter | None = None) -> LayerWorkspace:
    """One layer call's workspace: forward, the peak minus what the call leaves allocated; backward, the peak
    minus what was there before and the gradients it returns.

    The first repeat lets cuDNN and cuBLAS set up what they keep for the process; the last one is measured.
    """
    meter = meter or CudaMeter(device)
    forward = backward = 0
    for _ in range(repeats):
        fresh = [_fresh(a, device) for a in call.args]
        args, wrt = [a for a, _ in fresh], [leaf for _, leaf in fresh if leaf is not None]
        wrt += [p for p in call.module.parameters(recurse=False) if p.requires_grad]
        meter.start()
        with autocast(device.type, precision):
            out = call.module(*args)
        peak, after = meter.stop()
        forward, backward, outs = peak - after, 0, _outputs(out)
        if outs and wrt:
            grad_outs = [torch.randn_like(o) for o in outs]
            before = meter.start()
            grads = torch.autograd.grad(outs, wrt, grad_outs, allow_unused=True)
            backward = meter.stop()[0] - before - tensor_bytes(*grads)
            del grads, grad_outs
        del out, outs, args, wrt, fresh
    return LayerWorkspace(max(0, int(forward)), max(0, int(backward)))


def measure_workspaces(model: nn.Module, sample_shape: tuple[int, ...], batch_size: int,
                       precision: str | None = None) -> StepWorkspaces:
    """Each leaf call's cuDNN workspace at ``batch_size``, measured layer by layer on the model's CUDA device.

    Costs about two small forward passes plus each layer run alone twice; it never holds a whole step's
    activations, so it works at batch sizes the card can barely train.
    """
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cuda":
        raise ValueError("workspaces are measured on a CUDA device (move the model there first); on a CPU the "
                         "memory model has no workspace term: call predict() without workspaces=")
    calls = layer_calls(model, sample_shape, batch_size, precision)
    with preserved_state(model):                 # BatchNorm running statistics are left as they were
        model.train()
        layers = tuple(measure_call(c, param.device, precision) for c in calls)
    return StepWorkspaces(batch_size, layers)
