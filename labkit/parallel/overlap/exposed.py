"""Exposed communication, predicted: how much of a step's all-reduce time backward cannot hide.

The one-line model (the Ultra-Scale Playbook's overlap arithmetic): T_exposed = max(0, T_comm - T_overlappable),
where T_overlappable is the backward time left after the first bucket is ready. The per-bucket model refines it:
bucket k is ready when backward has produced its last gradient (r_k); the link carries one bucket at a time, so it
starts at max(r_k, end of bucket k-1) and takes alpha + beta * bytes_k (Hockney 1994; Thakur et al. 2005). Exposed
is what runs past the end of backward. Tiny buckets pay alpha per call; one huge bucket is ready only when backward
ends and overlaps nothing (Li et al. 2020, arXiv:2006.15704, figure 7): the best size sits between. Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


def exposed_time_s(comm_s: float, overlappable_s: float) -> float:
    """T_exposed = max(0, T_comm - T_overlappable): communication that no compute can hide."""
    if not (comm_s >= 0 and overlappable_s >= 0):
        raise ValueError(f"comm_s and overlappable_s must be >= 0, got {comm_s!r}, {overlappable_s!r}")
    return max(0.0, comm_s - overlappable_s)


def allreduce_time_s(nbytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    """alpha + beta * bytes: one all-reduce of ``nbytes`` per rank, with alpha and beta fitted to this collective."""
    if not (nbytes >= 0 and alpha_s >= 0 and beta_s_per_byte >= 0):
        raise ValueError(f"nbytes, alpha and beta must be >= 0, got {nbytes!r}, {alpha_s!r}, {beta_s_per_byte!r}")
    return alpha_s + beta_s_per_byte * nbytes


@dataclass(frozen=True)
class BucketSchedule:
    """Predicted start and end of each bucket's all-reduce (seconds from backward's start), and what sticks out."""

    starts_s: tuple[float, ...]
    ends_s: tuple[float, ...]
    backward_s: float

    @property
    def comm_s(self) -> float:
        """Total all-reduce time, as if nothing overlapped (the rival 'no overlap' says this is all exposed)."""
        return sum(e - s for s, e in zip(self.starts_s, self.ends_s))

    @property
    def exposed_s(self) -> float:
        """How long the last all-reduce runs past the end of backward."""
        return max(0.0, max(self.ends_s, default=0.0) - self.backward_s)


def bucket_ready_s(bucket_layers: Sequence[Sequence[str]], layer_end_s: Mapping[str, float]) -> list[float]:
    """When each bucket is ready: the latest backward end among the layers its parameters belong to."""
    missing = sorted({n for layers in bucket_layers for n in layers} - set(layer_end_s))
    if missing:
        raise ValueError(f"no backward end for layers {missing}")
    return [max(layer_end_s[n] for n in layers) for layers in bucket_layers]


def schedule_buckets(ready_s: Sequence[float], bucket_bytes: Sequence[float], backward_s: float,
                     alpha_s: float, beta_s_per_byte: float) -> BucketSchedule:
    """One all-reduce at a time, each launched when its bucket is ready and the previous one has finished."""
    if len(ready_s) != len(bucket_bytes):
        raise ValueError(f"one ready time per bucket: {len(ready_s)} times for {len(bucket_bytes)} buckets")
    if not backward_s >= 0:
        raise ValueError(f"backward_s must be >= 0, got {backward_s!r}")
    starts, ends, free_at = [], [], 0.0
    for ready, nbytes in zip(ready_s, bucket_bytes):
        start = max(ready, free_at)
        free_at = start + allreduce_time_s(nbytes, alpha_s, beta_s_per_byte)
        starts.append(start)
        ends.append(free_at)
    return BucketSchedule(tuple(starts), tuple(ends), backward_s)


def overlappable_s(ready_s: Sequence[float], backward_s: float) -> float:
    """T_overlappable: the backward time left once the first bucket is ready."""
    return max(0.0, backward_s - min(ready_s, default=backward_s))


def best_cap(exposed_by_cap: Mapping[float, float]) -> float:
    """The bucket cap with the least exposed time (the smallest cap among ties)."""
    if not exposed_by_cap:
        raise ValueError("best_cap needs at least one bucket cap")
    return min(exposed_by_cap, key=lambda cap: (exposed_by_cap[cap], cap))


def describe_cap(cap_bytes: float) -> str:
    """'one per parameter', '256 KiB', '4 MiB', 'one bucket'."""
    if cap_bytes == 0:
        return "one per parameter"
    if math.isinf(cap_bytes):
        return "one bucket"
    if cap_bytes >= 1 << 20:
        return f"{cap_bytes / (1 << 20):g} MiB"
    return f"{cap_bytes / 1024:g} KiB"
