"""Steps to a target and the critical-batch fit: the fit recovers known S_min and E_min, its interval covers the
truth, and a real tiny run stops at the target with the kit's loop."""
import functools
import math

import pytest

from labkit.core.data import load_data
from labkit.core.models import build_model
from labkit.training.to_target import (TargetRun, capped_lr, critical_batch, fit_critical_batch, fit_runs,
                                       train_to_target)


def _runs(s_min=20.0, e_min=800.0, batches=(8, 16, 32, 64, 128, 256), seeds=3, jitter=0.03):
    runs = []
    for b in batches:
        for seed in range(seeds):
            steps = round((s_min + e_min / b) * (1 + jitter * (seed - 1)))
            runs.append(TargetRun(b, seed, 0.1, 0.9, True, steps, steps * b, 0.91, 1.0, 0.01))
    return runs


def test_fit_recovers_the_line_and_b_crit():
    bs = [8, 16, 32, 64, 128]
    steps = [20 + 800 / b for b in bs]
    s_min, e_min = fit_critical_batch(steps, [b * s for b, s in zip(bs, steps)])
    assert (s_min, e_min) == pytest.approx((20, 800))
    assert critical_batch(s_min, e_min) == pytest.approx(40)
    assert critical_batch(-1.0, 5.0) == math.inf


def test_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two or more"):
        fit_critical_batch([10], [100])
    with pytest.raises(ValueError, match="same batch size"):
        fit_critical_batch([10, 20], [100, 200])


def test_fit_runs_interval_covers_the_truth_and_needs_three_batches():
    fit = fit_runs(_runs())
    assert fit.b_crit == pytest.approx(40, rel=0.1)
    assert fit.b_crit_low <= 40 <= fit.b_crit_high and fit.seeds == 3
    assert fit.steps_at(40) == pytest.approx(fit.s_min * 2, rel=0.1)
    assert "B_crit" in str(fit)
    missed = [TargetRun(8, 0, 0.1, 0.9, False, None, None, 0.5, 1.0, 0.01)] + _runs(batches=(16, 32))
    with pytest.raises(ValueError, match="only 2 batch sizes"):
        fit_runs(missed)


def test_capped_lr_scales_then_stops():
    assert capped_lr(0.05, 64, 32, 1.0) == pytest.approx(0.1)
    assert capped_lr(0.05, 1024, 32, 0.2) == 0.2


def test_a_real_run_stops_at_the_target():
    data = load_data("digits", image_size=8, train_limit=400, val_limit=100)
    model_fn = functools.partial(build_model, "mlp", data.num_classes, tuple(data.image_shape))
    run = train_to_target(model_fn, data, 32, target=0.7, lr=0.1, max_steps=200)
    assert run.reached and run.accuracy >= 0.7 and run.examples == 32 * run.steps and run.wall_s > 0
    missed = train_to_target(model_fn, data, 32, target=1.0, lr=0.1, max_steps=3)
    assert not missed.reached and missed.steps is None
    with pytest.raises(ValueError, match="target"):
        train_to_target(model_fn, data, 32, target=1.5, lr=0.1)
