"""The planner's figure draws the predictions it is given: one bar per layout, one segment per time term, and the
segments of a bar add up to that layout's predicted step time."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from labkit.plan import published  # noqa: E402
from labkit.plan.figures import plot_step_terms  # noqa: E402
from labkit.plan.planner import Prediction, plan  # noqa: E402
from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout  # noqa: E402


def bar_totals(ax) -> list[float]:
    """Each bar's right end: the sum of its stacked segments' widths."""
    totals = [0.0] * len(ax.containers[0].patches)
    for container in ax.containers:
        for i, patch in enumerate(container.patches):
            totals[i] += patch.get_width()
    return totals


def test_each_bar_adds_up_to_its_step_time_with_a_segment_per_term():
    h100 = DeviceSpec.from_table("NVIDIA H100 SXM", 80, "bf16")
    ranked = plan(published.SHAPES["70B-class"], h100, ClusterSpec(8, 4))
    ax = plot_step_terms(ranked).axes[0]
    assert [c.get_label() for c in ax.containers] == list(ranked[0].time)
    assert bar_totals(ax) == pytest.approx([p.step_s for p in ranked[:5]], rel=1e-12)
    assert [t.get_text() for t in ax.get_yticklabels()] == [p.layout.label() for p in ranked[:5]]
    plt.close("all")


def test_a_hand_made_ranking_is_drawn_term_by_term():
    preds = [Prediction(Layout(dp=2), {"parameters": 1.0}, {"compute": 3.0, "DP sync": 1.0}, 10.0),
             Prediction(Layout(tp=2), {"parameters": 1.0}, {"compute": 2.5, "DP sync": 2.0}, 10.0)]
    ax = plot_step_terms(preds, top=5).axes[0]
    assert [c.get_label() for c in ax.containers] == ["compute", "DP sync"]
    assert [p.get_width() for p in ax.containers[1].patches] == [1.0, 2.0]
    assert bar_totals(ax) == [4.0, 4.5]
    plt.close("all")


def test_an_empty_ranking_is_refused():
    with pytest.raises(ValueError):
        plot_step_terms([])


def test_each_bar_ends_with_its_step_time_written():
    preds = [Prediction(Layout(dp=2), {"parameters": 1.0}, {"compute": 3.0, "DP sync": 1.0}, 10.0)]
    ax = plot_step_terms(preds).axes[0]
    assert [t.get_text() for t in ax.texts] == ["4 s"]
    plt.close("all")
