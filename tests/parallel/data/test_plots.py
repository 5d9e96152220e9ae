"""Charts and tables of measured runs: they draw what they are given."""
import matplotlib
import pytest

from labkit.parallel.data import plots
from labkit.parallel.pipeline.gpipe import simulate_gpipe
from labkit.parallel.data.scaling import ScalingPoint
from labkit.parallel.pipeline.schedule_sim import Span
from labkit.parallel.pipeline.schedule_trace import Post

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


def test_a_simulated_gpipe_step_draws_one_unhatched_box_per_action():
    spans = simulate_gpipe([1.0, 1.0], [2.0, 2.0], 4)
    ax = plots.plot_schedule(spans, title="m=4")
    assert len(ax.patches) == len(spans) == 16 and ax.get_title() == "m=4"
    assert not any(p.get_hatch() for p in ax.patches)        # one stage per rank: no second stage to hatch


def test_schedule_picture_draws_one_box_per_action_and_hatches_a_ranks_second_stage():
    spans = [Span(0, 0, "F", 0, 0.0, 1.0), Span(1, 1, "F", 0, 1.0, 2.0), Span(1, 2, "I", 0, 2.0, 3.0),
             Span(1, 2, "W", 0, 3.0, 4.0), Span(0, 0, "B", 0, 4.0, 6.0)]
    posts = [Post(0, 0, "send F", 0, 1.0, 64), Post(1, 1, "recv F", 0, 0.5, 64)]
    ax = plots.plot_schedule(spans, title="live", posts=posts)
    assert len(ax.patches) == 5 and ax.get_title() == "live" and len(ax.lines) == 2
    assert [bool(p.get_hatch()) for p in ax.patches] == [False, False, True, True, False]
