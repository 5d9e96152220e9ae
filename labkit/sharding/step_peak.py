"""The peak of a whole training step, with and without activation checkpointing, measured.

What must fit in memory is the step's peak, not the activations a forward keeps: during backward a
checkpointed segment is recomputed (its activations come back, one segment at a time) while the gradients
are being built. So checkpointing cuts the step peak by less than it cuts the kept activations, and the
largest batch that fits is fitted on measured step peaks. CUDA: peak allocated minus allocated before.
CPU: the process's resident high-water mark (:mod:`labkit.memory.host`), in a fresh process whose
glibc returns every large block at free, so neither earlier cells' heap nor a grown malloc threshold blurs it.
"""
from __future__ import annotations

import torch
from torch import nn

from labkit.core.models import resnet18_cifar
from labkit.core.procs import run_in_fresh_process
from labkit.core.step import TrainStep
from labkit.core.timing import synchronize
from labkit.core.validation import positive_int
from labkit.memory.device import peak_since
from labkit.memory.host import MEASURE_MMAP_THRESHOLD, measure_host_peak_bytes
from labkit.memory.probe import preserved_state
from labkit.sharding.checkpointing import (bytes_line, largest_batch_within, square_mean_loss, transformer_stack,
                                           with_checkpointing)

# glibc reads these at start-up: every block from 64 KiB up gets its own mapping, unmapped at free
HOST_PEAK_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MEASURE_MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_":
                 str(MEASURE_MMAP_THRESHOLD), "OMP_NUM_THREADS": "1"}
WORKLOADS = ("resnet18", "transformer")


def measure_step_peak_bytes(model: nn.Module, inputs: torch.Tensor) -> int:
    """Peak bytes one forward+backward adds above what existed before it: activations, recomputes, gradients.

    One unmeasured step runs first (thread pools, lazy buffers); the one step (no update) frees the gradients
    after each step, once its peak is past.
    """
    train_step = TrainStep(model, None, loss_fn=square_mean_loss, device=inputs.device)

    def step() -> None:
        train_step(inputs, None)

    with preserved_state(model):
        model.train()
        step()
        if inputs.device.type != "cuda":
            peak = measure_host_peak_bytes(step)
        else:
            synchronize(inputs.device)
            before = torch.cuda.memory_allocated(inputs.device)     # model, batch and other cells' tensors
            torch.cuda.reset_peak_memory_stats(inputs.device)
            step()
            synchronize(inputs.device)
            peak = peak_since(inputs.device, before)[0]
    return int(peak)


def build_workload(name: str, *, image: int = 32, seq_len: int = 128, d_model: int = 64,
                   layers: int = 4) -> tuple[nn.Module, tuple[int, ...], list[str]]:
    """(model, one sample's shape, the segments to checkpoint) for 'resnet18' or 'transformer'."""
    torch.manual_seed(0)
    if name == "resnet18":
        return resnet18_cifar(), (3, image, image), ["layer1", "layer2", "layer3", "layer4"]
    if name == "transformer":
        return (transformer_stack(d_model=d_model, layers=layers), (seq_len, d_model),
                [str(i) for i in range(layers)])
    raise ValueError(f"unknown workload {name!r}; choose one of {WORKLOADS}")


def step_peaks(workload: str, batch_sizes: list[int], device: str = "cpu", **shape: int) -> dict:
    """{'plain': {batch: bytes}, 'checkpointed': {...}} for one workload (runs where it is called)."""
    torch.set_num_threads(1)
    model, sample_shape, segments = build_workload(workload, **shape)
    dev = torch.device(device)
    model = model.to(dev)
    ckpt = with_checkpointing(model, segments)
    out: dict = {"plain": {}, "checkpointed": {}}
    for b in batch_sizes:
        x = torch.randn(positive_int(b, "batch size"), *sample_shape, device=dev)
        out["plain"][str(b)] = measure_step_peak_bytes(model, x)
        out["checkpointed"][str(b)] = measure_step_peak_bytes(ckpt, x)
    return out


def measure_step_peaks(workload: str, batch_sizes: tuple[int, ...], device: str = "cpu", timeout_s: float = 300.0,
                       **shape: int) -> dict[str, dict[int, int]]:
    """``step_peaks`` in a fresh process (CPU: glibc set to return large blocks), batch sizes as ints."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {WORKLOADS}")
    result = run_in_fresh_process("labkit.sharding.step_peak:step_peaks",
                                  {"workload": workload, "batch_sizes": list(batch_sizes), "device": str(device),
                                   **shape}, env=HOST_PEAK_ENV, timeout_s=timeout_s)
    return {kind: {int(b): int(v) for b, v in result[kind].items()} for kind in ("plain", "checkpointed")}


def largest_batches(peaks: dict[str, dict[int, int]], budget_bytes: int, fixed_bytes: int) -> dict[str, int]:
    """Largest batch within ``budget_bytes`` for each kind, from a line through its measured step peaks."""
    return {kind: largest_batch_within(by_batch, budget_bytes, fixed_bytes) for kind, by_batch in peaks.items()}


def per_sample_ratio(peaks: dict[str, dict[int, int]]) -> float:
    """Checkpointed / plain growth of the step peak per sample: what checkpointing saves as the batch grows."""
    return bytes_line(peaks["checkpointed"])[0] / bytes_line(peaks["plain"])[0]

