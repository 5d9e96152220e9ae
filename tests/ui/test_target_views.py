"""The steps-to-target / time-to-target view draws from live-shaped results without a browser."""
import math

import pytest
from matplotlib.figure import Figure

from labkit.training.noise_scale import NoiseScale
from labkit.training.to_target import TargetRun, fit_runs
from labkit.ui.target_views import draw_trade_off, noise_scale_figure, to_target_figure, to_target_table


def _runs():
    return [TargetRun(b, s, 0.1, 0.9, True, round(20 + 800 / b) + s, (round(20 + 800 / b) + s) * b, 0.91, 1.0, 0.01)
            for b in (8, 16, 32, 64, 128) for s in range(3)] + [TargetRun(256, 0, 0.2, 0.9, False, None, None, 0.5,
                                                                          1.0, 0.01)]


def test_table_and_figure():
    runs = _runs()
    fit = fit_runs(runs)
    times = {b: fit.mean_steps[b] * 0.001 * b for b in fit.mean_steps}
    table = to_target_table(fit, runs, times)
    assert list(table["batch"]) == [8, 16, 32, 64, 128, 256]
    assert table.loc[5, "reached"] == "0/1" and table.loc[0, "time to target (s)"] == times[8]
    fig = to_target_figure(fit, runs, times, noise=NoiseScale(30, 5, 1, 30, 10, 8, 64), knee=64)
    assert len(fig.axes) == 3 and "fastest: batch" in " ".join(t.get_text() for t in fig.axes[2].get_legend().texts)


def test_noise_figure():
    points = [(10, 1.5, NoiseScale(20, 3, 1, 20, 10, 8, 64)), (50, 0.3, NoiseScale(60, 9, 1, 60, 10, 8, 64))]
    fig = noise_scale_figure(points)
    assert fig.axes[0].get_ylabel() == "B_simple (samples)"


def test_trade_off_draws_one_point_per_batch_the_fitted_hyperbola_and_its_asymptotes():
    runs = _runs()
    fit = fit_runs(runs)
    ax = draw_trade_off(Figure().subplots(), fit, runs)
    means = next(line for line in ax.lines if line.get_label().startswith("each batch size"))
    assert list(means.get_ydata()) == [fit.mean_steps[b] for b in (8, 16, 32, 64, 128)]      # 256 never reached
    assert list(means.get_xdata()) == [b * fit.mean_steps[b] for b in (8, 16, 32, 64, 128)]   # E = B x S
    assert [t.get_text() for t in ax.texts] == ["B=8", "B=16", "B=32", "B=64", "B=128"]
    assert len(ax.collections[0].get_offsets()) == 15                                       # every seed that reached
    curve = next(line for line in ax.lines if line.get_label().startswith("fit:"))
    e, s = curve.get_xdata(), curve.get_ydata()
    assert all(math.isclose((si / fit.s_min - 1) * (ei / fit.e_min - 1), 1, rel_tol=1e-9) for ei, si in zip(e, s))
    s_min = next(line for line in ax.lines if line.get_label().startswith("S_min"))
    e_min = next(line for line in ax.lines if line.get_label().startswith("E_min"))
    assert s_min.get_ydata()[0] == fit.s_min and e_min.get_xdata()[0] == fit.e_min
    star = next(line for line in ax.lines if line.get_label().startswith("B_crit"))
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (2 * fit.e_min, 2 * fit.s_min)
    assert f"{fit.b_crit:.0f}" in star.get_label()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")     # the bootstrap's interval of an infinite B_crit
def test_trade_off_without_a_floor_of_steps_draws_no_s_min_or_b_crit():
    runs = [TargetRun(b, 0, 0.1, 0.9, True, 1000 // b - 5, (1000 // b - 5) * b, 0.91, 1.0, 0.01)
            for b in (4, 8, 16, 32)]
    fit = fit_runs(runs, bootstrap=10)
    assert fit.s_min < 0 and fit.b_crit == float("inf")          # steps fall faster than 1/B: no floor found
    ax = draw_trade_off(Figure().subplots(), fit, runs)
    labels = [line.get_label() for line in ax.lines]
    assert not [x for x in labels if x.startswith(("S_min", "B_crit"))]
    assert [x for x in labels if x.startswith("E_min")]
    curve = next(line for line in ax.lines if line.get_label().startswith("fit:"))
    assert min(curve.get_ydata()) > 0                              # a log axis draws positive steps only
