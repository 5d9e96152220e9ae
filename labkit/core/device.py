"""Which device the kit trains on, and the name printed beside every number measured on it.

The first GPU when there is one, else the CPU; a device asked for that is not there is one clear error.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from labkit.core.machine import cpu_count


def get_device(device: str | torch.device | None = None) -> torch.device:
    """The device to train on: the one asked for, else the first GPU, else the CPU."""
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} asked for, but no CUDA GPU is available; use device='cpu'")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class GpuInfo:
    """One visible CUDA GPU: its index, name, total memory and compute capability."""

    index: int
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]


def gpu_info() -> list[GpuInfo]:
    """Name, memory and compute capability of each visible CUDA GPU (empty on CPU)."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(GpuInfo(i, props.name, int(props.total_memory), (props.major, props.minor)))
    return gpus


def nccl_available() -> bool:
    """True when torch.distributed can use NCCL (needs a CUDA build and a GPU)."""
    return bool(dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available())


def device_label(device: str | torch.device | None = None) -> str:
    """A human name for a device, printed next to every timing: 'NVIDIA H100 (cuda:0)' or 'CPU (2 cores)'."""
    dev = get_device(device)
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(idx)} (cuda:{idx})"
    return f"CPU ({cpu_count()} cores, {torch.get_num_threads()} torch threads)"
