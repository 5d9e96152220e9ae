"""Checked exercises for notebook 02b: the noise scale from two gradient norms, B_crit from measured (S, E) pairs.

The references are the kit's own estimator (:mod:`labkit.training.noise_scale`) and fit
(:mod:`labkit.training.to_target`); each :class:`Mistake` is an answer learners typically write.
"""
from __future__ import annotations

import random

import numpy as np

from labkit.core.exercises import Exercise, Mistake
from labkit.training.noise_scale import two_norm_estimate
from labkit.training.to_target import critical_batch, fit_critical_batch


# ------------------------------------------------------------------------------------ B_simple from two norms
def b_simple_reference(small_sq_norm: float, big_sq_norm: float, b_small: int, b_big: int) -> float:
    """tr(Sigma) / |G|^2 from the unbiased two-batch estimates (McCandlish et al. 2018, appendix A.1)."""
    grad_sq, trace_sigma = two_norm_estimate(small_sq_norm, big_sq_norm, b_small, b_big)
    return trace_sigma / grad_sq


def _norm_cases(seed: int = 40) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(8):
        grad_sq, trace, b_small = rng.uniform(0.05, 2.0), rng.uniform(1.0, 200.0), rng.choice([4, 8, 16, 32])
        b_big = b_small * rng.choice([2, 4, 8, 16])
        noise = [rng.uniform(0.97, 1.03) for _ in range(2)]
        cases.append({"small_sq_norm": (grad_sq + trace / b_small) * noise[0],
                      "big_sq_norm": (grad_sq + trace / b_big) * noise[1], "b_small": b_small, "b_big": b_big})
    return cases


NOISE_SCALE = Exercise(
    "noise_scale_from_norms", "B_simple = tr(Sigma)/|G|^2 from the squared gradient norms at two batch sizes",
    b_simple_reference, _norm_cases,
    (Mistake("big_batch_is_true_gradient", lambda small_sq_norm, big_sq_norm, b_small, b_big:
             (small_sq_norm - big_sq_norm) / (1 / b_small - 1 / b_big) / big_sq_norm,
             "the big batch's |G_big|^2 still holds noise, tr(Sigma)/b_big: remove it, "
             "|G|^2 = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)"),
     Mistake("no_batch_scaling", lambda small_sq_norm, big_sq_norm, b_small, b_big:
             (small_sq_norm - big_sq_norm) / ((b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)),
             "the noise in a batch-B gradient is tr(Sigma)/B, so the difference of the two norms is "
             "tr(Sigma) (1/b_small - 1/b_big): divide by that bracket"),
     Mistake("inverted", lambda small_sq_norm, big_sq_norm, b_small, b_big:
             1.0 / b_simple_reference(small_sq_norm, big_sq_norm, b_small, b_big),
             "B_simple is noise over signal, tr(Sigma) / |G|^2, a batch size in samples")),
    "E|G_B|^2 = |G|^2 + tr(Sigma)/B: two batch sizes give two equations in |G|^2 and tr(Sigma); solve, then divide")


# ------------------------------------------------------------------------------------ B_crit from (S, E) pairs
def b_crit_reference(steps: list[float], examples: list[float]) -> float:
    """E_min / S_min from the least-squares line S = S_min + E_min / B, with B = E / S (McCandlish et al., 2.11)."""
    return critical_batch(*fit_critical_batch(steps, examples))


def _pair_cases(seed: int = 41) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(6):
        s_min, b_crit = rng.uniform(10, 200), rng.choice([16.0, 40.0, 100.0, 300.0])
        batches = [2 ** k for k in range(rng.randint(2, 4), rng.randint(8, 10))]
        steps = [s_min * (1 + b_crit / b) * rng.uniform(0.95, 1.05) for b in batches]
        cases.append({"steps": steps, "examples": [b * s for b, s in zip(batches, steps)]})
    return cases


def _linear_in_b(steps: list[float], examples: list[float]) -> float:
    b = np.asarray(examples) / np.asarray(steps)
    slope, intercept = np.polyfit(b, steps, 1)
    return float(-intercept / slope) if slope else float("inf")


CRITICAL_BATCH = Exercise(
    "critical_batch_from_pairs", "B_crit = E_min / S_min fitted to measured (steps, examples) pairs",
    b_crit_reference, _pair_cases,
    (Mistake("inverted", lambda steps, examples: 1.0 / b_crit_reference(steps, examples),
             "B_crit is examples per step: E_min / S_min, not S_min / E_min"),
     Mistake("smallest_of_each", lambda steps, examples: min(examples) / min(steps),
             "the smallest measured S and E are not S_min and E_min (those are the limits of infinite and of tiny "
             "batches): fit the line S = S_min + E_min / B"),
     Mistake("linear_in_b", _linear_in_b, "S falls as 1/B, not linearly in B: regress S on 1/B (B = E / S)")),
    "B = E / S for each pair; least squares of S against 1/B gives intercept S_min and slope E_min")
