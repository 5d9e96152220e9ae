"""Is the memory model right? Checks against measurements it was not built from.

- On a GPU: :func:`measure_step_memory` runs two real steps and reports the SECOND step's peak minus
  what other code had allocated (earlier cells' tensors do not count), plus the allocator's reserve.
- On a CPU: :func:`graph_saved_bytes` counts the activations autograd keeps by walking the graph's
  ``_saved_*`` attributes (not the saved-tensor hook the model is built with), at a batch the model
  never saw; the optimizer state is counted from ``optimizer.state`` after a real step.
- Recorded: :func:`compare_with_reference` holds the model against peaks measured on an H100.
- A run in progress (the batch-size dashboard's numbers) is :mod:`labkit.training.run_memory`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from labkit.core.data import verify_data_file
from labkit.core.models import build_model
from labkit.core.step import StepOptions, TrainStep
from labkit.memory.device import baseline_bytes, optimizer_state_bytes, peak_since
from labkit.memory.model import MemoryModel, build_memory_model
from labkit.memory.probe import preserved_state
from labkit.memory.saved import storage_bytes, storage_key, storage_keys


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _tensors(v)]
    return []


def graph_saved_bytes(output: torch.Tensor, exclude: list[torch.Tensor] = ()) -> int:
    """Bytes of distinct storages saved for backward, found by walking the autograd graph from ``output``."""
    skip = storage_keys(exclude)
    seen_nodes, stack, storages = set(), [output.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:            # already freed by a backward pass
                continue
            for t in _tensors(value):
                ptr = storage_key(t)
                if ptr and ptr not in skip:
                    storages[ptr] = storage_bytes(t)
        stack.extend(fn for fn, _ in node.next_functions)
    return int(sum(storages.values()))


@dataclass(frozen=True)
class CpuCheck:
    """The model's activations and optimizer state against independent counts at one batch size."""

    batch_size: int
    predicted_activation_bytes: int
    counted_activation_bytes: int
    predicted_optimizer_bytes: int
    counted_optimizer_bytes: int

    @property
    def activation_error_pct(self) -> float:
        return 100.0 * (self.predicted_activation_bytes - self.counted_activation_bytes) / self.counted_activation_bytes

    @property
    def optimizer_error_pct(self) -> float:
        if self.counted_optimizer_bytes == 0:
            return 0.0 if self.predicted_optimizer_bytes == 0 else float("inf")
        return 100.0 * (self.predicted_optimizer_bytes - self.counted_optimizer_bytes) / self.counted_optimizer_bytes


def check_on_cpu(model: nn.Module, memory_model: MemoryModel, optimizer: torch.optim.Optimizer,
                 sample_shape: tuple[int, ...], batch_size: int, num_classes: int = 10) -> CpuCheck:
    """Run one real training step at ``batch_size`` and count what it kept, without the model's hook."""
    x = torch.randn(batch_size, *sample_shape)
    y = torch.randint(0, num_classes, (batch_size,))
    counted: list[int] = []

    def loss_counting_the_graph(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(out, target)
        counted.append(graph_saved_bytes(loss, exclude=list(model.parameters())))   # before backward frees it
        return loss

    with preserved_state(model):
        model.train()
        TrainStep(model, optimizer, loss_fn=loss_counting_the_graph, device=x.device)(x, y)
    pred = memory_model.predict(batch_size)
    return CpuCheck(batch_size, pred.activations_bytes, counted[0], pred.optimizer_bytes,
                    optimizer_state_bytes(optimizer))


@dataclass(frozen=True)
class StepMemory:
    """One training step's memory on a GPU, in bytes."""

    baseline_bytes: int          # allocated by other code before the step (not this model's state)
    step_peak_bytes: int         # peak allocated during the second step minus the baseline
    peak_allocated_bytes: int    # process-wide peak allocated during the second step
    peak_reserved_bytes: int     # process-wide peak reserved: what the caching allocator held

    @property
    def reserve_bytes(self) -> int:
        """Held by the allocator's cache on top of the allocated peak (not free for other processes)."""
        return self.peak_reserved_bytes - self.peak_allocated_bytes


def measure_step_memory(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                        targets: torch.Tensor, precision: str | None = None) -> StepMemory:
    """Second-step peak of a real training step on CUDA, with everything other code holds subtracted."""
    if inputs.device.type != "cuda":
        raise ValueError("measure_step_memory needs CUDA tensors; on a CPU use check_on_cpu")
    dev = inputs.device
    train_step = TrainStep(model, optimizer, options=StepOptions(precision=precision))     # on the model's device

    def step() -> None:
        train_step(inputs, targets)

    torch.cuda.synchronize(dev)
    step()                                            # creates optimizer state and the cuBLAS/cuDNN workspaces
    torch.cuda.synchronize(dev)
    baseline = baseline_bytes(dev, model, optimizer, (inputs, targets))
    torch.cuda.reset_peak_memory_stats(dev)
    step()
    torch.cuda.synchronize(dev)
    step_peak, reserved = peak_since(dev, baseline)
    return StepMemory(baseline, step_peak, step_peak + baseline, reserved)


RECORDED_H100_FILE = "recorded_h100_reference.json"     # under data/, listed in data/manifest.json


def recorded_reference(path: str | Path | None = None) -> dict:
    """The H100 reference run (device, torch, memory rows), shipped with the kit's data and checked against its
    manifest."""
    if path is None:
        path = verify_data_file(RECORDED_H100_FILE)
    elif not Path(path).is_file():
        raise FileNotFoundError(f"no recorded GPU reference at {path}; leave path= out to read the kit's own "
                                f"(data/{RECORDED_H100_FILE})")
    return json.loads(Path(path).read_text())


def compare_with_reference(rows: list[dict], sample_shape: tuple[int, ...] = (3, 32, 32)) -> list[dict]:
    """The model's prediction for each recorded GPU row (gpu_reference.json's memory section)."""
    models, out = {}, []
    for row in rows:
        key = (row["model"], row["optimizer"], bool(row["amp_bf16"]))
        if key not in models:
            torch.manual_seed(0)
            models[key] = build_memory_model(build_model(row["model"]), sample_shape, row["optimizer"], 0.9,
                                             "bf16" if key[2] else None)
        predicted = models[key].predict(row["batch"]).total_bytes
        measured = row["peak_allocated_step2"]
        out.append(dict(model=row["model"], batch_size=row["batch"], dtype="bf16" if key[2] else "fp32",
                        optimizer=row["optimizer"], predicted_bytes=int(predicted), measured_bytes=int(measured),
                        reserved_bytes=int(row["peak_reserved"]),
                        error_pct=round(100.0 * (predicted - measured) / measured, 2)))
    return out
