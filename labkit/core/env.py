"""Where the kit runs: the fast/full mode and seeds (devices: core.device; cores and versions: core.machine).

Every notebook asks this module which mode it is in, so that the same code path does
smaller work on a CPU laptop or Binder (fast) and the real work on a GPU box (full).
"""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from typing import Iterator, Mapping, TypeVar

import numpy as np
import torch

from labkit.core.envcheck import checked_mode_name

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
    forced = checked_mode_name(environ)
    if forced:
        return Mode(forced, f"forced by {MODE_ENV_VAR}={forced}")
    has_gpu = torch.cuda.is_available() if cuda_available is None else cuda_available
    if has_gpu:
        return Mode("full", "a CUDA GPU is present")
    return Mode("fast", "no CUDA GPU found; set LABKIT_MODE=full to force the full-size work")


def pick(fast: T, full: T, mode: Mode | None = None) -> T:
    """Choose a work size by mode: ``pick(fast=200, full=50_000)``."""
    return fast if (mode or get_mode()).fast else full


@contextlib.contextmanager
def deterministic_kernels() -> Iterator[None]:
    """cuDNN's deterministic algorithms and no autotuning while the block runs, then the settings as they were.

    A seed alone does not give the same numbers twice on a GPU: cuDNN chooses convolution algorithms by
    heuristics or timing, and some accumulate gradients with atomics in whatever order threads finish. No effect
    on a CPU, whose kernels are deterministic already."""
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch so that a rerun gives the same numbers."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
