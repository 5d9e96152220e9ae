"""A run in progress, as the batch-size dashboard shows it (testable without widgets): the memory model for the
run's own optimizer and autocast dtype (:func:`predict_run_memory`, from its
:class:`labkit.training.window.TrainProgress`), and what the run really holds (:func:`measure_run_memory`: GPU, peak
minus the baseline :func:`labkit.memory.device.cuda_baseline_bytes` took before it started; CPU, the fixed parts plus
the activations counted from this batch's autograd graph).
"""
from __future__ import annotations

from labkit.memory.checks import graph_saved_bytes
from labkit.memory.device import peak_since
from labkit.memory.model import MemoryBreakdown
from labkit.memory.probe import preserved_state
from labkit.training.window import TrainProgress


def predict_run_memory(progress: TrainProgress, batch_size: int) -> MemoryBreakdown:
    """The memory model for the run's own optimizer, momentum and autocast dtype (from a TrainProgress)."""
    return progress.run.memory_model(progress.model, tuple(progress.last_inputs.shape[1:])).predict(batch_size)


def measure_run_memory(progress: TrainProgress, predicted: MemoryBreakdown, baseline_bytes: int | None) -> int | None:
    """A run's measured bytes. GPU: peak allocated since the run began minus the baseline. CPU: the fixed parts
    of ``predicted`` plus the activations counted from this batch's autograd graph (not the model's hook)."""
    model = progress.model
    if baseline_bytes is not None and next(model.parameters()).device.type == "cuda":
        return peak_since(next(model.parameters()).device, baseline_bytes)[0]
    with preserved_state(model):
        model.train()
        out = model(progress.last_inputs)
        acts = graph_saved_bytes(out, exclude=list(model.parameters()))
        del out
    return predicted.total_bytes - predicted.activations_bytes + acts
