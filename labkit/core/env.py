"""Where the kit runs: devices, the fast/full mode, seeds and package versions.

Every notebook asks this module which mode it is in, so that the same code path does
smaller work on a CPU laptop or Binder (fast) and the real work on a GPU box (full).
"""
from __future__ import annotations

import importlib
import os
import random
from dataclasses import dataclass
from typing import Mapping, TypeVar

import numpy as np
import torch

MODE_ENV_VAR = "LABKIT_MODE"
MODES = ("fast", "full")
T = TypeVar("T")


@dataclass(frozen=True)
class Mode:
    """The kit's run mode and why it was chosen."""

    name: str
    reason: str

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.name!r}")

    @property
    def fast(self) -> bool:
        return self.name == "fast"

    def __str__(self) -> str:
        return f"{self.name} mode ({self.reason})"


def get_mode(environ: Mapping[str, str] | None = None, cuda_available: bool | None = None) -> Mode:
    """Fast on CPU, full on GPU, unless ``LABKIT_MODE=fast|full`` forces one."""
    environ = os.environ if environ is None else environ
    forced = environ.get(MODE_ENV_VAR, "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"{MODE_ENV_VAR} must be one of {MODES} (or unset for automatic), got {forced!r}")
        return Mode(forced, f"forced by {MODE_ENV_VAR}={forced}")
    has_gpu = torch.cuda.is_available() if cuda_available is None else cuda_available
    if has_gpu:
        return Mode("full", "a CUDA GPU is present")
    return Mode("fast", "no CUDA GPU found; set LABKIT_MODE=full to force the full-size work")


def pick(fast: T, full: T, mode: Mode | None = None) -> T:
    """Choose a work size by mode: ``pick(fast=200, full=50_000)``."""
    return fast if (mode or get_mode()).fast else full


def get_device(device: str | torch.device | None = None) -> torch.device:
    """The device to train on: the one asked for, else the first GPU, else the CPU."""
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} asked for, but no CUDA GPU is available; use device='cpu'")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch so that a rerun gives the same numbers."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@dataclass(frozen=True)
class GpuInfo:
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
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available())


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def total_ram_bytes() -> int:
    """Physical memory of the machine."""
    import psutil

    return int(psutil.virtual_memory().total)


def package_version(name: str) -> str | None:
    """Installed version of a package, or None when it is missing."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def module_importable(module: str) -> bool:
    """True when ``import module`` works."""
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False


def device_label(device: str | torch.device | None = None) -> str:
    """A human name for a device, printed next to every timing: 'NVIDIA H100 (cuda:0)' or 'CPU (2 cores)'."""
    dev = get_device(device)
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(idx)} (cuda:{idx})"
    return f"CPU ({cpu_count()} cores, {torch.get_num_threads()} torch threads)"
