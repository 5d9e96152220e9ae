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


def test_node_placements_draw_two_nodes_four_ranks_and_the_link_bytes_per_panel():
    layouts = {"a": {0: "experts 0-3", 1: "experts 4-7", 2: "experts 0-3", 3: "experts 4-7"},
               "b": {0: "experts 0-3", 1: "experts 0-3", 2: "experts 4-7", 3: "experts 4-7"}}
    axes = plots.plot_node_placements(layouts, {"a": (2000.0, 1900.0), "b": (9000.0, 8800.0)})
    assert len(axes) == 2
    for ax in axes:
        assert len(ax.patches) == 2 + 4                                   # two node boxes, four ranks
    texts = [t.get_text() for t in axes[1].texts]
    assert any("9 kB/step" in t and "model 9 kB" in t for t in texts)
    # same experts, same colour: ranks 0 and 2 in panel a
    colours = [p.get_facecolor() for p in axes[0].patches if p.get_fill()]      # ranks 0, 1, 2, 3
    assert colours[0] == colours[2] != colours[1]
