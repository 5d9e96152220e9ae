"""The self-score's figure draws from the rows: one point per layout, one pair of bars per axis that ran."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from labkit.plan.score import axis_summary  # noqa: E402
from labkit.plan.score_plot import plot_self_score  # noqa: E402


def test_one_point_per_layout_and_two_bars_per_axis_that_ran():
    rows = [{"layout": "a", "axes": "dp tp", "predicted ms": 10.0, "measured ms": 12.0, "step error": 0.2,
             "state error": 0.0, "activation error": 0.0},
            {"layout": "b", "axes": "pp", "predicted ms": 20.0, "measured ms": 15.0, "step error": -0.25,
             "state error": 0.0, "activation error": 0.0}]
    fig = plot_self_score(rows, axis_summary(rows))
    left, right = fig.axes
    assert len(left.collections) == 2 and [t.get_text() for t in left.texts] == ["dp tp", "pp"]
    assert [round(p.get_height()) for p in right.patches] == [20, 20, -25, 20, 20, -25]
    plt.close("all")
