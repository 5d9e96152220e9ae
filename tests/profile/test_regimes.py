"""Tests for labkit.profile.regimes: the overhead fit on exact lines, the knee, the regimes, a real sweep."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch import nn

from labkit.profile.regimes import (fit_overhead, linear_in_batch, measure_step_times, plot_regimes,
                                    regime_rows)


def exact(c: float, s: float, sizes=(1, 2, 4, 8, 16, 32, 64)):
    return fit_overhead(list(sizes), [[c + s * b] * 3 for b in sizes])


def test_fit_recovers_an_exact_line_and_predicts_the_knee():
    fit = exact(0.010, 0.001)
    assert fit.intercept_s == pytest.approx(0.010) and fit.per_sample_s == pytest.approx(0.001)
    assert fit.predicted_knee() == pytest.approx(90.0)            # 9c/s
    # samples/s = b / (0.01 + 0.001 b): 90% of the best measured (b=64: 864.9/s) is first reached at b=64
    assert fit.measured_knee() == fit.fitted_knee() == 64


def test_one_slowed_batch_size_does_not_tilt_the_fit():
    sizes = (1, 2, 4, 8, 16, 32)
    rounds = [[0.010 + 0.001 * b] for b in sizes]
    rounds[-1] = [5 * rounds[-1][0]]                      # a load spike at the largest batch
    fit = fit_overhead(list(sizes), rounds)
    assert fit.intercept_s == pytest.approx(0.010) and fit.per_sample_s == pytest.approx(0.001)


def test_per_sample_gain_is_paired_by_round():
    fit = fit_overhead([1, 2], [[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
    assert fit.per_sample_gain(1, 2) == pytest.approx(2.0)


def test_fit_needs_two_batch_sizes():
    with pytest.raises(ValueError, match="at least two"):
        fit_overhead([1], [[1.0]])
    with pytest.raises(ValueError, match="different batch sizes"):
        fit_overhead([2, 2], [[1.0], [1.0]])


def test_regimes_follow_the_largest_cost():
    fit = exact(0.010, 0.001, sizes=(1, 1000))
    rows = regime_rows(fit, compute_s=(0.0, 1e-3), memory_s=(0.0, 1e-4), roofline_fixed_s=0.0)
    assert [r.regime for r in rows] == ["overhead", "compute"]          # 1 ms < 10 ms; then 1 s > 0.1 s > 10 ms
    weights = regime_rows(fit, compute_s=(0.0, 1e-3), memory_s=(0.008, 1e-4), roofline_fixed_s=0.008)
    assert weights[0].overhead_s == pytest.approx(0.002) and weights[0].regime == "memory"   # c is mostly traffic
    assert rows[1].memory_s == pytest.approx(0.1) and rows[1].compute_s == pytest.approx(1.0)
    ax = plot_regimes(rows, knee=1000)
    assert ax.get_xscale() == "log"


def test_linear_in_batch():
    assert linear_in_batch(1, 12.0, 5, 20.0) == (pytest.approx(10.0), pytest.approx(2.0))
    with pytest.raises(ValueError, match="small < large"):
        linear_in_batch(4, 1.0, 4, 1.0)


def test_a_real_sweep_on_a_tiny_model():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    fit = measure_step_times(model, lambda b: (torch.randn(b, 3, 2, 2), torch.randint(0, 4, (b,))), [1, 4],
                             rounds=2, repeats=1, device=torch.device("cpu"))
    assert fit.batch_sizes == (1, 4) and all(len(r) == 2 and min(r) > 0 for r in fit.rounds_s)
