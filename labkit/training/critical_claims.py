"""The critical-batch lessons as verdicts (checked, failed, or INCONCLUSIVE with the measured reason), decided on
live numbers with their uncertainty: a claim the runs cannot settle is never passed.

Where the paper's predictions come from: McCandlish et al. 2018 (arXiv 1812.06162), S(B) = S_min (1 + B_crit / B)
(section 2.3, eq. 2.11), so a doubling from B to 2B leaves (1 + x/2) / (1 + x) of the steps, x = B_crit / B:
at most 0.6 when 2B <= B_crit / 2 and at least 0.83 when B >= 2 B_crit. B_simple is their cheap estimate of the
noise scale that sets B_crit; they present the match as approximate. The spread of their figure 4 is across tasks
whose B_crit spans six orders of magnitude, not the error of one task, so it sets no band here: the kit asks for
agreement within ``AGREEMENT_FACTOR`` = 2, with each estimate's own measured error carried to the edge, so the
rival "a factor of 2 apart" is rejected whenever the claim is checked (issue 51).
"""
from __future__ import annotations

import math
from typing import Mapping

from labkit.core.claims import judge_within_errors
from labkit.core.verdict import (CHECKED, FAILED, INCONCLUSIVE, NOT_CHECKED, SPREAD, STATISTICS, Load, Rival, Verdict,
                                 judge_at_least)
from labkit.training.noise_scale import NoiseScale
from labkit.training.to_target import CriticalBatchFit

AGREEMENT_FACTOR = 2.0       # B_crit and B_simple "agree" within this factor, errors included: rejects "2x apart"
HALVES = 0.7                 # well below B_crit a doubling leaves at most this share of the steps (model: <= 0.6)
LITTLE = 0.75                # well above B_crit a doubling leaves at least this share (model: >= 0.83)


def noise_scale_agrees(fit: CriticalBatchFit, noise: NoiseScale, factor: float = AGREEMENT_FACTOR) -> Verdict:
    """B_crit (its 68% interval) and B_simple (± 1 standard error) within ``factor`` of each other, as far apart as
    those errors allow? Then the rival 'a factor of ``factor`` apart' is rejected; errors that straddle the line are
    INCONCLUSIVE (statistics)."""
    claim = f"the fitted B_crit and the measured B_simple agree within a factor of {factor:g}"
    rival = f"a factor of {factor:g} apart"
    lo_b, hi_b = max(noise.b_simple - noise.stderr, 1e-9), noise.b_simple + noise.stderr
    detail = (f"B_crit {fit.b_crit:.0f} (68% interval {fit.b_crit_low:.0f}-{fit.b_crit_high:.0f}), "
              f"B_simple {noise.b_simple:.0f} ± {noise.stderr:.0f}")
    if noise.b_simple <= 0 or not math.isfinite(fit.b_crit):
        return Verdict(claim, INCONCLUSIVE, f"{detail}: no finite positive estimate to compare", kind=STATISTICS,
                       rival=rival)
    worst = max(fit.b_crit_high / lo_b, hi_b / max(fit.b_crit_low, 1e-9))      # farthest apart the errors allow
    best = max(fit.b_crit_low / hi_b, lo_b / fit.b_crit_high, 1.0)              # closest they can be
    if worst <= factor:
        return Verdict(claim, CHECKED, f"{detail}: at most {worst:.1f}x apart; rules out {rival}", rival=rival)
    if best > factor:
        return Verdict(claim, FAILED, f"{detail}: at least {best:.1f}x apart", rival=rival)
    return Verdict(claim, INCONCLUSIVE, f"{detail}: the uncertainties allow {best:.1f}x to {worst:.1f}x apart, "
                                        f"across the {factor:g}x line, so {rival} cannot be rejected; more seeds or "
                                        "pairs would settle it", kind=STATISTICS, rival=rival)


def doubling_ratios(mean_steps: Mapping[int, float]) -> dict[int, float]:
    """S(2B) / S(B) for every batch B whose double was also measured."""
    return {b: mean_steps[2 * b] / mean_steps[b] for b in sorted(mean_steps) if 2 * b in mean_steps}


def per_doubling(fit: CriticalBatchFit, low: int, high: int) -> tuple[float, float]:
    """(S(high)/S(low))^(1/doublings): the share of steps one doubling leaves over [low, high], and the relative
    standard error of that figure from the seeds' spread at both ends."""
    doublings = math.log2(high / low)
    ratio = (fit.mean_steps[high] / fit.mean_steps[low]) ** (1 / doublings)
    rel = [fit.steps_stderr.get(b, 0.0) / fit.mean_steps[b] for b in (low, high)]
    return ratio, math.hypot(*rel) / doublings


def doubling_verdicts(fit: CriticalBatchFit, sigmas: float = 2.0) -> tuple[Verdict, Verdict]:
    """Below B_crit (batches up to the interval's low end / 2) a doubling nearly halves the steps; above it (from
    2x the interval's high end) it buys little. Judged on the share per doubling across each range, with its error
    (``sigmas`` standard errors): INCONCLUSIVE (spread) where the error straddles the line, NOT CHECKED where no two
    batches lie there."""
    bs = sorted(fit.mean_steps)
    below = [b for b in bs if b <= fit.b_crit_low / 2]
    above = [b for b in bs if b >= 2 * fit.b_crit_high]
    return (_range_verdict(f"well below B_crit, doubling the batch nearly halves the steps (<= {HALVES:.2f}x per "
                           "doubling)", fit, below, lambda r: r <= HALVES, sigmas,
                           f"fewer than two measured batches at or below {fit.b_crit_low / 2:.0f}",
                           "the batch does not matter: 1.0x the steps per doubling"),
            _range_verdict(f"well above B_crit, doubling the batch buys little (>= {LITTLE:.2f}x the steps per "
                           "doubling)", fit, above, lambda r: r >= LITTLE, sigmas,
                           f"fewer than two measured batches at or above {2 * fit.b_crit_high:.0f} (B_crit's "
                           f"interval {fit.b_crit_low:.0f}-{fit.b_crit_high:.0f})",
                           "perfect scaling: 0.5x the steps per doubling"))


def _range_verdict(claim: str, fit: CriticalBatchFit, batches: list[int], holds, sigmas: float,
                   none_reason: str, rival: str) -> Verdict:
    """``rival``: the share per doubling the wrong model predicts (1.0 or 0.5), outside the line ``holds`` draws, so a
    checked verdict (its whole interval on the claim's side) rejects it."""
    if len(batches) < 2:
        return Verdict(claim, NOT_CHECKED, none_reason)              # the batches to judge did not occur
    ratio, rel = per_doubling(fit, batches[0], batches[-1])
    lo, hi = ratio * math.exp(-sigmas * rel), ratio * math.exp(sigmas * rel)
    detail = f"batch {batches[0]} to {batches[-1]}: {ratio:.2f}x per doubling ({lo:.2f}-{hi:.2f} at {sigmas:g} s.e.)"
    if holds(lo) and holds(hi):
        return Verdict(claim, CHECKED, f"{detail}; rules out {rival}", rival=rival)
    if not holds(lo) and not holds(hi):
        return Verdict(claim, FAILED, detail, rival=rival)
    return Verdict(claim, INCONCLUSIVE, f"{detail}: the seeds' spread straddles the line; more seeds would settle it",
                   kind=SPREAD, rival=rival)


def noise_grows(early: NoiseScale, late: NoiseScale, sigmas: float = 2.0) -> Verdict:
    """B_simple late in the run above its early value by more than ``sigmas`` combined standard errors? The rival
    'the noise scale stays put' predicts the early value again; INCONCLUSIVE (statistics) says the pairs it would take."""
    claim = "the noise scale grows as the loss falls"
    rival = f"the noise scale stays put (at the early {early.b_simple:.0f})"
    gap, err = late.b_simple - early.b_simple, math.hypot(early.stderr, late.stderr)
    detail = f"early {early.b_simple:.0f} ± {early.stderr:.0f}, late {late.b_simple:.0f} ± {late.stderr:.0f}"
    if gap > sigmas * err:
        return Verdict(claim, CHECKED, f"{detail}: up {gap / err:.1f} standard errors; rules out {rival}", rival=rival)
    if gap < -sigmas * err:
        return Verdict(claim, FAILED, f"{detail}: down {-gap / err:.1f} standard errors", rival=rival)
    more = (f"; about {math.floor((sigmas * err / gap) ** 2) + 1}x the pairs would settle it (standard errors fall as "
            "1/sqrt(pairs))" if gap > 0 else "")
    return Verdict(claim, INCONCLUSIVE, f"{detail}: a change of {gap / err:+.1f} standard errors, within the noise "
                                        f"of {early.pairs} and {late.pairs} pairs, so {rival} cannot be rejected{more}",
                   kind=STATISTICS, rival=rival)


def estimates_agree(a: NoiseScale, b: NoiseScale, sigmas: float = 3.0) -> Verdict:
    """Two estimates of B_simple at the same weights agree within ``sigmas`` combined standard errors, and those
    errors are small enough to reject the rival 'a factor of 2 apart' (else INCONCLUSIVE for statistics, with the
    pairs it would take: 30 pairs at 16-vs-32 give standard errors of 84-337 %, which reject nothing)."""
    claim = f"B_simple from {b.source} matches B_simple from {a.source} at the same weights"
    twice = 2 * a.b_simple if b.b_simple >= a.b_simple else a.b_simple / 2
    return judge_within_errors(claim, a.b_simple, b.b_simple, math.hypot(a.stderr, b.stderr),
                               rival=Rival("a factor of 2 apart", twice), samples=min(a.pairs, b.pairs), k=sigmas)


def throughput_peak_loses(time_s: Mapping[int, float], samples_per_s: Mapping[int, float], fit: CriticalBatchFit,
                          load: Load, margin: float = 1.1) -> Verdict:
    """Above B_crit the steps stop falling, so more samples/s stops buying time: where the highest-throughput batch
    lies above B_crit's interval it takes at least ``margin`` x the time-fastest batch's time to the target."""
    claim = "above B_crit, the highest-throughput batch is not the fastest to the target"
    peak = max((b for b in samples_per_s if b in time_s), key=lambda b: samples_per_s[b])
    if peak <= fit.b_crit_high:
        return Verdict(claim, NOT_CHECKED, f"the throughput peak (batch {peak}) is not above B_crit's interval "
                                            f"({fit.b_crit_low:.0f}-{fit.b_crit_high:.0f}): nothing to show here")
    best = min(time_s, key=time_s.get)
    return judge_at_least(f"{claim} (batch {peak} vs batch {best})", time_s[peak] / time_s[best], margin, load=load,
                          unit="x the fastest batch's time",
                          rival=Rival("the highest-throughput batch is the fastest to the target", 1.0))
