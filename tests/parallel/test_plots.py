"""Charts and tables of measured runs: they draw what they are given."""
import matplotlib
import pytest

from labkit.parallel import plots
from labkit.parallel.pipeline import simulate_gpipe
from labkit.parallel.scaling import ScalingPoint

matplotlib.use("Agg")

POINTS = [ScalingPoint(1, 0.01, 0.0, 0.0, 1.0, 1.0, 1.0), ScalingPoint(2, 0.01, 0.002, 0.003, 1.0, 1.6, 1.5)]


def test_points_table_has_the_relative_error():
    df = plots.points_to_dataframe(POINTS)
    assert len(df) == 2 and "relative_error" in df.columns
    assert df["relative_error"].iloc[1] == pytest.approx((1.6 - 1.5) / 1.5)


def test_predicted_vs_measured_bars():
    ax = plots.plot_predicted_vs_measured(POINTS)
    assert len(ax.patches) == 2 * len(POINTS)                       # a predicted and a measured bar per R
    assert [t.get_text() for t in ax.get_xticklabels()] == ["R=1", "R=2"]


def test_timeline_draws_one_bar_per_event():
    events = simulate_gpipe([1.0, 1.0], [2.0, 2.0], 4)
    ax = plots.plot_timeline(events, title="m=4")
    assert len(ax.patches) == len(events) == 16 and ax.get_title() == "m=4"
