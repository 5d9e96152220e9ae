"""FLOPs per training sample, achieved FLOP/s, and model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s / the device's peak FLOP/s (Chowdhery et al. 2022, PaLM, appendix B), where
the peak is the one of the math mode that actually ran (:func:`active_math_mode`): cuDNN convolutions
use TF32 by default on Ampere and newer, so an fp32 model is measured against the TF32 peak there.
Model FLOPs are counted, not estimated, with ``torch.utils.flop_counter.FlopCounterMode`` over one
forward *and* backward pass. Peaks come from the vendor datasheets below (dense, no sparsity); for a
device not in the table the kit says "peak unknown" rather than guessing.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from labkit.core.device import device_label, get_device
from labkit.core.dtypes import math_mode_name

if TYPE_CHECKING:
    from labkit.training.run_spec import RunSpec
from labkit.core.models import build_model
from labkit.core.step import LossFn, TrainStep
from labkit.core.timing import time_fn
from labkit.core.validation import checked_int, positive_int
from labkit.memory.probe import preserved_state


@dataclass(frozen=True)
class PeakSpec:
    """Peak dense FLOP/s of one GPU model, by math mode, and where the figures come from."""

    name: str
    match: tuple[str, ...]          # every substring must appear in torch.cuda.get_device_name()
    exclude: tuple[str, ...]        # none of these may appear
    peak_flops_per_s: dict          # math mode ("fp32" | "tf32" | "bf16" | "fp16") -> dense FLOP/s
    source: str
    memory_bytes_per_s: float | None = None   # datasheet memory bandwidth, only where traced to its primary source
    memory_source: str = ""


_T = 1e12
# Dense figures. NVIDIA datasheets print the tensor-core rows "with sparsity" (H100, H200, A100, L4, L40S);
# dense is half of that. 'fp32' is the non-tensor FP32 row. V100 and T4 have no TF32/BF16 tensor cores.
PEAK_TABLE: tuple[PeakSpec, ...] = (
    PeakSpec("NVIDIA H100 SXM", ("H100",), ("PCIe", "NVL"),
             {"fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T},
             "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67 TFLOPS; TF32 989, BF16/FP16 1,979 "
             "TFLOPS with sparsity, halved"),
    PeakSpec("NVIDIA H100 PCIe", ("H100", "PCIe"), (),
             {"fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756.5 * _T, "fp16": 756.5 * _T},
             "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column: FP32 51 TFLOPS; TF32 756, BF16/FP16 1,513 "
             "TFLOPS with sparsity, halved",
             2000e9, "NVIDIA H100 PCIe GPU Product Brief PB-11133-001_v02 (Nov 2022), Overview: memory bandwidth "
                     "'greater than 2,000 gigabytes per second' (a lower bound)"),
    PeakSpec("NVIDIA H200 SXM", ("H200",), ("NVL",),
             {"fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T},
             "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67 TFLOPS; TF32 989, BF16/FP16 1,979 "
             "TFLOPS with sparsity, halved"),
    PeakSpec("NVIDIA A100", ("A100",), (),
             {"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T},
             "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP32 19.5, "
             "TF32 156, BF16/FP16 312 TFLOPS dense; same for 40/80 GB, SXM4/PCIe"),
    PeakSpec("NVIDIA L40S", ("L40S",), (),
             {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T},
             "NVIDIA L40S datasheet: FP32 91.6 TFLOPS; TF32 183 (366 with sparsity), BF16/FP16 362.05 "
             "(733 with sparsity) TFLOPS"),
    PeakSpec("NVIDIA L4", ("L4",), ("L40",),
             {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T},
             "NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TFLOPS; TF32 120, BF16/FP16 242 TFLOPS with "
             "sparsity, halved"),
    PeakSpec("NVIDIA V100 SXM2", ("V100", "SXM2"), (),
             {"fp32": 15.7 * _T, "fp16": 125 * _T},
             "NVIDIA Tesla V100 GPU datasheet, SXM2 column: 15.7 TFLOPS single precision, 125 TFLOPS tensor"),
    PeakSpec("NVIDIA V100 PCIe", ("V100",), ("SXM", "V100S"),     # the V100S (16.4 TFLOPS) is a different card
             {"fp32": 14 * _T},
             "NVIDIA Tesla V100 GPU datasheet, PCIe column: 14 TFLOPS single precision (its tensor figure is "
             "left out: not re-checked)"),
    PeakSpec("NVIDIA T4", ("T4",), ("T40",),
             {"fp32": 8.1 * _T, "fp16": 65 * _T},
             "NVIDIA T4 Tensor Core GPU datasheet: 8.1 TFLOPS FP32, 65 TFLOPS mixed precision (FP16/FP32)"),
)


def find_peak(device_name: str) -> PeakSpec | None:
    """The table entry whose name patterns match ``device_name`` (None when the GPU is not listed)."""
    for spec in PEAK_TABLE:
        if all(m in device_name for m in spec.match) and not any(x in device_name for x in spec.exclude):
            return spec
    return None


def peak_memory_bytes_per_s(device_name: str) -> tuple[float | None, str]:
    """(datasheet memory bandwidth in bytes/s, its source) for a GPU name; (None, why) where none is traced."""
    spec = find_peak(device_name)
    if spec is None:
        return None, f"{device_name!r} is not in labkit.training.flops.PEAK_TABLE"
    if spec.memory_bytes_per_s is None:
        return None, f"{spec.name}: no memory bandwidth traced to a primary datasheet yet"
    return spec.memory_bytes_per_s, spec.memory_source


def _tf32_enabled() -> bool:
    """Whether torch's current settings let fp32 matmuls or cuDNN convolutions run on TF32 tensor cores.

    PyTorch 2.9+ reads ``torch.backends.cuda.matmul.fp32_precision`` and
    ``torch.backends.cudnn.conv.fp32_precision`` ('tf32' or 'ieee'; 'none' = not set, fall back to the
    older flags); cuDNN convolutions use TF32 by default, matmuls do not. Older torch: ``allow_tf32``.
    """
    matmul = getattr(getattr(torch.backends.cuda, "matmul", None), "fp32_precision", "none")
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", "none")
    if matmul == "none":
        matmul = "tf32" if torch.get_float32_matmul_precision() != "highest" else "ieee"
    if conv == "none":
        conv = "tf32" if getattr(torch.backends.cudnn, "allow_tf32", False) else "ieee"
    return "tf32" in (matmul, conv)


@contextlib.contextmanager
def fp32_math(tf32: bool) -> Iterator[None]:
    """Run fp32 convolutions and matmuls strictly (IEEE) or in TF32, then restore the previous settings.

    Uses PyTorch's current per-backend ``fp32_precision`` flags (the ``allow_tf32`` booleans and
    ``set_float32_matmul_precision`` are the legacy API, and torch refuses to read a mix of the two; see the
    "TensorFloat-32 (TF32) on Ampere (and later) devices" section of the CUDA notes).
    """
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    saved = [f.fp32_precision for f in flags]
    for f in flags:
        f.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        yield
    finally:
        for f, value in zip(flags, saved):
            f.fp32_precision = value


def fp32_math_of(run: "RunSpec") -> contextlib.AbstractContextManager[None]:
    """:func:`fp32_math` for a run whose ``tf32`` is set; torch's current setting when it is None."""
    return contextlib.nullcontext() if run.tf32 is None else fp32_math(run.tf32)


def math_mode_of(precision: str | torch.dtype | None, tf32: bool, device_type: str) -> str:
    """The one math-mode rule: the autocast dtype ('bf16'/'fp16'), else 'tf32' where fp32 may use TF32 on a
    CUDA GPU, else strict 'fp32'."""
    if precision is not None and math_mode_name(precision) != "fp32":
        return math_mode_name(precision)
    return "tf32" if tf32 and device_type == "cuda" else "fp32"


def active_math_mode(device: str | torch.device | None = None, precision: str | torch.dtype | None = None) -> str:
    """The math the tensor work runs in now (:func:`math_mode_of` with torch's current TF32 settings): TF32
    counts on a CUDA GPU of compute capability >= 8.0 when matmuls or convolutions may use it.

    When either matmuls or convolutions may use TF32 the answer is 'tf32': its peak is the higher one,
    so MFU is never overstated.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf32 = (dev.type == "cuda" and precision is None and torch.cuda.get_device_capability(dev)[0] >= 8
            and _tf32_enabled())
    return math_mode_of(precision, tf32, dev.type)


def peak_flops_per_s(device: str | torch.device | None = None,
                     math_mode: str | torch.dtype | None = None) -> tuple[float | None, str]:
    """(dense peak FLOP/s, note naming the peak) for a device and math mode; (None, why) when unknown."""
    mode = math_mode_name(math_mode)
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return None, "peak FLOP/s unknown for CPUs (depends on model, cores, clocks and vector units): no MFU"
    name = torch.cuda.get_device_name(dev)
    spec = find_peak(name)
    if spec is None:
        return None, (f"peak FLOP/s of {name!r} is not in labkit.training.flops.PEAK_TABLE: no MFU (add it with its "
                      "datasheet)")
    if mode not in spec.peak_flops_per_s:
        return None, f"{spec.name}: the datasheet gives no {mode} peak: no MFU"
    peak = spec.peak_flops_per_s[mode]
    return peak, f"MFU against {spec.name} {mode} dense peak {peak / _T:g} TFLOP/s ({spec.source})"


def count_training_flops(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None,
                         loss_fn: LossFn | None = None) -> int:
    """FLOPs of one forward + backward pass of ``model`` on ``inputs`` (the whole batch), counted exactly."""
    if targets is None:
        targets = torch.zeros(inputs.shape[0], dtype=torch.long, device=inputs.device)
    step = TrainStep(model, None, loss_fn=loss_fn or nn.functional.cross_entropy, device=inputs.device)
    with FlopCounterMode(display=False) as counter:
        step(inputs, targets)                          # no optimizer: forward, backward, gradients cleared
    return int(counter.get_total_flops())


def flops_per_sample(model: nn.Module, sample_shape: tuple[int, ...], batch_size: int = 2,
                     device: str | torch.device | None = None) -> float:
    """Training FLOPs (forward + backward) per sample, counted on a small batch; BN running stats restored."""
    param = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (param.device if param is not None else torch.device("cpu"))
    x = torch.randn(batch_size, *sample_shape, device=dev)
    with preserved_state(model):
        total = count_training_flops(model, x)
    return total / batch_size


def mfu(achieved_flops_per_s: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when either number is unknown."""
    if achieved_flops_per_s is None or peak is None or peak <= 0:
        return None
    return achieved_flops_per_s / peak


def checked_mfu(achieved_flops_per_s: float | None, peak: float | None, peak_note: str = "") -> float | None:
    """MFU that cannot exceed 100%: above it the peak must be wrong, so warn naming it and clamp to 1.0."""
    value = mfu(achieved_flops_per_s, peak)
    if value is not None and value > 1.0:
        warnings.warn(f"measured {achieved_flops_per_s / _T:.1f} TFLOP/s is {100 * value:.0f}% of the peak used "
                      f"({peak_note or f'{peak / _T:g} TFLOP/s'}): that peak is too low for the math that ran "
                      "(TF32 or autocast not detected?); MFU clamped to 100%", RuntimeWarning, stacklevel=2)
        return 1.0
    return value


def measured_matmul_flops_per_s(device: str | torch.device | None = None, size: int | None = None,
                                repeats: int = 5) -> tuple[float, str]:
    """(FLOP/s, where) a dense fp32 matmul really reaches on this device: the explorer's default T_comp rate.

    Measured, not assumed: a hard-coded 20 TFLOP/s is 100x off on a laptop CPU and 3x off on an H100 (TF32).
    A training step reaches less than a bare GEMM (see ``measured_training_flops_per_s``), so this is an
    upper bound on the compute rate; the note says which device it came from.
    """
    dev = get_device(device)
    n = checked_int(size, "size", allow_none=True) or (4096 if dev.type == "cuda" else 512)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    median_s = time_fn(lambda: a @ b, warmup=2, repeats=repeats, device=dev).median_s
    flops = 2.0 * n ** 3 / median_s
    return flops, f"{flops / 1e12:.3g} TFLOP/s measured: fp32 {n}x{n} matmul on {device_label(dev)}"


def measured_training_flops_per_s(device: str | torch.device | None = None, model: str = "resnet18",
                                  batch_size: int | None = None, repeats: int = 3) -> tuple[float, str]:
    """(FLOP/s, note) one replica sustains in a real fp32 training step here: peak x measured MFU.

    Counted FLOPs of a forward + backward + SGD step divided by its median time. On a GPU with a known peak the
    note splits it into the datasheet peak of the math mode in use and the MFU; a CPU has no peak, so no MFU.
    """
    dev = get_device(device)
    batch = checked_int(batch_size, "batch_size", allow_none=True) or (256 if dev.type == "cuda" else 32)
    net = build_model(model).to(dev)
    per_sample = flops_per_sample(net, (3, 32, 32), device=dev)
    step = TrainStep(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), device=dev)
    x, y = torch.randn(batch, 3, 32, 32, device=dev), torch.randint(0, 10, (batch,), device=dev)
    achieved = per_sample * batch / time_fn(lambda: step(x, y), warmup=2, repeats=positive_int(repeats, "repeats"), device=dev).median_s
    where = f"{model} training step, batch {batch}, on {device_label(dev)}"
    peak, peak_note = peak_flops_per_s(dev, active_math_mode(dev))
    share = checked_mfu(achieved, peak, peak_note)
    if share is None:
        return achieved, f"{achieved / 1e12:.3g} TFLOP/s measured: {where} ({peak_note})"
    return achieved, (f"{achieved / 1e12:.3g} TFLOP/s = {peak / 1e12:g} TFLOP/s peak x {100 * share:.0f}% "
                      f"measured MFU: {where} ({peak_note})")
