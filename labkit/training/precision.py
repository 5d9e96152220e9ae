"""Mixed precision, measured: torch.autocast (bf16 on CPU; fp16 + GradScaler or bf16 on GPU), and why fp16
needs loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740).

Speed-ups come from hardware with fast low-precision units (tensor cores, AMX); elsewhere autocast can
be slower, and the kit reports whatever it measures. Memory is measured as the bytes autograd saves for
the backward pass (exact on any device), plus CUDA's peak allocation on a GPU. Keras dtype policies live
in :mod:`labkit.tf.precision`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from labkit.core.device import device_label
from labkit.core.dtypes import AMP_DTYPES
from labkit.core.step import StepOptions, TrainStep
from labkit.core.timing import time_fn
from labkit.core.validation import checked_int, positive_int
from labkit.memory.device import baseline_bytes, peak_since
from labkit.memory.model import saved_activation_bytes

DTYPES = ("fp32", *AMP_DTYPES)           # what autocast_step runs: full precision or one autocast dtype
FP16_SMALLEST_SUBNORMAL = 2.0 ** -24     # ~5.96e-8: anything smaller becomes 0 in float16


# ---------------------------------------------------------------------------------------------- loss scaling
@dataclass(frozen=True)
class LossScalingEvidence:
    """Small gradients cast to fp16 with and without loss scaling, and to bf16: what survives each cast."""

    gradients: np.ndarray            # float32 values, log-spaced
    fp16_zero_fraction: float        # flushed to 0 when cast to fp16 as they are
    scaled_zero_fraction: float      # flushed to 0 after multiplying by `scale` first
    unscaled_max_rel_error: float    # (fp16(g * scale) / scale vs g) over the non-zero ones
    bf16_zero_fraction: float        # bf16 keeps fp32's exponent range
    scale: float


def fp16_underflow(low_exp: float = -10.0, high_exp: float = -2.0, count: int = 81,
                   scale: float = 2.0 ** 16) -> LossScalingEvidence:
    """Cast small gradients to fp16 with and without loss scaling; count how many vanish."""
    count = checked_int(count, "count", minimum=2)
    if not (low_exp < high_exp and scale >= 1):
        raise ValueError(f"need low_exp < high_exp and scale >= 1, got {low_exp}, {high_exp} and {scale}")
    g = torch.logspace(low_exp, high_exp, count, dtype=torch.float32)
    plain = g.half()
    scaled = (g * scale).half()
    if torch.isinf(scaled).any():
        raise ValueError(f"scale={scale:g} overflows fp16 (max 65504) for these gradients; use a smaller scale")
    recovered = scaled.float() / scale                        # the optimizer unscales in fp32
    nz = scaled != 0
    rel = ((recovered[nz] - g[nz]).abs() / g[nz]).max().item() if nz.any() else float("nan")
    return LossScalingEvidence(g.numpy(), float((plain == 0).float().mean()), float((~nz).float().mean()),
                               rel, float((g.bfloat16() == 0).float().mean()), scale)


# ---------------------------------------------------------------------------------------------- torch.autocast
@dataclass(frozen=True)
class AutocastResult:
    """One training step under one autocast dtype: its time, throughput and memory."""

    dtype: str
    device: str
    step_time_median_s: float
    samples_per_s: float
    saved_activation_bytes: int          # tensors autograd keeps for backward, one forward pass
    peak_cuda_mem_bytes: int | None      # torch.cuda.max_memory_allocated on a GPU, else None


def autocast_step(model: nn.Module, batch_size: int, dtype: str = "bf16", *,
                  image_shape: tuple[int, ...] = (3, 32, 32), repeats: int = 3,
                  warmup: int = 1, num_classes: int = 10) -> AutocastResult:
    """Time one SGD training step under autocast ``dtype`` on the model's device (fp16 on CUDA uses a GradScaler)."""
    device = next(model.parameters()).device
    batch_size = positive_int(batch_size, "batch_size")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype == "fp16" and device.type != "cuda":
        raise ValueError("dtype='fp16' is a GPU recipe (CPU float16 kernels are slow or missing); use 'bf16' on CPU")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, *image_shape, generator=g).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # fp16 runs with a GradScaler (in the step): the loss is scaled so small fp16 gradients do not underflow
    train_step = TrainStep(model, opt, options=StepOptions(precision=None if dtype == "fp32" else dtype), device=device)

    def step():
        train_step(x, y)

    baseline = baseline_bytes(device, model, opt, (x, y))      # earlier cells' GPU tensors are not this step's
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time_fn(step, warmup=warmup, repeats=repeats, device=device)
    peak = peak_since(device, baseline)[0] if device.type == "cuda" else None
    return AutocastResult(dtype, device_label(device), t.median_s, batch_size / t.median_s,
                          saved_activation_bytes(model, x, precision=dtype), peak)


def compare_autocast(model_fn: Callable[[], nn.Module], batch_size: int, dtypes: tuple[str, ...] = ("fp32", "bf16"),
                     **kwargs: Any) -> list[AutocastResult]:
    """``autocast_step`` for each dtype, each on a fresh model from ``model_fn()`` (same seed)."""
    out = []
    for dtype in dtypes:
        torch.manual_seed(0)
        out.append(autocast_step(model_fn(), batch_size, dtype, **kwargs))
    return out
