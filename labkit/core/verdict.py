"""Three verdicts for a timing claim: checked, failed, or INCONCLUSIVE with the measured reason and its kind.

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

A claim names its **rival** (:class:`Rival`, issue 51): the plausible wrong answer, predicted on the same run. A
band that also admits the rival fails, busy or quiet, when the same band around the prediction admits it: the check
could not tell the lesson from its wrong answer by design. One that admits it only because a busy run's load moved
the measurement toward it (by no more than that load explains) is INCONCLUSIVE: a quiet run decides.
Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from labkit.core.clock import percentile
from labkit.core.contention import ShareMeter, describe_shares
from labkit.core.gpu_neighbours import describe_neighbours

CHECKED, FAILED, INCONCLUSIVE = "checked", "failed", "INCONCLUSIVE"
NOT_CHECKED = "NOT CHECKED"     # a precondition did not occur on this run (e.g. no clear winner to check)
BUSY_SHARE = 0.85        # below this share of a core, some process of the run was measurably starved
MIN_MEASURED_SHARE = 1e-3   # a measured share below this is a rank that only waited: kept positive for the verdict
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

    @classmethod
    def measured(cls, shares: Mapping[str, float], spread: float = 0.0) -> "Load":
        """The load from shares other processes measured (a rank's CPU time over its wall time), each kept in
        [0.001, 1]: a ratio of two clocks can round past 1, or read 0 for a rank that only waited."""
        return cls({name: min(1.0, max(float(share), MIN_MEASURED_SHARE)) for name, share in shares.items()},
                   spread=spread)

    @classmethod
    def of_ranks(cls, results: Sequence[Mapping[str, Any]], spread: float = 0.0) -> "Load":
        """The load of a multi-process run whose ranks each reported ``rank`` and ``cpu_share``."""
        return cls.measured({f"rank {r['rank']}": r["cpu_share"] for r in results}, spread=spread)

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
    def kind(self) -> str:
        """Why a busy run is INCONCLUSIVE: LOAD where a process was starved or shared the GPU, else SPREAD (the
        rounds disagreed)."""
        return LOAD if self.worst_share < BUSY_SHARE or self.gpu_neighbours else SPREAD

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


# Why a claim is INCONCLUSIVE, by kind (issue 51): the machine's load, the rounds' or seeds' spread, or statistics
# too weak to reject the rival. A precondition that did not occur on this run is NOT CHECKED, not one of these.
LOAD, SPREAD, STATISTICS = "load", "spread", "statistics"
INCONCLUSIVE_KINDS = (LOAD, SPREAD, STATISTICS)


@dataclass(frozen=True)
class Rival:
    """The plausible wrong answer a claim rules out, and what it predicts on this run's numbers: '(p-1)/m' for the
    bubble (p-1)/(m+p-1), 'no overlap' for an overlap claim, 'W' for 2W-1. Not a value nobody would believe."""

    name: str
    value: float

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.strip()):
            raise ValueError("a rival needs a name: the wrong answer it stands for, e.g. '(p-1)/m'")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ValueError(f"rival {self.name!r} needs a finite number it predicts, got {self.value!r}")


@dataclass(frozen=True)
class Verdict:
    """One claim's outcome: state (checked / failed / INCONCLUSIVE / NOT CHECKED), the line that says why, for
    INCONCLUSIVE its kind (:data:`INCONCLUSIVE_KINDS`), and the rival it ruled out ('' when none was named)."""

    claim: str
    state: str
    detail: str
    kind: str = ""
    rival: str = ""

    def __post_init__(self) -> None:
        if self.kind and self.kind not in INCONCLUSIVE_KINDS:
            raise ValueError(f"an INCONCLUSIVE kind is one of {INCONCLUSIVE_KINDS}, got {self.kind!r}")

    @property
    def holds(self) -> bool:
        return self.state == CHECKED


def rival_check(claim: str, rival: Rival | None, admits: bool, band: str, unit: str = "") -> Verdict | None:
    """The failed verdict when the claim's band also ``admits`` its rival ('cannot tell X from RIVAL on this run'),
    busy or quiet; None when the band rejects it (or no rival was named)."""
    if rival is None or not admits:
        return None
    return Verdict(claim, FAILED, f"cannot tell the claim from its rival {rival.name} on this run: {rival.name} "
                                  f"predicts {rival.value:.3g}{unit}, inside the band {band}", rival=rival.name)


def ruled_out(rival: Rival | None, unit: str = "") -> str:
    """The line a passing claim prints about its rival: 'rules out (p-1)/m = 0.375'."""
    return "" if rival is None else f"rules out {rival.name} = {rival.value:.3g}{unit}"


def median_bounds(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free two-sided interval for the median of the rounds' population: the k-th smallest and k-th
    largest round, with the largest k whose binomial tail stays within (1 - confidence) / 2. It assumes nothing about
    how load shapes one round's time, only that rounds are independent; fewer than 6 rounds give (min, max)."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        raise ValueError("median_bounds needs at least one finite value")
    n, tail, k = len(xs), (1.0 - confidence) / 2, 0
    while k + 1 < n and sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n <= tail:
        k += 1
    return xs[max(k - 1, 0)], xs[n - max(k, 1)]


def _unsettled(gap_by_round: Sequence[float], allowed: float) -> str:
    """Why the paired rounds cannot settle a miss ('' when they can): the median's 95% interval of the per-round gap
    reaches back inside the band."""
    if not gap_by_round:
        return ""
    low, _ = median_bounds(gap_by_round)
    if low > allowed:
        return ""
    return (f"the {len(gap_by_round)} paired rounds do not settle it (their median's 95% interval reaches "
            f"{low / allowed:.2f}x of the bound, inside it): {ADVICE}")


def _decide(claim: str, gap: float, allowed: float, load: Load, detail: str,
            gap_by_round: Sequence[float] = (), rival: Rival | None = None, unit: str = "") -> Verdict:
    """gap, allowed: factors >= 1 (how far off the claim is, how far it may be); load decides the rest. With the
    gap of each paired round, a miss whose rounds straddle the band is INCONCLUSIVE, whatever the CPU shares said."""
    name = "" if rival is None else rival.name
    if gap <= allowed:
        line = ruled_out(rival, unit)
        return Verdict(claim, CHECKED, f"{detail}; {line}" if line else detail, rival=name)
    unsettled = _unsettled(gap_by_round, allowed)
    if unsettled:
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {unsettled}", kind=SPREAD, rival=name)
    if load.busy and gap <= allowed * load.explainable_factor:
        return Verdict(claim, INCONCLUSIVE, f"{detail}; {load.reason()}", kind=load.kind, rival=name)
    why = "larger than this run's load can explain" if load.busy else "on a quiet machine"
    return Verdict(claim, FAILED, f"{detail}; off by {gap / allowed:.2f}x beyond the band, {why}"
                                  f" (worst CPU share {load.worst_share:.2f}, rounds spread {load.spread:.0%})",
                   rival=name)


def _round_ratios(name: str, by_round: Sequence[tuple[float, float]]) -> list[float]:
    """first/second of each paired round's two numbers, each checked positive."""
    bad = [pair for pair in by_round if not (len(pair) == 2 and pair[0] > 0 and pair[1] > 0)]
    if bad:
        raise ValueError(f"{name}'s by_round needs pairs of two positive numbers, got {bad[:3]}")
    return [first / second for first, second in by_round]


def judge_agreement(claim: str, predicted: float, measured: float, *, tolerance: float,
                    load: Load = QUIET, unit: str = "x", by_round: Sequence[tuple[float, float]] = (),
                    rival: Rival | None = None) -> Verdict:
    """Does ``measured`` agree with ``predicted`` within a factor of ``1 + tolerance`` (either way)? ``by_round``:
    each paired round's (predicted, measured), read on the side the median missed (see :func:`median_bounds`).
    ``rival``: the wrong model's prediction on this run; a band that also holds it fails ('cannot tell'), busy or
    quiet, where the same band around the prediction holds it too (the check cannot separate them by design). Where
    only the measurement moved toward the rival, on a busy run whose load explains that distance, it is
    INCONCLUSIVE by the load's kind."""
    if not (predicted > 0 and measured > 0 and tolerance >= 0):
        raise ValueError(f"judge_agreement needs predicted > 0, measured > 0, tolerance >= 0; "
                         f"got {predicted!r}, {measured!r}, {tolerance!r}")
    low, high = measured / (1.0 + tolerance), measured * (1.0 + tolerance)
    cannot_tell = rival_check(claim, rival, rival is not None and low <= rival.value <= high,
                              f"{low:.3g}-{high:.3g}{unit} around the measured {measured:.3g}{unit}", unit)
    gap = max(measured / predicted, predicted / measured)
    by_design = rival is not None and predicted / (1.0 + tolerance) <= rival.value <= predicted * (1.0 + tolerance)
    if cannot_tell and not by_design and load.busy and gap <= (1.0 + tolerance) * load.explainable_factor:
        # a perfect measurement would reject the rival: this busy run's load moved it there (a quiet run decides)
        return Verdict(claim, INCONCLUSIVE, f"{cannot_tell.detail}; {load.reason()}", kind=load.kind,
                       rival=cannot_tell.rival)
    if cannot_tell:
        return cannot_tell
    detail = f"predicted {predicted:.3g}{unit}, measured {measured:.3g}{unit} (band ±{tolerance:.0%})"
    ratios = [1.0 / r for r in _round_ratios("judge_agreement", by_round)]          # measured / predicted
    gaps = [r if measured >= predicted else 1.0 / r for r in ratios]                # > 1: off on the median's side
    return _decide(claim, gap, 1.0 + tolerance, load, detail, gaps, rival, unit)


def judge_at_least(claim: str, measured: float, threshold: float, *, load: Load = QUIET,
                   unit: str = "x", by_round: Sequence[tuple[float, float]] = (),
                   rival: Rival | None = None) -> Verdict:
    """Is ``measured`` at least ``threshold`` (e.g. a speed-up the lesson promises)? ``by_round``: each paired
    round's (measured, threshold), when both sides were measured round by round (see :func:`median_bounds`).
    ``rival`` (e.g. 'no speed-up' = 1.0) must fall below the threshold, or the claim cannot tell them apart."""
    if not (measured > 0 and threshold > 0):
        raise ValueError(f"judge_at_least needs measured > 0 and threshold > 0, got {measured!r}, {threshold!r}")
    cannot_tell = rival_check(claim, rival, rival is not None and rival.value >= threshold,
                              f">= {threshold:.3g}{unit}", unit)
    if cannot_tell:
        return cannot_tell
    detail = f"measured {measured:.3g}{unit}, needs >= {threshold:.3g}{unit}"
    gaps = [1.0 / ratio for ratio in _round_ratios("judge_at_least", by_round)]
    return _decide(claim, max(1.0, threshold / measured), 1.0, load, detail, gaps, rival, unit)


def judge_at_most(claim: str, measured: float, threshold: float, *, load: Load = QUIET,
                  unit: str = "x", by_round: Sequence[tuple[float, float]] = (),
                  rival: Rival | None = None) -> Verdict:
    """Is ``measured`` at most ``threshold`` (e.g. an overhead the lesson bounds)? ``by_round``: each paired round's
    (measured, threshold), when both sides were measured round by round (see :func:`median_bounds`). ``rival``
    must lie above the threshold, or the claim cannot tell them apart."""
    if not (measured > 0 and threshold > 0):
        raise ValueError(f"judge_at_most needs measured > 0 and threshold > 0, got {measured!r}, {threshold!r}")
    cannot_tell = rival_check(claim, rival, rival is not None and rival.value <= threshold,
                              f"<= {threshold:.3g}{unit}", unit)
    if cannot_tell:
        return cannot_tell
    detail = f"measured {measured:.3g}{unit}, needs <= {threshold:.3g}{unit}"
    gaps = _round_ratios("judge_at_most", by_round)
    return _decide(claim, max(1.0, measured / threshold), 1.0, load, detail, gaps, rival, unit)
