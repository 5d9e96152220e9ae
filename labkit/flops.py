"""FLOPs per training sample, achieved FLOP/s, and model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s / the device's peak FLOP/s (Chowdhery et al. 2022, PaLM, appendix B).
Model FLOPs are counted, not estimated, with ``torch.utils.flop_counter.FlopCounterMode`` over one
forward *and* backward pass. Peaks come from the vendor datasheets below (dense, no sparsity); for a
device not in the table the kit says "peak unknown" rather than guessing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class PeakSpec:
    """Peak dense FLOP/s of one GPU model, by compute dtype, and where the figures come from."""

    name: str
    match: tuple[str, ...]          # every substring must appear in torch.cuda.get_device_name()
    exclude: tuple[str, ...]        # none of these may appear
    peak_flops_per_s: dict          # dtype ("float32" | "tf32" | "bfloat16" | "float16") -> FLOP/s
    source: str


_T = 1e12
# Dense figures. NVIDIA datasheets print the tensor-core rows "with sparsity"; dense is half of that.
PEAK_TABLE: tuple[PeakSpec, ...] = (
    PeakSpec("NVIDIA H100 SXM", ("H100",), ("PCIe", "NVL"),
             {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T, "float16": 989.5 * _T},
             "NVIDIA H100 Tensor Core GPU datasheet (SXM column; tensor rows 989/1979 TFLOPS with sparsity halved)"),
    PeakSpec("NVIDIA H100 PCIe", ("H100", "PCIe"), (),
             {"float32": 51 * _T, "tf32": 378 * _T, "bfloat16": 756.5 * _T, "float16": 756.5 * _T},
             "NVIDIA H100 Tensor Core GPU datasheet (PCIe column; 1,513 TFLOPS BF16 with sparsity halved)"),
    PeakSpec("NVIDIA H200 SXM", ("H200",), ("NVL",),
             {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T, "float16": 989.5 * _T},
             "NVIDIA H200 Tensor Core GPU datasheet (SXM column; same compute as H100 SXM, sparsity halved)"),
    PeakSpec("NVIDIA A100", ("A100",), (),
             {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T, "float16": 312 * _T},
             "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), "
             "dense figures; same for 40 GB/80 GB, SXM4/PCIe"),
    PeakSpec("NVIDIA V100 SXM2", ("V100", "SXM2"), (),
             {"float32": 15.7 * _T, "float16": 125 * _T},
             "NVIDIA Tesla V100 datasheet (SXM2: 15.7 TFLOPS FP32, 125 TFLOPS tensor FP16)"),
    PeakSpec("NVIDIA T4", ("T4",), ("T40",),
             {"float32": 8.1 * _T, "float16": 65 * _T},
             "NVIDIA T4 Tensor Core GPU datasheet (8.1 TFLOPS FP32, 65 TFLOPS mixed FP16/FP32)"),
)

_DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "tf32": "tf32", "bf16": "bfloat16",
                  "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16"}


def normalise_dtype(dtype: str | torch.dtype | None) -> str:
    """'bf16' / torch.bfloat16 -> 'bfloat16'; None -> 'float32'."""
    if dtype is None:
        return "float32"
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPE_ALIASES))}")
    return _DTYPE_ALIASES[key]


def find_peak(device_name: str) -> PeakSpec | None:
    """The table entry whose name patterns match ``device_name`` (None when the GPU is not listed)."""
    for spec in PEAK_TABLE:
        if all(m in device_name for m in spec.match) and not any(x in device_name for x in spec.exclude):
            return spec
    return None


def peak_flops_per_s(device: str | torch.device | None = None,
                     dtype: str | torch.dtype | None = None) -> tuple[float | None, str]:
    """(peak FLOP/s, note) for a device and compute dtype; (None, why) when it is not known."""
    dt = normalise_dtype(dtype)
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return None, "peak FLOP/s unknown for CPUs (depends on model, cores, clocks and vector units): no MFU"
    name = torch.cuda.get_device_name(dev)
    spec = find_peak(name)
    if spec is None:
        return None, f"peak FLOP/s of {name!r} is not in labkit.flops.PEAK_TABLE: no MFU (add it with its datasheet)"
    if dt not in spec.peak_flops_per_s:
        return None, f"{spec.name}: datasheet gives no {dt} peak: no MFU"
    return spec.peak_flops_per_s[dt], f"{spec.name} {dt} dense peak; source: {spec.source}"


def count_training_flops(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None,
                         loss_fn: nn.Module | None = None) -> int:
    """FLOPs of one forward + backward pass of ``model`` on ``inputs`` (the whole batch), counted exactly."""
    from torch.utils.flop_counter import FlopCounterMode

    loss_fn = loss_fn or nn.CrossEntropyLoss()
    with FlopCounterMode(display=False) as counter:
        out = model(inputs)
        if targets is None:
            targets = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
        loss_fn(out, targets).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def flops_per_sample(model: nn.Module, sample_shape: tuple[int, ...], batch_size: int = 2,
                     device: str | torch.device | None = None) -> float:
    """Training FLOPs (forward + backward) per sample, counted on a small batch; BN running stats restored."""
    from labkit.memory import preserved_state

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
