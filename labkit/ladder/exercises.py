"""Checked exercises for notebook 10: what one rung can win (Amdahl's law) and the MFU of a rung.

References: Amdahl (1967) for the speed-up of a part, and the kit's MFU (``training.flops.mfu``, Chowdhery et
al. 2022, appendix B) on achieved FLOP/s = training FLOPs per sample x samples/s.
"""
from __future__ import annotations

import random

from labkit.core.exercises import Exercise, Mistake
from labkit.training.flops import mfu


def amdahl_reference(fraction: float, part_speedup: float) -> float:
    """Whole-step speed-up when ``fraction`` of the step gets ``part_speedup`` times faster (Amdahl 1967)."""
    return 1.0 / ((1.0 - fraction) + fraction / part_speedup)


def _amdahl_cases(seed: int = 20) -> list[dict]:
    rng = random.Random(seed)
    return [{"fraction": round(rng.uniform(0.05, 0.95), 3), "part_speedup": rng.choice([1.5, 2.0, 4.0, 8.0, 100.0])}
            for _ in range(10)]


AMDAHL = Exercise(
    "amdahl", "the step's speed-up when a rung makes a fraction f of the step s times faster",
    amdahl_reference, _amdahl_cases,
    (Mistake("scaled_speedup", lambda fraction, part_speedup: fraction * part_speedup,
             "the untouched part (1 - f) still takes as long: new time = (1 - f) + f / s, speed-up = 1 / new time"),
     Mistake("saved_share", lambda fraction, part_speedup: 1.0 + fraction * (part_speedup - 1.0),
             "that treats the time saved as work gained; compare times instead: old time 1, new (1 - f) + f / s")),
    "new step time = (1 - f) + f / s, with the old one 1")


def rung_mfu_reference(flops_per_sample: float, samples_per_s: float, peak_flops_per_s: float) -> float:
    """MFU of a rung: achieved model FLOP/s over the device's peak (``training.flops.mfu``)."""
    return mfu(flops_per_sample * samples_per_s, peak_flops_per_s)


def _mfu_cases(seed: int = 21) -> list[dict]:
    rng = random.Random(seed)
    return [{"flops_per_sample": rng.uniform(1e8, 1e10), "samples_per_s": rng.uniform(50, 20_000),
             "peak_flops_per_s": rng.choice([1e12, 67e12, 989e12])} for _ in range(8)]


RUNG_MFU = Exercise(
    "rung_mfu", "MFU of a rung from its training FLOPs per sample, its samples/s and the device's peak FLOP/s",
    rung_mfu_reference, _mfu_cases,
    (Mistake("triple_counted", lambda flops_per_sample, samples_per_s, peak_flops_per_s:
             3 * flops_per_sample * samples_per_s / peak_flops_per_s,
             "flops_per_sample already counts the whole training step (forward + backward ~ 3x forward): "
             "do not multiply by 3 again"),
     Mistake("percent", lambda flops_per_sample, samples_per_s, peak_flops_per_s:
             100 * flops_per_sample * samples_per_s / peak_flops_per_s, "return a fraction in [0, 1], not percent")),
    "MFU = flops_per_sample x samples_per_s / peak_flops_per_s")
