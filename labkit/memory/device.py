"""Peak memory of one piece of work on a CUDA device, without what other code holds there.

``torch.cuda.max_memory_allocated`` is process-wide: in a notebook it includes every tensor earlier cells
left on the GPU (on the H100 that made notebook 02's memory check read 19-72% off). Every instrument that
reports a peak therefore subtracts a baseline: what was allocated before the work began, minus the tensors
that belong to the work itself (its model, gradients, optimizer state and batch), which the peak must keep.
"""
from __future__ import annotations

import torch
from torch import nn


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the given tensors' elements (None skipped)."""
    return int(sum(t.numel() * t.element_size() for t in tensors if t is not None))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps between steps (momentum, Adam's moments)."""
    return int(sum(v.numel() * v.element_size() for state in optimizer.state.values()
                   for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0))


def work_bytes_on(device: torch.device, model: nn.Module | None = None,
                  optimizer: torch.optim.Optimizer | None = None, tensors: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes the work itself already holds on ``device``: parameters, gradients, buffers, optimizer state, batch."""
    held = []
    if model is not None:
        held += list(model.parameters()) + [p.grad for p in model.parameters()] + list(model.buffers())
    if optimizer is not None:
        held += [v for state in optimizer.state.values() for v in state.values()
                 if isinstance(v, torch.Tensor) and v.dim() > 0]
    held += list(tensors)
    return tensor_bytes(*(t for t in held if t is not None and t.device == device))


def baseline_bytes(device: torch.device, model: nn.Module | None = None,
                   optimizer: torch.optim.Optimizer | None = None, tensors: tuple[torch.Tensor, ...] = ()) -> int:
    """Allocated bytes on a CUDA ``device`` that belong to other code: subtract from a peak measured after this."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return max(0, int(torch.cuda.memory_allocated(device)) - work_bytes_on(device, model, optimizer, tensors))


def peak_since(device: torch.device, baseline: int) -> tuple[int, int]:
    """(peak allocated, peak reserved) bytes since the last ``reset_peak_memory_stats``, the baseline subtracted
    from the allocated peak (the reserve is the caching allocator's, shown as its own term)."""
    device = torch.device(device)
    return (int(torch.cuda.max_memory_allocated(device)) - int(baseline),
            int(torch.cuda.max_memory_reserved(device)))


def cuda_baseline_bytes() -> int | None:
    """GPU: what other code holds before a run (subtracted from the run's peak); None on a CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.reset_peak_memory_stats()
    return baseline_bytes(torch.device("cuda"))
