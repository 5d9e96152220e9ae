"""Checked exercises for notebooks 05 and 05b: the pipeline bubble, the micro-batches a bubble target needs, the
activations a stage holds and a stage's 1F1B action order; notebook 05's two-stage forward with send/recv and 05b's
1F1B training loop, judged on live ranks, live in :mod:`labkit.parallel.pipeline.stage_exercise`
(``PIPELINE_FORWARD`` and ``ONE_F_ONE_B_STEP``, re-exported here).

References: the GPipe schedule simulator (:mod:`labkit.parallel.pipeline.gpipe`), and the schedules' action
orders and bubble formula (:mod:`labkit.parallel.pipeline.schedule_sim`, the orders checked against torch's live
``Schedule1F1B`` in notebook 05b).
"""
from __future__ import annotations

import math
import random

from labkit.core.exercises import Exercise, Mistake
from labkit.parallel.pipeline.gpipe import simulate_gpipe
from labkit.parallel.pipeline.schedule_sim import (bubble_of_total, gpipe_order, micro_batches_for_bubble,
                                                   one_f_one_b_order, peak_in_flight)
from labkit.parallel.pipeline.stage_exercise import ONE_F_ONE_B_STEP, PIPELINE_FORWARD  # noqa: F401 - 05, 05b: ex.

# ------------------------------------------------------------------------------------ 05: the bubble
def bubble_reference(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe schedule with equal stages, measured on the kit's schedule simulator
    (equals (p-1)/(m+p-1), Huang et al. 2019)."""
    # Independent of schedule_sim.predicted_bubble on purpose: the learner writes that formula, so the reference
    # measures the simulated schedule itself (a formula checked against a copy of itself would prove nothing).
    return bubble_of_total(simulate_gpipe([1.0] * stages, [2.0] * stages, micro_batches), stages)


def _bubble_cases(seed: int = 10) -> list[dict]:
    rng = random.Random(seed)
    return [{"stages": rng.randint(2, 8), "micro_batches": rng.randint(1, 32)} for _ in range(10)]


BUBBLE = Exercise(
    "bubble_fraction", "the idle share of a GPipe schedule with p equal stages and m micro-batches",
    bubble_reference, _bubble_cases,
    (Mistake("over_m", lambda stages, micro_batches: (stages - 1) / micro_batches,
             "the schedule lasts m + p - 1 slots, not m: divide the p - 1 idle slots by m + p - 1"),
     Mistake("over_m_plus_p", lambda stages, micro_batches: (stages - 1) / (micro_batches + stages),
             "off by one: filling the pipe takes p - 1 extra slots, so the schedule is m + p - 1 slots long")),
    "each stage idles p - 1 of the m + p - 1 slots of the forward (and again of the backward) pass",
    rel_tol=1e-9)


def micro_batches_reference(stages: int, max_bubble: float) -> int:
    """Smallest m whose bubble (p-1)/(m+p-1) is at most ``max_bubble`` (``schedule_sim.micro_batches_for_bubble``)."""
    return micro_batches_for_bubble(stages, max_bubble)


def _m_cases(seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    return [{"stages": rng.randint(2, 16), "max_bubble": rng.choice([0.05, 0.1, 0.2, 0.25, 0.3, 0.5])}
            for _ in range(10)] + [{"stages": 4, "max_bubble": 0.25}]


MICRO_BATCHES = Exercise(
    "micro_batches_for_bubble", "the fewest micro-batches that keep the bubble of p stages at or below b",
    micro_batches_reference, _m_cases,
    (Mistake("floor", lambda stages, max_bubble: max(1, math.floor((stages - 1) * (1 - max_bubble) / max_bubble)),
             "round UP: m must be at least (p-1)(1-b)/b, so a fractional answer needs the next whole number"),
     Mistake("over_b", lambda stages, max_bubble: math.ceil((stages - 1) / max_bubble),
             "solve (p-1)/(m+p-1) <= b for m: m >= (p-1)(1-b)/b, not (p-1)/b")),
    "solve (p-1)/(m+p-1) <= b for the smallest whole m")


# ------------------------------------------------------------------------------------ 05b: schedules
def activations_held_reference(schedule: str, stages: int, stage: int, micro_batches: int) -> int:
    """Most micro-batches whose activations ``stage`` holds at once under 'gpipe' or '1f1b' (PipeDream-Flush):
    counted on the schedule's action order (forwards done minus backwards done)."""
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    order = gpipe_order(micro_batches) if schedule == "gpipe" else one_f_one_b_order(stages, stage, micro_batches)
    return peak_in_flight(order)


def _held_cases(seed: int = 16) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"schedule": "1f1b", "stages": 4, "stage": 0, "micro_batches": 2}]
    for _ in range(12):
        p = rng.randint(2, 8)
        cases.append({"schedule": rng.choice(["gpipe", "1f1b"]), "stages": p, "stage": rng.randrange(p),
                      "micro_batches": rng.randint(p, 4 * p)})
    return cases


ACTIVATIONS_HELD = Exercise(
    "activations_held", "how many micro-batches' activations a stage holds at its peak, GPipe vs 1F1B",
    activations_held_reference, _held_cases,
    (Mistake("always_m", lambda schedule, stages, stage, micro_batches: micro_batches,
             "that is GPipe: 1F1B starts each micro-batch's backward as soon as it can, so a stage never holds "
             "more than the micro-batches still ahead of it in the pipe"),
     Mistake("always_p", lambda schedule, stages, stage, micro_batches:
             micro_batches if schedule == "gpipe" else stages,
             "under 1F1B stage s holds p - s micro-batches: the last stage only one (its backward follows at once)"),
     Mistake("no_cap", lambda schedule, stages, stage, micro_batches:
             micro_batches if schedule == "gpipe" else stages - stage,
             "with fewer micro-batches than p - s, a stage cannot hold more than m")),
    "GPipe: every forward before any backward; 1F1B: p - s forwards fill the pipe, then one backward per forward")


def one_f_one_b_reference(stages: int, stage: int, micro_batches: int) -> list[str]:
    """The actions of stage ``stage`` of ``stages`` under 1F1B, in order: ['F0', 'F1', 'B0', 'F2', ...]."""
    return one_f_one_b_order(stages, stage, micro_batches)


def _order_cases(seed: int = 17) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"stages": 2, "stage": 0, "micro_batches": 4}, {"stages": 4, "stage": 3, "micro_batches": 4},
             {"stages": 4, "stage": 0, "micro_batches": 2}]
    for _ in range(8):
        p = rng.randint(2, 6)
        cases.append({"stages": p, "stage": rng.randrange(p), "micro_batches": rng.randint(1, 3 * p)})
    return cases


def _no_warmup(stages: int, stage: int, micro_batches: int) -> list[str]:
    """Alternates from the start, F0 B0 F1 B1 ...: right for the last stage only."""
    return [a for i in range(micro_batches) for a in (f"F{i}", f"B{i}")]


ONE_F_ONE_B_ORDER = Exercise(
    "one_f_one_b_order", "the order of the forward and backward actions of one 1F1B stage",
    one_f_one_b_reference, _order_cases,
    (Mistake("gpipe", lambda stages, stage, micro_batches: gpipe_order(micro_batches),
             "that is GPipe (all forwards, then all backwards): 1F1B starts backwards once the pipe is full"),
     Mistake("same_warmup", lambda stages, stage, micro_batches:
             one_f_one_b_order(stages, 0, micro_batches),
             "the warm-up depends on the stage: stage s runs p - s forwards before its first backward"),
     Mistake("no_warmup", _no_warmup,
             "B0 can only start once micro-batch 0 has gone through the p - s - 1 later stages and come back; "
             "meanwhile stage s keeps the pipe full: p - s forwards before its first backward")),
    "stage s: F0 .. F(p-s-1), then B0, F(p-s), B1, ... until the forwards run out, then the remaining backwards")
