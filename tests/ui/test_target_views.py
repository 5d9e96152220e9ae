"""The steps-to-target / time-to-target view draws from live-shaped results without a browser."""
from labkit.training.noise_scale import NoiseScale
from labkit.training.to_target import TargetRun, fit_runs
from labkit.ui.target_views import noise_scale_figure, to_target_figure, to_target_table


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
