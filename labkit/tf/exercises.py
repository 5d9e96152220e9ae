"""Checked exercises for notebook 08: the per-replica loss under MirroredStrategy and dynamic loss scaling.

Torch-free (TensorFlow runs in fresh processes; these references are plain arithmetic). The loss-scale rule is
the one ``torch.amp.GradScaler`` and Keras's ``LossScaleOptimizer`` apply (Micikevicius et al. 2018, section
3.2): halve the scale and skip the step on inf/NaN gradients, double it after ``growth_interval`` good steps;
the tests check it against torch's own update kernel.
"""
from __future__ import annotations

import random

from labkit.core.exercises import Exercise, Mistake


def replica_loss_reference(per_example_losses: list[float], global_batch: int) -> float:
    """One replica's loss: the sum of its examples' losses over the GLOBAL batch (``tf.nn.compute_average_loss``),
    so that summing the replicas' gradients gives the gradient of the global mean."""
    return sum(per_example_losses) / global_batch


def _loss_cases(seed: int = 18) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(8):
        replicas, per_replica = rng.choice([2, 4, 8]), rng.choice([4, 8, 16])
        cases.append({"per_example_losses": [round(rng.uniform(0.1, 3.0), 3) for _ in range(per_replica)],
                      "global_batch": replicas * per_replica})
    return cases


REPLICA_LOSS = Exercise(
    "replica_loss", "one replica's loss inside strategy.run, from its examples' losses and the global batch size",
    replica_loss_reference, _loss_cases,
    (Mistake("replica_mean", lambda per_example_losses, global_batch: sum(per_example_losses)
             / len(per_example_losses), "the replicas' gradients are SUMMED across replicas: a per-replica mean "
             "makes them R times too large; divide by the global batch instead"),
     Mistake("plain_sum", lambda per_example_losses, global_batch: float(sum(per_example_losses)),
             "divide by the global batch size, as tf.nn.compute_average_loss does")),
    "sum of this replica's per-example losses / global batch size")


def loss_scale_reference(scale: float, good_steps: int, grads_finite: bool,
                         growth_interval: int = 2000) -> tuple[float, int]:
    """(next scale, next count of good steps) after one step of dynamic loss scaling."""
    if not grads_finite:
        return scale * 0.5, 0
    if good_steps + 1 == growth_interval:
        return scale * 2.0, 0
    return scale, good_steps + 1


def _scale_cases(seed: int = 19) -> list[dict]:
    rng = random.Random(seed)
    cases = [{"scale": 65536.0, "good_steps": 1999, "grads_finite": True, "growth_interval": 2000},
             {"scale": 65536.0, "good_steps": 1500, "grads_finite": False, "growth_interval": 2000},
             {"scale": 1024.0, "good_steps": 10, "grads_finite": True, "growth_interval": 10}]
    for _ in range(10):
        interval = rng.choice([4, 10, 2000])
        cases.append({"scale": 2.0 ** rng.randint(4, 24), "good_steps": rng.randrange(interval),
                      "grads_finite": rng.random() < 0.7, "growth_interval": interval})
    return cases


def _keeps_count(scale: float, good_steps: int, grads_finite: bool, growth_interval: int = 2000) -> tuple[float, int]:
    if not grads_finite:
        return scale * 0.5, good_steps
    return loss_scale_reference(scale, good_steps, grads_finite, growth_interval)


def _grows_late(scale: float, good_steps: int, grads_finite: bool, growth_interval: int = 2000) -> tuple[float, int]:
    if not grads_finite:
        return scale * 0.5, 0
    return (scale * 2.0, 0) if good_steps >= growth_interval else (scale, good_steps + 1)


LOSS_SCALE = Exercise(
    "loss_scale", "one update of dynamic loss scaling: the next scale and the count of good steps",
    loss_scale_reference, _scale_cases,
    (Mistake("keeps_count_on_overflow", _keeps_count, "an overflow restarts the count: after halving the scale, "
             "good_steps goes back to 0"),
     Mistake("grows_one_step_late", _grows_late, "off by one: the step that makes the count reach growth_interval "
             "doubles the scale (count this step first, then compare)"),
     Mistake("never_grows", lambda scale, good_steps, grads_finite, growth_interval=2000:
             (scale * 0.5, 0) if not grads_finite else (scale, good_steps + 1),
             "the scale must also grow back: double it after growth_interval good steps in a row, or fp16 "
             "gradients stay needlessly small")),
    "inf/NaN: halve, count 0; else count + 1, and at growth_interval double the scale and reset the count")
