"""The speedup explorer's maths: predicted epoch time, speedup and efficiency of synchronous data parallelism.

Vary replicas, per-replica batch, model size, link latency and bandwidth; ``explore()`` answers with the
performance model of ``labkit.parallel.data.costmodel``. Plain Python, no widgets: ``labkit.ui.explorer`` puts
sliders on it. Compute per step uses the 6*N FLOPs-per-sample rule of thumb for dense layers (Kaplan et al.
2020, "Scaling Laws for Neural Language Models", section 2.1); T_sync is the ring all-reduce of the fp32
gradients (``labkit.parallel.data.costmodel.sync_time_s``; Patarasuk & Yuan 2009). With ``ranks_per_node`` set, the
replicas fill nodes of that many ranks and a second, slower link joins the nodes: T_sync is then the two-tier cost
of a flat ring or of the two-level all-reduce (``labkit.comm.two_tier``; notebook 12 measures both tiers).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from labkit.comm.two_tier import TWO_TIER_ALGORITHMS, Link, two_tier_cost_s
from labkit.core.validation import positive_int, positive_number
from labkit.parallel.data.costmodel import epoch_time_s, pays_off, predicted_speedup, sync_time_s
from labkit.parallel.data.scaling import ScalingPoint

FLOPS_PER_PARAM_PER_SAMPLE = 6.0   # forward 2N + backward 4N (Kaplan et al. 2020)


@dataclass(frozen=True)
class ExplorerSettings:
    """One point in the explorer's space; units in the names."""

    world_size: int = 8                  # R replicas
    batch: int = 256                     # per replica
    model_params_m: float = 25.0         # millions of parameters (ResNet-50 has about 25.6 M)
    latency_us: float = 10.0             # alpha: per-message latency
    bandwidth_gb_s: float = 100.0        # 1/beta: link bandwidth (NVLink-class; ~10 for 100 Gb/s Ethernet)
    device_flops_per_s: float | None = None  # one replica's sustained FLOP/s: flops.measured_training_flops_per_s()
    n_samples: int = 1_281_167           # samples per epoch (ImageNet-1k train)
    bytes_per_param: int = 4             # fp32 gradients
    algorithm: str = "ring"              # one tier: any of collectives.ALGORITHMS; two tiers: "flat" or "hierarchical"
    ranks_per_node: int | None = None    # None: one link for all; else nodes of this many ranks, joined by ...
    inter_latency_us: float = 20.0       # ... a second link: its latency
    inter_bandwidth_gb_s: float = 12.5   # ... and bandwidth (12.5 GB/s: 100 Gbit/s Ethernet or InfiniBand EDR)

    def __post_init__(self) -> None:
        for name in ("world_size", "batch", "n_samples", "bytes_per_param"):
            positive_int(getattr(self, name), name)
        for name in ("model_params_m", "bandwidth_gb_s", "inter_bandwidth_gb_s"):
            positive_number(getattr(self, name), name)
        if self.device_flops_per_s is not None:
            positive_number(self.device_flops_per_s, "device_flops_per_s")
        for name in ("latency_us", "inter_latency_us"):
            if not getattr(self, name) >= 0:          # 0 is allowed: an ideal link
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.ranks_per_node is not None:
            positive_int(self.ranks_per_node, "ranks_per_node")
            if self.algorithm not in TWO_TIER_ALGORITHMS:
                raise ValueError(f"with ranks_per_node set (two tiers of links) algorithm must be one of "
                                 f"{TWO_TIER_ALGORITHMS}, got {self.algorithm!r}")

    @property
    def two_tier(self) -> bool:
        """True when the replicas span more than one node, so the link between nodes is in play."""
        return self.ranks_per_node is not None and self.world_size > self.ranks_per_node


@dataclass(frozen=True)
class ExplorerResult:
    """What the model predicts for one ExplorerSettings; times in seconds."""

    t_comp_s: float
    t_sync_s: float
    epoch_time_alone_s: float
    epoch_time_s: float
    speedup: float
    efficiency: float
    pays: bool


def step_compute_s(settings: ExplorerSettings) -> float:
    """T_comp of one step: 6 * params * batch FLOPs at the device's sustained rate."""
    if settings.device_flops_per_s is None:
        raise ValueError("device_flops_per_s is unset: pass this device's sustained rate, "
                         "labkit.training.flops.measured_training_flops_per_s()[0] (peak x measured MFU), or a number of FLOP/s")
    flops = FLOPS_PER_PARAM_PER_SAMPLE * settings.model_params_m * 1e6 * settings.batch
    return flops / settings.device_flops_per_s


def sync_seconds(settings: ExplorerSettings, nbytes: int) -> float:
    """T_sync of one step: the one-tier alpha-beta cost, or the two-tier one once the replicas span nodes."""
    s = settings
    if s.ranks_per_node is None:
        return sync_time_s(nbytes, s.world_size, s.latency_us * 1e-6, s.bandwidth_gb_s * 1e9, s.algorithm)
    intra = Link(s.latency_us * 1e-6, 1.0 / (s.bandwidth_gb_s * 1e9))
    inter = Link(s.inter_latency_us * 1e-6, 1.0 / (s.inter_bandwidth_gb_s * 1e9))
    return two_tier_cost_s(s.algorithm, s.world_size, s.ranks_per_node, nbytes, intra, inter)


def explore(settings: ExplorerSettings) -> ExplorerResult:
    """Predicted epoch time, speedup and efficiency of ``settings.world_size`` synchronous replicas."""
    s = settings
    t_comp = step_compute_s(s)
    nbytes = int(s.model_params_m * 1e6 * s.bytes_per_param)
    t_sync = sync_seconds(s, nbytes)
    alone = epoch_time_s(s.n_samples, s.batch, t_comp)
    with_r = epoch_time_s(s.n_samples, s.batch, t_comp, t_sync, s.world_size)
    speedup = predicted_speedup(t_comp, t_sync, s.world_size)
    return ExplorerResult(t_comp, t_sync, alone, with_r, speedup, speedup / s.world_size,
                          pays_off(t_comp, t_sync, s.world_size) or s.world_size == 1)


def speedup_curve(settings: ExplorerSettings, world_sizes: list[int]) -> np.ndarray:
    """Predicted speedup for each world size, everything else as in ``settings``."""
    return np.array([explore(replace(settings, world_size=int(size))).speedup for size in world_sizes])


def readout_text(settings: ExplorerSettings, result: ExplorerResult) -> str:
    """The one-paragraph readout: predicted speedup, efficiency, epoch times and the verdict."""
    verdict = "pays off" if result.pays else "does NOT pay off"
    tiers = ""
    if settings.ranks_per_node is not None:
        nodes = -(-settings.world_size // settings.ranks_per_node)
        tiers = f" on {nodes} node(s) of {settings.ranks_per_node}, {settings.algorithm} all-reduce,"
    return (f"R={settings.world_size}{tiers}: predicted speedup {result.speedup:.2f}x, efficiency "
            f"{100 * result.efficiency:.1f}% | epoch {result.epoch_time_s:.1f} s vs {result.epoch_time_alone_s:.1f} s "
            f"alone | T_comp {1e3 * result.t_comp_s:.2f} ms, T_sync {1e3 * result.t_sync_s:.2f} ms per step | "
            f"{verdict} (needs T_sync < (R-1) T_comp)")


def measured_overlay_text(points: list[ScalingPoint]) -> str:
    """One line per measured point: predicted vs measured speedup and the relative error."""
    return "; ".join(f"R={p.world_size}: measured {p.measured_speedup:.2f}x, predicted {p.predicted_speedup:.2f}x "
                     f"({100 * p.relative_error:+.0f}%)" for p in points if p.world_size > 1)
