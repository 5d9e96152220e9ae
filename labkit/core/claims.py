"""Verdicts for the claims that are not timings: a measured figure inside a band, two estimates within k standard
errors. Each names its rival (:class:`labkit.core.verdict.Rival`) and fails when its band also admits the rival.

A band says where it comes from (``source``: a measured spread, a float32 rounding, a paper's table), so a reader can
judge it, and nobody widens it after a failure without the rival still falling outside (issue 51). A statistical
agreement is only as strong as its standard errors: when they are too wide to reject the rival, the verdict is
INCONCLUSIVE for a statistical reason and says how many samples would settle it. Torch-free.
"""
from __future__ import annotations

import math

from labkit.core.verdict import CHECKED, FAILED, INCONCLUSIVE, STATISTICS, Rival, Verdict, rival_check, ruled_out


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def judge_band(claim: str, measured: float, low: float, high: float, *, rival: Rival, source: str,
               unit: str = "") -> Verdict:
    """Is ``measured`` inside [low, high]? The band must leave ``rival`` outside; ``source``: where it comes from,
    in a few words ('float32 rounding of 4 sums', 'the rounds' measured spread')."""
    measured, low, high = _finite("measured", measured), _finite("low", low), _finite("high", high)
    if low > high or not source.strip():
        raise ValueError(f"judge_band needs low <= high and the band's source, got {low!r}, {high!r}, {source!r}")
    band = f"{low:.3g}-{high:.3g}{unit}"
    cannot_tell = rival_check(claim, rival, low <= rival.value <= high, band, unit)
    if cannot_tell:
        return cannot_tell
    detail = f"measured {measured:.3g}{unit}, band {band} ({source})"
    if low <= measured <= high:
        return Verdict(claim, CHECKED, f"{detail}; {ruled_out(rival, unit)}", rival=rival.name)
    return Verdict(claim, FAILED, f"{detail}: outside it", rival=rival.name)


def samples_to_reject(samples: int, se: float, k: float, distance: float) -> int:
    """Samples that shrink a standard error ``se`` (from ``samples``, falling as 1/sqrt(n)) until k standard errors
    fit strictly inside ``distance``."""
    if distance <= 0:
        return 0
    return math.floor(samples * (k * se / distance) ** 2) + 1


def judge_within_errors(claim: str, first: float, second: float, se: float, *, rival: Rival, samples: int,
                        k: float = 3.0, unit: str = "") -> Verdict:
    """Do two estimates agree within ``k`` standard errors of their difference (``se``)? Only if k standard errors
    are also small enough to reject ``rival`` (its value for ``second``, e.g. 'a factor of 2' = 2 x first);
    otherwise INCONCLUSIVE (statistics), with the samples it would take."""
    first, second, se = _finite("first", first), _finite("second", second), _finite("se", se)
    if se < 0 or k <= 0 or isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"judge_within_errors needs se >= 0, k > 0 and samples >= 1, got {se!r}, {k!r}, {samples!r}")
    allowed, distance = k * se, abs(rival.value - first)
    detail = f"{first:.3g}{unit} and {second:.3g}{unit}, {k:g} standard errors = {allowed:.3g}{unit}"
    if distance <= allowed:
        need = samples_to_reject(samples, se, k, distance)
        return Verdict(claim, INCONCLUSIVE, f"{detail}: too wide to reject the rival {rival.name} "
                                            f"({rival.value:.3g}{unit}); about {need} samples would settle it "
                                            f"(this run had {samples})", kind=STATISTICS, rival=rival.name)
    if abs(first - second) <= allowed:
        return Verdict(claim, CHECKED, f"{detail}; {ruled_out(rival, unit)}", rival=rival.name)
    return Verdict(claim, FAILED, f"{detail}: {abs(first - second) / se:.1f} standard errors apart",
                   rival=rival.name)
