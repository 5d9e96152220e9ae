"""The roofline model: an operation takes at least max(FLOPs / peak FLOP/s, bytes / bandwidth).

Williams, Waterman & Patterson, "Roofline: An Insightful Visual Performance Model for Multicore
Architectures", Communications of the ACM 52(4), 65-76, 2009. Attainable FLOP/s = min(peak FLOP/s,
arithmetic intensity x bandwidth); the *ridge point* peak / bandwidth (FLOP per byte) splits operations into
memory-bound (left of it) and compute-bound (right of it). The two roofs are measured on this machine
(:mod:`labkit.profile.roofs`), not taken from a datasheet.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from labkit.core.clock import percentile

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CACHE_TAG = "in cache"          # bandwidth roofs measured on arrays that fit the caches carry this in their name
ROOFLINE_CITATION = ("Williams, Waterman & Patterson, 'Roofline: An Insightful Visual Performance Model for "
                     "Multicore Architectures', CACM 52(4), 2009")


@dataclass(frozen=True)
class RoofMeasurement:
    """One measured roof (matmul FLOP/s of one dtype, or copy/triad bytes/s): every round, and the datasheet."""

    name: str                        # 'matmul fp32', 'copy', 'triad'
    unit: str                        # 'FLOP/s' or 'B/s'
    rounds: tuple[float, ...]        # one rate per timed repeat
    size: int                        # matrix side (matmul) or bytes per array (copy, triad)
    datasheet: float | None = None   # the vendor's figure, None where none is known (every CPU)
    source: str = ""                 # where the datasheet figure comes from, or why there is none
    sweep: tuple[tuple[int, float], ...] = ()   # (matrix side, median FLOP/s) of each size tried (matmul only)

    def __post_init__(self) -> None:
        if self.unit not in ("FLOP/s", "B/s"):
            raise ValueError(f"unit must be 'FLOP/s' or 'B/s', got {self.unit!r}")
        if not self.rounds or any(not math.isfinite(r) or r <= 0 for r in self.rounds):
            raise ValueError(f"{self.name}: rounds must be positive finite rates, got {self.rounds}")

    @property
    def roof(self) -> float:
        """The best rate measured (a repeat, or a swept size's median), as STREAM reports its kernels: a roof is
        what the machine *can* sustain, and on a shared machine the slower repeats measure the neighbours."""
        return max(max(self.rounds), max((rate for _, rate in self.sweep), default=0.0))

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def p10(self) -> float:
        return percentile(list(self.rounds), 10)

    @property
    def p90(self) -> float:
        return percentile(list(self.rounds), 90)

    @property
    def fraction_of_datasheet(self) -> float | None:
        """The roof over the datasheet figure (None where there is no datasheet figure)."""
        return self.roof / self.datasheet if self.datasheet else None

    @property
    def sweep_gain(self) -> float | None:
        """Best swept rate over the smallest size's: how much a big matmul beats a small one (None: no sweep)."""
        if len(self.sweep) < 2 or self.sweep[0][1] <= 0:
            return None
        return max(rate for _, rate in self.sweep) / self.sweep[0][1]

    def row(self) -> dict:
        """A table row: the roof with its spread, the datasheet figure and the fraction reached."""
        scale, unit = (1e9, "GFLOP/s") if self.unit == "FLOP/s" else (1e9, "GB/s")
        return {"roof": self.name, "best": self.roof / scale, "median": self.median / scale, "p10": self.p10 / scale, "p90": self.p90 / scale,
                "unit": unit, "datasheet": self.datasheet / scale if self.datasheet else None,
                "fraction": self.fraction_of_datasheet, "size": self.size, "source": self.source}


@dataclass(frozen=True)
class Roofs:
    """The machine's measured roofs: matmul FLOP/s by dtype and sustained bandwidth (copy and triad)."""

    device: str
    compute: dict[str, RoofMeasurement] = field(default_factory=dict)     # dtype name -> roof
    bandwidth: dict[str, RoofMeasurement] = field(default_factory=dict)   # 'copy', 'triad' -> roof

    def __post_init__(self) -> None:
        if "fp32" not in self.compute or not any(CACHE_TAG not in name for name in self.bandwidth):
            raise ValueError("Roofs needs at least the fp32 matmul roof and one memory bandwidth roof")

    def peak_flops_per_s(self, dtype: str = "fp32") -> float:
        """The measured matmul roof of ``dtype`` (its best repeat)."""
        if dtype not in self.compute:
            raise ValueError(f"no {dtype} roof was measured here; measured: {sorted(self.compute)}")
        return self.compute[dtype].roof

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """The memory (DRAM/HBM) roof: the faster of the large copy and triad."""
        return max(r.roof for name, r in self.bandwidth.items() if CACHE_TAG not in name)

    @property
    def cache_bytes_per_s(self) -> float | None:
        """The cache roof: the faster of the cache-sized copy and triad (None where none was measured)."""
        rates = [r.roof for name, r in self.bandwidth.items() if CACHE_TAG in name]
        return max(rates) if rates else None

    def measurement_spread(self, dtype: str = "fp32") -> float:
        """How far the best repeat of the roofs the operators are priced on (``dtype``'s matmul, every bandwidth
        roof) sits above its median, as a fraction: about 0 on a steady machine. A roof whose best repeat is 10x its
        typical one was measured through someone else's load, and cannot anchor a band of 10x."""
        used = [self.compute[dtype], *self.bandwidth.values()] if dtype in self.compute else list(self.bandwidth.values())
        return max(r.roof / r.median - 1.0 for r in used)

    @property
    def cache_limit_bytes(self) -> int:
        """Bytes an operator may move and still be priced at the cache roof: the cache triad's working set."""
        sizes = [3 * r.size for name, r in self.bandwidth.items() if CACHE_TAG in name]
        return max(sizes) if sizes else 0

    def bandwidth_for(self, bytes_moved: float) -> float:
        """The roof an operator moving ``bytes_moved`` meets: the cache's if it fits there, else memory's
        (Ilic, Pratas & Sousa, "Cache-aware Roofline model: Upgrading the loft", IEEE CAL 13(1), 2014)."""
        cache = self.cache_bytes_per_s
        if cache is not None and bytes_moved <= self.cache_limit_bytes:
            return max(cache, self.bandwidth_bytes_per_s)
        return self.bandwidth_bytes_per_s

    def ridge_flops_per_byte(self, dtype: str = "fp32", in_cache: bool = False) -> float:
        """The ridge point: arithmetic intensity where the compute roof meets the memory (or cache) roof."""
        bw = self.bandwidth_for(0) if in_cache else self.bandwidth_bytes_per_s
        return self.peak_flops_per_s(dtype) / bw

    def predict_time_s(self, flops: float, bytes_moved: float, dtype: str = "fp32") -> float:
        """The roofline's lower bound on time: max(FLOPs / peak, bytes / bandwidth of the level they fit in)."""
        return max(flops / self.peak_flops_per_s(dtype), bytes_moved / self.bandwidth_for(bytes_moved))

    def bound(self, flops: float, bytes_moved: float, dtype: str = "fp32") -> str:
        """'compute' right of the ridge point of the level the bytes fit in, 'memory' left of it."""
        if bytes_moved <= 0:
            return "compute"
        return "compute" if flops / self.peak_flops_per_s(dtype) >= bytes_moved / self.bandwidth_for(bytes_moved) \
            else "memory"

    def table(self) -> list[dict]:
        """Every roof as a row (compute roofs first)."""
        return [r.row() for r in (*self.compute.values(), *self.bandwidth.values())]


def attainable_flops_per_s(intensity_flops_per_byte: float, peak_flops_per_s: float,
                           bandwidth_bytes_per_s: float) -> float:
    """The roofline itself: min(peak, intensity x bandwidth) (Williams et al. 2009, eq. 1)."""
    return min(peak_flops_per_s, intensity_flops_per_byte * bandwidth_bytes_per_s)


def plot_roofline(roofs: Roofs, points: Sequence[dict], dtype: str = "fp32", ax: Axes | None = None,
                  title: str = "") -> Axes:
    """Log-log roofline with the ridge point marked; ``points`` carry intensity, achieved FLOP/s, label, kind."""
    import matplotlib.pyplot as plt  # lazy: plotting only where a figure is drawn

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    peak, bw = roofs.peak_flops_per_s(dtype), roofs.bandwidth_bytes_per_s
    ridge = peak / bw
    xs = [p["intensity_flops_per_byte"] for p in points if p["intensity_flops_per_byte"] > 0] or [ridge]
    lo, hi = min(min(xs), ridge) / 4, max(max(xs), ridge) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.loglog(grid, [attainable_flops_per_s(x, peak, bw) for x in grid], color="black", lw=2,
              label=f"measured roof ({dtype} matmul, sustained bandwidth)")
    ax.axvline(ridge, ls="--", color="grey", label=f"ridge point {ridge:.1f} FLOP/B")
    if roofs.cache_bytes_per_s and roofs.cache_bytes_per_s > bw:
        ax.loglog(grid, [attainable_flops_per_s(x, peak, roofs.cache_bytes_per_s) for x in grid], color="grey",
                  lw=1, ls=":", label=f"cache roof (operators moving <= {roofs.cache_limit_bytes / 2**20:.0f} MiB)")
    for kind in sorted({p["kind"] for p in points}):
        mine = [p for p in points if p["kind"] == kind and p["intensity_flops_per_byte"] > 0]
        ax.scatter([p["intensity_flops_per_byte"] for p in mine], [p["achieved_flops_per_s"] for p in mine],
                   s=18, alpha=0.7, label=kind)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or f"Roofline on {roofs.device}")
    ax.legend(fontsize=7)
    return ax
