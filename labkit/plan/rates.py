"""How fast one rank computes a layer after the split: each GEMM's achieved rate from its shape, and the
memory-bound element-wise work beside it. Splitting a layer finer (tp, cp, a smaller micro-batch) makes its GEMMs
smaller, and this is where that has its price; the model's FLOP/s utilisation (MFU) becomes an output.

- The large-GEMM rate is the device's ``efficiency`` x peak. For listed GPUs it defaults to the measured Maximum
  Achievable Matmul FLOPS (MAMF) of :data:`MAMF`, a cited per-GPU table (Bekman, Machine Learning Engineering
  Open Book, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table": bf16 matmuls, the
  best shape of a sweep); elsewhere 0.4, or what the user measured (this machine: the self-score's efficiency).
- Small GEMMs are derated by NVIDIA's dimension-quantization model (NVIDIA, "Matrix Multiplication Background
  User's Guide", DU-09799-001, Chapter 3): the output is cut into tiles (Sec. 2.3 lists 256x128, 128x256 and
  128x128 as cuBLAS's large tiles; the best of the three is taken), each SM runs one tile at a time, so a GEMM of
  T tiles on S SMs takes ceil(T/S) waves and the useful fraction is (M N / tile area) / (waves x S) (Sec. 3.1-3.2).
  Then the roofline (Williams et al. 2009; the guide's Sec. 2): a GEMM takes at least its bytes over the memory
  bandwidth. A device without SM count or bandwidth (a CPU, a user's device) is not derated.
- Element-wise work (norms, activations, softmax, dropout, residuals) is memory-bound: each byte a layer keeps for
  backward (Korthikanti et al. 2022's count) is written once forward, read once backward and its gradient written
  once: 3x the layer's activation bytes over the memory bandwidth (4x when the forward is recomputed).
Backward GEMMs (data and weight gradients) are taken at the forward GEMM's rate, twice its FLOPs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from labkit.core.validation import positive_number
from labkit.training.flops import find_peak

GIB = 2**30
# (name substring, bf16 MAMF TFLOP/s, datasheet bf16 TFLOP/s) - Bekman's table, BF16 rows (torch 2.6.0+cu126 for
# the A100 SXM, 2.7.0+cu126 for the H100 SXM)
MAMF_SOURCE = ("S. Bekman, Machine Learning Engineering Open Book, compute/accelerator/README.md, 'Maximum "
               "Achievable Matmul FLOPS comparison table' (BF16)")
MAMF = (("A100 SXM", 271.2, 312.0), ("H100 SXM", 794.5, 989.0))
# SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs in the A100); NVIDIA H100 Tensor Core GPU
# Architecture whitepaper (132 SMs in the H100 SXM5; the H200 SXM is the same GH100 die). Memory bandwidth: the
# A100 datasheet (2,039 GB/s for the 80 GB SXM, 1,555 GB/s for 40 GB); the H100 datasheet (3.35 TB/s, SXM); the
# H200 datasheet (4.8 TB/s).
SMS = (("A100", 108), ("H100 SXM", 132), ("H200", 132))
MEMORY_BYTES_PER_S = (("A100", 80, 2039e9), ("A100", 40, 1555e9), ("H100 SXM", 80, 3.35e12), ("H200", 141, 4.8e12))
TILES = ((256, 128), (128, 256), (128, 128))
DEFAULT_EFFICIENCY = 0.4      # the planner's old constant, where no MAMF is listed and nothing was measured


def mamf_efficiency(gpu: str) -> tuple[float, str] | None:
    """(large-GEMM fraction of peak, source) for a listed GPU, or None."""
    for key, mamf, peak in MAMF:
        if key.replace(" ", "").lower() in gpu.replace(" ", "").lower():
            return mamf / peak, f"{MAMF_SOURCE}: {mamf} of {peak} TFLOP/s"
    return None


def sm_count(gpu: str) -> int:
    """Streaming multiprocessors of a listed GPU (0: unknown, no quantization)."""
    return next((n for key, n in SMS if key.replace(" ", "").lower() in gpu.replace(" ", "").lower()), 0)


def memory_bandwidth(gpu: str, memory_gib: float) -> float:
    """Datasheet memory bytes/s of a listed GPU of that memory size (0.0: unknown, no memory roof)."""
    norm = gpu.replace(" ", "").lower()
    return next((bw for key, gib, bw in MEMORY_BYTES_PER_S
                 if key.replace(" ", "").lower() in norm and abs(memory_gib - gib) <= 0.1 * gib), 0.0)


def wave_utilisation(m: int, n: int, count: int, sms: int) -> float:
    """The useful fraction of the SMs' tile slots for ``count`` GEMMs of an M x N output, the best cuBLAS tile."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * count
        best = max(best, (m * n * count / (tm * tn)) / (math.ceil(tiles / sms) * sms))
    return min(1.0, best)


def gemm_s(m: float, n: float, k: float, peak: float, efficiency: float, sms: int, bandwidth: float,
           count: int = 1, elem_bytes: int = 2) -> float:
    """Seconds of ``count`` (M x K) @ (K x N) GEMMs: the large-GEMM rate derated by wave quantization, at least
    their bytes over the memory bandwidth."""
    m, n, k = max(1, int(m)), max(1, int(n)), max(1, int(k))
    math_s = 2.0 * m * n * k * count / (peak * efficiency * wave_utilisation(m, n, count, sms))
    memory_s = elem_bytes * (m * k + k * n + m * n) * count / bandwidth if bandwidth else 0.0
    return max(math_s, memory_s)


@lru_cache(maxsize=4096)
def layer_forward_s(hidden: int, heads: int, kv_heads: int, ffn: int, gated: bool, tokens: int, seq: int,
                    cp: int, tp: int, micro_batch: int, peak: float, efficiency: float, sms: int,
                    bandwidth: float) -> tuple[float, float]:
    """(GEMMs outside attention, one ring step's attention block) seconds of one layer's forward on one rank:
    QKV, output projection and the FFN's matrices on ``tokens`` = b s / cp rows with tp-split weights; the score
    and weighted-value products batched over b x heads/tp, each block (s/cp) x (s/cp) x head size."""
    h, t = hidden, tp
    kv_dim = h // heads * kv_heads
    up = (2 if gated else 1) * ffn
    args = (peak, efficiency, sms, bandwidth)
    dense = (gemm_s(tokens, (h + 2 * kv_dim) / t, h, *args) + gemm_s(tokens, h, h / t, *args)
             + gemm_s(tokens, up / t, h, *args) + gemm_s(tokens, h, ffn / t, *args))
    block, d, batch = seq // cp, h // heads, micro_batch * max(1, heads // t)
    attention = gemm_s(block, block, d, *args, count=batch) + gemm_s(block, d, block, *args, count=batch)
    return dense, attention


def logits_forward_s(hidden: int, vocab: int, tokens: int, tp: int, peak: float, efficiency: float, sms: int,
                     bandwidth: float) -> float:
    """The output embedding's GEMM (tokens x h x V/tp) on the last stage."""
    return gemm_s(tokens, vocab / tp, hidden, peak, efficiency, sms, bandwidth)


def elementwise_s(layer_bytes: float, bandwidth: float, recompute: bool) -> float:
    """Memory-bound work of one layer, forward + backward: 3x (4x recomputed) its kept bytes over the bandwidth."""
    return (4 if recompute else 3) * layer_bytes / bandwidth if bandwidth else 0.0


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: memory, the peak FLOP/s of the math mode used, the fraction of it a large GEMM reaches
    (``efficiency``), and for the per-shape rates of :mod:`labkit.plan.rates` its SMs and memory bandwidth (0: not
    derated)."""

    name: str
    memory_bytes: float
    peak_flops_per_s: float
    efficiency: float = 0.4
    param_bytes: int = 2                 # bf16 weights and gradients
    optimizer_bytes_per_param: int = 12  # fp32 master + Adam's two moments
    sms: int = 0
    memory_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        positive_number(self.memory_bytes, "memory_bytes")
        positive_number(self.peak_flops_per_s, "peak_flops_per_s")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency is a fraction of the peak (0 < e <= 1), got {self.efficiency}")

    @classmethod
    def from_table(cls, gpu: str, memory_gib: float, math_mode: str = "bf16",
                   efficiency: float | None = None) -> "DeviceSpec":
        """A GPU from the kit's one peak table (labkit.training.flops.PEAK_TABLE); ``efficiency`` None: the
        GPU's cited large-GEMM rate (:data:`labkit.plan.rates.MAMF`) where listed, else 0.4."""
        spec = find_peak(gpu)
        if spec is None or math_mode not in spec.peak_flops_per_s:
            raise ValueError(f"no {math_mode} peak for {gpu!r} in labkit.training.flops.PEAK_TABLE")
        names = f"{gpu} {spec.name}"
        mamf = mamf_efficiency(names) if math_mode == "bf16" else None
        eff = efficiency if efficiency is not None else (mamf[0] if mamf else DEFAULT_EFFICIENCY)
        return cls(spec.name, memory_gib * GIB, spec.peak_flops_per_s[math_mode], eff, sms=sm_count(names),
                   memory_bytes_per_s=memory_bandwidth(names, memory_gib))
