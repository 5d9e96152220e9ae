"""The figures draw from the run's objects: one bar per expert, coloured by rank; grouped bars before/after."""
import matplotlib

matplotlib.use("Agg")

from labkit.parallel.experts import plots  # noqa: E402


def test_placement_draws_one_bar_per_expert():
    ranks = [{"rank": 0, "first": 0, "received_per_expert": [3, 4]}, {"rank": 1, "first": 2, "received_per_expert": [5, 6]}]
    ax = plots.plot_placement(ranks)
    assert len(ax.patches) == 4 and [p.get_height() for p in ax.patches] == [3, 4, 5, 6]


def test_balance_draws_before_and_each_after():
    runs = {"no aux loss": {"before": [4, 0], "after": [3, 1]}, "aux": {"before": [4, 0], "after": [2, 2]}}
    ax = plots.plot_balance(runs, experts_per_rank=1)
    assert len(ax.patches) == 6
