"""Three verdicts for a timing claim: checked, failed, or INCONCLUSIVE with the measured reason.

A timing claim compares a number from the clock with what a model predicts (agreement within a band) or with a
threshold the lesson states ("at least 1.3x faster"). On a shared machine, a process that got half a core runs
up to twice as slow, and rounds that disagree by 40% cannot settle a 10% effect. So the verdict reads how busy
the run was (:class:`Load`: the worst CPU share any of its processes got, from :mod:`labkit.core.contention`,
and the spread of its paired rounds) and decides:

* **checked** when the claim holds on the numbers, however busy the machine;
* **INCONCLUSIVE** only when the machine was measurably busy *and* that load is large enough to explain the
  gap between claim and measurement: the reason says how much CPU each process got (and which other processes
  computed on the GPU meanwhile: another process's kernels time-slice with ours) and what to do;
* **failed** otherwise: on a quiet machine always, and under load whenever the gap is larger than the load
  can explain. A wrong model is never hidden behind a busy machine.
Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from labkit.core.clock import percentile
from labkit.core.contention import ShareMeter, describe_shares
from labkit.core.gpu_neighbours import describe_neighbours

CHECKED, FAILED, INCONCLUSIVE = "checked", "failed", "INCONCLUSIVE"
BUSY_SHARE = 0.85        # below this share of a core, some process of the run was measurably starved
BUSY_SPREAD = 0.25       # paired rounds that disagree by more than this (p90-p10 over median) are noisy
ADVICE = "close other programs and rerun this cell"


def relative_spread(values: Sequence[float]) -> float:
    """(p90 - p10) / median of one run's per-round results (0.0 for fewer than two rounds)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if len(xs) < 2:
        return 0.0
    mid = percentile(xs, 50)
    return 0.0 if mid <= 0 else (percentile(xs, 90) - percentile(xs, 10)) / mid


@dataclass(frozen=True)
class Load:
    """How busy one timed run was: each process's share of a core (name -> 0..1), its rounds' spread, and the
    other processes that computed on the GPU meanwhile (label -> the share of the SMs each kept busy)."""

    shares: Mapping[str, float] = field(default_factory=dict)
    spread: float = 0.0
    gpu_neighbours: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_meters(cls, meters: Mapping[str, ShareMeter], spread: float = 0.0) -> "Load":
        """The load of a run timed inside ``ShareMeter`` blocks: their CPU shares and every GPU neighbour they saw."""
        neighbours: dict[str, float] = {}
        for meter in meters.values():
            for name, share in meter.gpu_neighbours.items():
                neighbours[name] = max(share, neighbours.get(name, 0.0))
        return cls({name: meter.share for name, meter in meters.items()}, spread=spread, gpu_neighbours=neighbours)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.shares.items() if not (isinstance(v, (int, float)) and 0 < v <= 1.0 + 1e-9)}
        if bad:
            raise ValueError(f"CPU shares must be numbers in (0, 1], got {bad}")
        if not (isinstance(self.spread, (int, float)) and self.spread >= 0):
            raise ValueError(f"spread must be a number >= 0, got {self.spread!r}")

    @property
    def worst_share(self) -> float:
        """The smallest share of a core any process of the run got (1.0 when none was measured)."""
        return min(self.shares.values(), default=1.0)

    @property
    def busy(self) -> bool:
        """True when the run measurably lacked CPU, shared the GPU, or its rounds disagreed too much to compare."""
        return self.worst_share < BUSY_SHARE or self.spread > BUSY_SPREAD or bool(self.gpu_neighbours)

    @property
    def explainable_factor(self) -> float:
        """The largest slow-down (or speed-up) this load can explain: 1/worst share, times the rounds' spread, times
        one more time slice on the GPU per neighbour that kept its SMs busy (time-slicing gives each its turn)."""
        return (1.0 / self.worst_share) * (1.0 + self.spread) * (1.0 + sum(self.gpu_neighbours.values()))

    def reason(self) -> str:
        """The measured reason, e.g. 'rank 0 got 0.46 of a core; rounds spread 12%: close other programs ...'."""
        parts = []
        starved = {k: v for k, v in self.shares.items() if v < BUSY_SHARE}
        if starved:
            parts.append(describe_shares(starved))
        if self.gpu_neighbours:
            parts.append(f"another process computed on the GPU: {describe_neighbours(dict(self.gpu_neighbours))}")
        if self.spread > BUSY_SPREAD or not (starved or self.gpu_neighbours):
            parts.append(f"rounds spread {self.spread:.0%}")
        return "; ".join(parts) + f": {ADVICE}"


QUIET = Load()


@dataclass(frozen=True)
class Verdict:
    """One timing claim's outcome: state (checked / failed / INCONCLUSIVE) and the line that says why."""

    claim: str
    state: str
    detail: str

    @property
    def holds(self) -> bool:
        return self.state == CHECKED


def _decide(claim: str, gap: float, allowed: float, load: Load, detail: str) -> Verdict:
    """gap, allowed: factors >= 1 (how far off the claim is, how far it may be); load decides the rest."""
    if gap <= allowed:
        return Verdict(claim, CHECKED, detail)
    if load.busy and gap <= allowed * load.explainable_factor:
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {load.reason()}")
    why = "larger than this run's load can explain" if load.busy else "on a quiet machine"
    return Verdict(claim, FAILED, f"{detail}; off by {gap / allowed:.2f}x beyond the band, {why}"
                                  f" (worst CPU share {load.worst_share:.2f}, rounds spread {load.spread:.0%})")


def judge_agreement(claim: str, predicted: float, measured: float, *, tolerance: float,
                    load: Load = QUIET, unit: str = "x") -> Verdict:
    """Does ``measured`` agree with ``predicted`` within a factor of ``1 + tolerance`` (either way)?"""
    if not (predicted > 0 and measured > 0 and tolerance >= 0):
        raise ValueError(f"judge_agreement needs predicted > 0, measured > 0, tolerance >= 0; "
                         f"got {predicted!r}, {measured!r}, {tolerance!r}")
    gap = max(measured / predicted, predicted / measured)
    detail = f"predicted {predicted:.3g}{unit}, measured {measured:.3g}{unit} (band ±{tolerance:.0%})"
    return _decide(claim, gap, 1.0 + tolerance, load, detail)


def judge_at_least(claim: str, measured: float, threshold: float, *, load: Load = QUIET,
                   unit: str = "x") -> Verdict:
    """Is ``measured`` at least ``threshold`` (e.g. a speed-up the lesson promises)?"""
    if not (measured > 0 and threshold > 0):
        raise ValueError(f"judge_at_least needs measured > 0 and threshold > 0, got {measured!r}, {threshold!r}")
    detail = f"measured {measured:.3g}{unit}, needs >= {threshold:.3g}{unit}"
    return _decide(claim, max(1.0, threshold / measured), 1.0, load, detail)


def judge_at_most(claim: str, measured: float, threshold: float, *, load: Load = QUIET,
                  unit: str = "x") -> Verdict:
    """Is ``measured`` at most ``threshold`` (e.g. an overhead the lesson bounds)?"""
    if not (measured > 0 and threshold > 0):
        raise ValueError(f"judge_at_most needs measured > 0 and threshold > 0, got {measured!r}, {threshold!r}")
    detail = f"measured {measured:.3g}{unit}, needs <= {threshold:.3g}{unit}"
    return _decide(claim, max(1.0, measured / threshold), 1.0, load, detail)
