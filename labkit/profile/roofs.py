"""The machine's two roofs, measured live: peak matmul FLOP/s per dtype, and sustained memory bandwidth.

Compute roof: square matmuls of growing size (2n^3 FLOPs each) until the rate stops rising (a plateau: the
next size gains under 10%), then repeats at the best size give the roof and its spread. Bandwidth roof: a
large copy (reads and writes n elements: 2n x itemsize bytes) and a triad a = b + s*c (3n x itemsize),
the two kernels of McCalpin's STREAM benchmark (McCalpin 1995, "Memory Bandwidth and Machine Balance in
Current High Performance Computers", IEEE TCCA Newsletter), counted the same way. Both are printed beside the
datasheet figure from :data:`labkit.training.flops.PEAK_TABLE` where one is known; a CPU has none.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from labkit.core.clock import interleaved
from labkit.core.contention import ShareMeter
from labkit.core.device import device_label, get_device
from labkit.core.timing import time_fn
from labkit.core.torch_compat import cpu_has_native_bf16
from labkit.core.validation import positive_int
from labkit.core.verdict import (INCONCLUSIVE, Load, Rival, Verdict, judge_agreement, judge_at_least,
                                 relative_spread)
from labkit.profile.roofline import CACHE_TAG, RoofMeasurement, Roofs
from labkit.training.flops import fp32_math, peak_flops_per_s, peak_memory_bytes_per_s

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PLATEAU_GAIN = 1.10        # a size that raises the rate by less than 10% ends the sweep
# copy and triad "agree" within 1.5x: write-allocate makes a CPU's counted copy bandwidth about (2/3)/(3/4) = 0.89 of
# triad's, and a steady machine's rounds spread up to 25% (verdict.BUSY_SPREAD); the rival 2x stays outside
COPY_TRIAD_WITHIN = 1.5


@dataclass(frozen=True)
class RoofConfig:
    """How hard to measure: matmul sizes swept, bandwidth array size, timed repeats per roof."""

    min_matmul_n: int = 256
    max_matmul_n: int = 1024
    bandwidth_bytes: int = 64 * 2**20      # per array: far past the per-core caches, as STREAM asks (4x cache)
    repeats: int = 5
    cache_bytes: int = 4 * 2**20           # per array for the cache roof: a triad's 12 MiB stay in a server CPU's L3

    def __post_init__(self) -> None:
        for name in ("min_matmul_n", "max_matmul_n", "bandwidth_bytes", "repeats", "cache_bytes"):
            positive_int(getattr(self, name), name)
        if self.max_matmul_n < self.min_matmul_n:
            raise ValueError(f"max_matmul_n ({self.max_matmul_n}) must be >= min_matmul_n ({self.min_matmul_n})")

    @classmethod
    def fast(cls) -> RoofConfig:
        """CPU and tests: matmuls 64 to 1024, 64 MiB arrays (4 MiB for the cache roof), 5 repeats: seconds."""
        return cls(min_matmul_n=64)

    @classmethod
    def full(cls) -> RoofConfig:
        """GPU: matmuls 256 to 16384, 1 GiB arrays (8 MiB for the L2 roof), 10 repeats."""
        return cls(min_matmul_n=256, max_matmul_n=16384, bandwidth_bytes=2**30, repeats=10, cache_bytes=8 * 2**20)


def supported_matmul_dtypes(device: str | torch.device | None = None) -> list[str]:
    """The math modes worth a roof here: fp32 everywhere; bf16 on a CPU with native bf16; tf32/bf16/fp16 on GPUs."""
    dev = get_device(device)
    if dev.type == "cuda":
        major, _ = torch.cuda.get_device_capability(dev)
        return ["fp32", "tf32", "bf16", "fp16"] if major >= 8 else ["fp32", "fp16"]
    return ["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"]


def matmul_rates(n: int, mode: str, device: torch.device, repeats: int) -> list[float]:
    """FLOP/s of each of ``repeats`` n x n matmuls in math mode ``mode`` (2n^3 FLOPs each)."""
    a = torch.randn(n, n, device=device, dtype=DTYPES[mode])
    b = torch.randn(n, n, device=device, dtype=DTYPES[mode])
    with fp32_math(mode == "tf32"):
        times = time_fn(lambda: torch.mm(a, b), warmup=1, repeats=repeats, device=device).times_s
    return [2 * n**3 / t for t in times if t > 0]


def raise_by_round(roofs: Roofs, faster: str, device: torch.device, rounds: int, baseline: str = "fp32") -> list[float]:
    """How many times the ``faster`` mode's matmul rate is the ``baseline``'s, round by round: both at the larger of
    their two measured best sizes (on both plateaus: each sweep ran past its best), timed back to back in
    interleaved rounds, so a neighbour's burst hits both alike. Two roofs measured one after the other compare two
    spells of the machine (a CI run read bf16 at 0.24x fp32 where it is 2.1x); each at its own best size, a sweep
    stopped early by a burst compares a small matmul with a large one (another read 0.65x: bf16 at 128 runs 0.64x
    fp32 at 512 on the 2-core box, where both at 512 give 2.2x)."""
    size = max(roofs.compute[faster].size, roofs.compute[baseline].size)
    calls = {mode: (lambda m=mode: matmul_rates(size, m, device, 1)[0]) for mode in (faster, baseline)}
    timed = interleaved(calls, rounds=rounds)
    return [f / b for f, b in zip(timed[faster], timed[baseline]) if b > 0]


def sweep_matmul(mode: str, device: torch.device, config: RoofConfig) -> tuple[int, list[tuple[int, float]]]:
    """Double n until two sizes in a row gain under 10% on the best so far (a plateau, not one noisy dip);
    returns (best n, [(n, median FLOP/s), ...])."""
    swept: list[tuple[int, float]] = []
    n, flat = config.min_matmul_n, 0
    while n <= config.max_matmul_n and flat < 2:
        rates = sorted(matmul_rates(n, mode, device, repeats=3))
        best_so_far = max((rate for _, rate in swept), default=0.0)
        swept.append((n, rates[len(rates) // 2]))
        flat = flat + 1 if swept[-1][1] < PLATEAU_GAIN * best_so_far else 0
        n *= 2
    best_n = max(swept, key=lambda pair: pair[1])[0]
    return best_n, swept


def measure_compute_roof(mode: str, device: str | torch.device | None = None,
                         config: RoofConfig | None = None) -> RoofMeasurement:
    """The matmul roof of one math mode: swept to its plateau, then timed ``repeats`` times at the best size."""
    dev, config = get_device(device), config or RoofConfig.fast()
    if mode not in DTYPES:
        raise ValueError(f"mode must be one of {sorted(DTYPES)}, got {mode!r}")
    best_n, swept = sweep_matmul(mode, dev, config)
    datasheet, note = peak_flops_per_s(dev, mode)
    if dev.type != "cuda":
        note = "no datasheet figure for a CPU (it depends on the model, cores, clocks and vector units)"
    return RoofMeasurement(f"matmul {mode}", "FLOP/s", tuple(matmul_rates(best_n, mode, dev, config.repeats)),
                           best_n, datasheet, note, tuple(swept))


def _bandwidth_datasheet(dev: torch.device) -> tuple[float | None, str]:
    if dev.type != "cuda":
        return None, "no datasheet figure for a CPU's memory (it depends on channels, DIMMs and clocks)"
    return peak_memory_bytes_per_s(torch.cuda.get_device_name(dev))


def stream_roofs(array_bytes: int, repeats: int, device: torch.device, tag: str = "") -> dict[str, RoofMeasurement]:
    """Copy (2 arrays' bytes per call) and triad a = b + 3c (3 arrays'), STREAM-style, on float32 arrays, timed in
    interleaved rounds (round i of copy and of triad ran back to back: a neighbour's burst hits both alike)."""
    n = max(1, array_bytes // 4)
    a, b, c = (torch.rand(n, device=device) for _ in range(3))      # touched, so no first-touch page faults
    datasheet, note = _bandwidth_datasheet(device) if not tag else (None, "a cache has no datasheet roof here")
    kernels = {"copy": (lambda: a.copy_(b), 2), "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3)}
    for kernel, _ in kernels.values():
        time_fn(kernel, warmup=0, repeats=1, device=device)          # warm-up, untimed
    rounds = interleaved({name: lambda k=kernel: time_fn(k, warmup=0, repeats=1, device=device).times_s[0]
                          for name, (kernel, _) in kernels.items()}, rounds=repeats)
    roofs = {}
    for name, (kernel, arrays) in kernels.items():
        times = rounds[name]
        label = f"{name} {tag}".strip()
        roofs[label] = RoofMeasurement(label, "B/s", tuple(arrays * n * 4 / t for t in times if t > 0), n * 4,
                                       datasheet, note)
    return roofs


def measure_bandwidth_roofs(device: str | torch.device | None = None,
                            config: RoofConfig | None = None) -> dict[str, RoofMeasurement]:
    """The memory roof (arrays far larger than the caches) and the cache roof (arrays that fit in them)."""
    dev, config = get_device(device), config or RoofConfig.fast()
    return {**stream_roofs(config.bandwidth_bytes, config.repeats, dev),
            **stream_roofs(config.cache_bytes, 4 * config.repeats, dev, tag=CACHE_TAG)}


def measure_roofs(device: str | torch.device | None = None, config: RoofConfig | None = None,
                  modes: list[str] | None = None) -> Roofs:
    """Both roofs of this device: every supported matmul math mode, then copy and triad bandwidth."""
    dev = get_device(device)
    modes = modes or supported_matmul_dtypes(dev)
    compute = {mode: measure_compute_roof(mode, dev, config) for mode in modes}
    return Roofs(device_label(dev), compute, measure_bandwidth_roofs(dev, config))


def copy_triad_agreement(claim: str, roofs: Roofs, meter: ShareMeter, within: float = COPY_TRIAD_WITHIN) -> Verdict:
    """Do copy and triad read one memory roof, their bandwidths within ``within``x of each other?

    Decided on each round's copy/triad ratio (the two ran back to back), judged with this kernel's CPU share and
    the ratios' spread. The rival is 'two different roofs, a factor of 2 apart' (on the side the median lies); a
    band that admits it fails on a steady run, and is INCONCLUSIVE (load or spread) when the run was busy."""
    copy, triad = roofs.bandwidth["copy"].rounds, roofs.bandwidth["triad"].rounds
    ratios = [c / t for c, t in zip(copy, triad) if t > 0]
    if not ratios:
        raise ValueError("copy_triad_agreement needs the measured copy and triad rounds (measure_roofs first)")
    load = Load.from_meters({"this kernel": meter}, spread=relative_spread(ratios))
    median = statistics.median(ratios)
    rival = Rival("two different roofs, a factor of 2 apart", 2.0 if median >= 1.0 else 0.5)
    if load.busy and median / within <= rival.value <= median * within:
        return Verdict(claim, INCONCLUSIVE, f"copy/triad {median:.3g} (rounds {[round(r, 2) for r in ratios]}): its "
                                            f"band +-{within:g}x also holds the rival {rival.name} "
                                            f"({rival.value:g}); {load.reason()}", kind=load.kind, rival=rival.name)
    return judge_agreement(claim, 1.0, median, tolerance=within - 1.0, load=load,
                           unit="x copy/triad", by_round=[(1.0, ratio) for ratio in ratios], rival=rival)


SIZE_GAIN = 1.5     # the lesson's threshold: a big matmul at least 1.5x a small one's rate (a quiet CPU reads ~3x)


def size_gain_by_round(small_n: int, large_n: int, device: torch.device, rounds: int,
                       mode: str = "fp32") -> list[float]:
    """The ``large_n`` matmul's rate over the ``small_n`` one's, round by round, each pair timed back to back (best
    of 3 calls each): a neighbour's burst hits both sizes alike. The sweep alone times sizes one after another,
    and a CI run read a gain of 1.0 when a burst landed on every size past the first."""
    calls = {n: (lambda n=n: max(matmul_rates(n, mode, device, 3))) for n in (small_n, large_n)}
    timed = interleaved(calls, rounds=rounds)
    return [big / small for big, small in zip(timed[large_n], timed[small_n]) if small > 0]


def matmul_size_gain(claim: str, roofs: Roofs, device: str | torch.device | None = None, rounds: int = 7,
                     mode: str = "fp32") -> Verdict:
    """Does the largest swept matmul beat the smallest by :data:`SIZE_GAIN`? Timed in paired rounds, judged with
    this kernel's CPU share and the ratios' spread; the rival is 'size does not matter' (1.0x)."""
    dev, sweep = get_device(device), roofs.compute[mode].sweep
    if len(sweep) < 2:
        raise ValueError("matmul_size_gain needs a sweep of at least two sizes (measure_roofs first)")
    small_n, large_n = sweep[0][0], sweep[-1][0]
    with ShareMeter() as meter:
        gains = size_gain_by_round(small_n, large_n, dev, rounds, mode)
    load = Load.from_meters({"this kernel": meter}, spread=relative_spread(gains))
    return judge_at_least(claim, statistics.median(gains), SIZE_GAIN, load=load,
                          unit=f"x (n={large_n} over n={small_n})", by_round=[(g, SIZE_GAIN) for g in gains],
                          rival=Rival("size does not matter", 1.0))
