"""Mixed precision, measured: torch.autocast (bf16 on CPU; fp16 + GradScaler or bf16 on GPU), Keras
dtype policies, and why fp16 needs loss scaling (Micikevicius et al. 2018, "Mixed Precision Training",
arXiv:1710.03740).

Speed-ups come from hardware with fast low-precision units (tensor cores, AMX); elsewhere autocast can
be slower, and the kit reports whatever it measures. Memory is measured as the bytes autograd saves for
the backward pass (exact on any device), plus CUDA's peak allocation on a GPU.
torch and TensorFlow are imported lazily so the Keras part can run in a TF-only child process.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("fp32", "bf16", "fp16")
FP16_SMALLEST_SUBNORMAL = 2.0 ** -24     # ~5.96e-8: anything smaller becomes 0 in float16


# ---------------------------------------------------------------------------------------------- loss scaling
@dataclass(frozen=True)
class LossScalingEvidence:
    gradients: np.ndarray            # float32 values, log-spaced
    fp16_zero_fraction: float        # flushed to 0 when cast to fp16 as they are
    scaled_zero_fraction: float      # flushed to 0 after multiplying by `scale` first
    unscaled_max_rel_error: float    # (fp16(g * scale) / scale vs g) over the non-zero ones
    bf16_zero_fraction: float        # bf16 keeps fp32's exponent range
    scale: float


def fp16_underflow(low_exp: float = -10.0, high_exp: float = -2.0, count: int = 81,
                   scale: float = 2.0 ** 16) -> LossScalingEvidence:
    """Cast small gradients to fp16 with and without loss scaling; count how many vanish."""
    import torch

    if not (low_exp < high_exp and count >= 2 and scale >= 1):
        raise ValueError("need low_exp < high_exp, count >= 2 and scale >= 1")
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
    dtype: str
    device: str
    step_time_median_s: float
    samples_per_s: float
    saved_activation_bytes: int          # tensors autograd keeps for backward, one forward pass
    peak_cuda_mem_bytes: int | None      # torch.cuda.max_memory_allocated on a GPU, else None


def _autocast(device_type: str, dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.bfloat16)
    return torch.autocast(device_type, dtype=low, enabled=dtype != "fp32")


def autocast_step(model, batch_size: int, dtype: str = "bf16", *, image_shape=(3, 32, 32), repeats: int = 3,
                  warmup: int = 1, num_classes: int = 10) -> AutocastResult:
    """Time one SGD training step under autocast ``dtype`` on the model's device (fp16 on CUDA uses a GradScaler)."""
    import torch

    from labkit.core.device import device_label
    from labkit.training.memory import saved_activation_bytes
    from labkit.core.timing import time_fn

    device = next(model.parameters()).device
    if dtype == "fp16" and device.type != "cuda":
        raise ValueError("dtype='fp16' is a GPU recipe (CPU float16 kernels are slow or missing); use 'bf16' on CPU")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, *image_shape, generator=g).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with _autocast(device.type, dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()      # scale x loss so small fp16 gradients do not underflow
        scaler.step(opt)                   # unscales in fp32; skips the step if it finds inf/NaN
        scaler.update()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time_fn(step, warmup=warmup, repeats=repeats, device=device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return AutocastResult(dtype, device_label(device), t.median_s, batch_size / t.median_s,
                          saved_activation_bytes(model, x, amp_dtype=None if dtype == "fp32" else dtype), peak)


def compare_autocast(model_fn, batch_size: int, dtypes: tuple[str, ...] = ("fp32", "bf16"), **kwargs) -> list[AutocastResult]:
    """``autocast_step`` for each dtype, each on a fresh model from ``model_fn()`` (same seed)."""
    import torch

    out = []
    for dtype in dtypes:
        torch.manual_seed(0)
        out.append(autocast_step(model_fn(), batch_size, dtype, **kwargs))
    return out


# ---------------------------------------------------------------------------------------------- Keras policies
def keras_policy_child(policy: str = "mixed_bfloat16", batch_size: int = 64, repeats: int = 5,
                       warmup: int = 2) -> dict:
    """Child process (TF only): time train_on_batch of a small Keras CNN under a dtype policy."""
    import time

    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy(policy)
    from labkit.tf.keras import keras_small_cnn

    model = keras_small_cnn(10, (32, 32, 3), float32_logits=True)   # logits in fp32 for a stable loss
    opt = tf.keras.optimizers.SGD(0.01)
    if policy == "mixed_float16":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)   # dynamic loss scaling for fp16
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=batch_size)
    for _ in range(warmup):
        model.train_on_batch(x, y)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.train_on_batch(x, y)          # returns a host value: the step has finished
        times.append(time.perf_counter() - start)
    conv = model.layers[0]
    rewrite = "enable_mixed_precision_graph_rewrite"   # the TF1 AMP graph rewrite the policy replaced
    return {"policy": policy, "times_s": times, "compute_dtype": conv.compute_dtype,
            "variable_dtype": conv.variable_dtype, "output_dtype": str(model.outputs[0].dtype),
            "tf2_api_has_graph_rewrite": hasattr(tf.train.experimental, rewrite),
            "compat_v1_has_graph_rewrite": hasattr(tf.compat.v1.mixed_precision, rewrite)}


def keras_mixed_precision(policies: tuple[str, ...] = ("float32", "mixed_bfloat16"), batch_size: int = 64,
                          repeats: int = 5) -> dict:
    """Per policy, a fresh TF process: step timings (a labkit TimingResult) and the dtypes Keras chose."""
    from labkit.core.procs import run_in_fresh_process
    from labkit.core.timing import TimingResult

    out = {}
    for policy in policies:
        r = run_in_fresh_process("labkit.training.precision:keras_policy_child",
                                 {"policy": policy, "batch_size": batch_size, "repeats": repeats})
        out[policy] = {**r, "timing": TimingResult(r["times_s"], "CPU (TensorFlow child process)")}
    return out
