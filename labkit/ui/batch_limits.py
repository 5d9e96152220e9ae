"""How large a batch the dashboard offers: the memory model's and the finder's answer for a model and device.

The memory (a GPU's card, or a budget you choose on a CPU) minus a safety margin is what a run may use; the
kit's finder (:func:`labkit.training.finder.find_max_batch`, asking the kit's memory model) gives the largest
batch within it, capped by the dataset. The slider offers the powers of two up to that answer and one past
it, so a learner can see, before anything runs, that it would not fit and by how much.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from labkit.core.validation import positive_int
from labkit.training.finder import find_max_batch
from labkit.memory.model import MemoryModel
from labkit.training.run_spec import RunSpec


@dataclass(frozen=True)
class BatchLimit:
    """The largest batch a model may train with here, and the memory it was judged against."""

    max_batch: int              # largest batch that fits (the finder's answer), capped by the dataset
    capacity_bytes: int         # the GPU's memory, or the CPU budget
    usable_bytes: int           # capacity minus the safety margin
    limited_by: str             # "memory" or "dataset"
    device_kind: str            # "cuda" or "cpu"
    summary: str                # the finder's own one-line answer

    def __post_init__(self) -> None:
        if self.limited_by not in ("memory", "dataset", "limit"):
            raise ValueError(f"limited_by must be 'memory', 'dataset' or 'limit', got {self.limited_by!r}")

    @property
    def capacity_label(self) -> str:
        """What the capacity is, in words."""
        return "GPU memory" if self.device_kind == "cuda" else "CPU budget"


def capacity_bytes(device: torch.device, cpu_budget_bytes: int | None) -> int:
    """The memory a run is judged against: the card's total on a GPU, the chosen budget on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if cpu_budget_bytes is None:
        raise ValueError("on a CPU give memory_budget_bytes= (e.g. 256 * 10**6): the dashboard draws memory "
                         "against it and bounds the batch slider by it")
    return positive_int(cpu_budget_bytes, "memory_budget_bytes")


def batch_limit(model: nn.Module, run: RunSpec, memory_model: MemoryModel, sample_shape: tuple[int, ...], *,
                device: torch.device, cpu_budget_bytes: int | None, dataset_size: int,
                safety_margin: float = 0.1) -> BatchLimit:
    """The finder's answer (memory-model method, no timing steps) for ``model`` trained as ``run`` on ``device``."""
    if memory_model.optimizer != run.optimizer_kind:
        raise ValueError(f"the memory model prices optimizer {memory_model.optimizer!r} but the run trains with "
                         f"{run.optimizer_kind!r}: build it with run.memory_model(model, sample_shape)")
    capacity = capacity_bytes(device, cpu_budget_bytes)
    found = find_max_batch(model, sample_shape, run=run, device=device,
                           memory_budget_bytes=capacity, safety_margin=safety_margin, dataset_size=dataset_size,
                           timing_steps=0, method="memory-model", memory_model=memory_model)
    return BatchLimit(found.max_batch, capacity, int(found.usable_bytes), found.stopped_by, device.type,
                      found.summary())


def power_of_two_batches(limit: BatchLimit) -> list[int]:
    """1, 2, 4, ... up to the limit, and the next power of two past it when memory (not the data) is the limit."""
    sizes, size = [], 1
    while size <= limit.max_batch:
        sizes.append(size)
        size *= 2
    if limit.limited_by == "memory":
        sizes.append(size)
    return sizes


def slider_labels(sizes: list[int], limit: BatchLimit, knee: int | None) -> list[tuple[str, int]]:
    """(label, batch) options: the knee, the finder's answer (when a power of two) and sizes that do not fit named."""
    options, top = [], max((s for s in sizes if s <= limit.max_batch), default=None)
    for size in sizes:
        notes = []
        if knee is not None and size == knee:
            notes.append("knee")
        if size == top:   # the finder's answer need not be a power of two: name it beside the nearest below
            notes.append("largest that fits" if size == limit.max_batch else f"finder: {limit.max_batch} fits")
        if size > limit.max_batch:
            notes.append("won't fit")
        options.append((f"{size} ({', '.join(notes)})" if notes else str(size), size))
    return options


def fit_verdict(memory_model: MemoryModel, batch_size: int, limit: BatchLimit) -> str | None:
    """None when ``batch_size`` fits; else one line saying by how much it would not (or that the data is smaller)."""
    if batch_size > limit.max_batch and limit.limited_by == "dataset":
        return (f"batch {batch_size} is larger than the dataset the finder was given; the largest batch is "
                f"{limit.max_batch}")
    predicted = memory_model.predict(batch_size).total_bytes
    if predicted <= limit.usable_bytes:
        return None
    return (f"batch {batch_size} would not fit: the memory model predicts {predicted / 1e6:,.1f} MB, "
            f"{(predicted - limit.usable_bytes) / 1e6:,.1f} MB over the {limit.usable_bytes / 1e6:,.1f} MB usable "
            f"({limit.capacity_label} {limit.capacity_bytes / 1e6:,.0f} MB less the safety margin); "
            f"the largest that fits is {limit.max_batch}")
