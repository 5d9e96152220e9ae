"""13's figures draw what the code ran: each rank's shard where shard_state cut it, f and g in place, and the mesh's
TP and DP groups as two kinds of link between the right rank boxes."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from labkit.parallel.tensor import figures  # noqa: E402
from labkit.parallel.tensor.megatron import LayerShape, build_block, shard_state  # noqa: E402

SHAPE = LayerShape(d_model=8, heads=2, seq_len=4, batch=1)       # fc1.weight (32, 8), fc2.weight (8, 32)


@pytest.fixture
def state():
    return dict(build_block(SHAPE).state_dict())


def test_shard_blocks_find_each_ranks_rows_of_fc1_and_columns_of_fc2(state):
    assert figures.shard_blocks(state, "mlp.fc1.weight", 2) == [(0, 16, 0, 8), (16, 16, 0, 8)]
    assert figures.shard_blocks(state, "mlp.fc2.weight", 4) == [(0, 8, 0, 8), (0, 8, 8, 8), (0, 8, 16, 8),
                                                              (0, 8, 24, 8)]
    for name in figures.MLP_WEIGHTS:                                  # the block drawn is the block the rank holds
        for rank, (r0, nr, c0, nc) in enumerate(figures.shard_blocks(state, name, 4)):
            torch.testing.assert_close(state[name][r0:r0 + nr, c0:c0 + nc], shard_state(state, rank, 4)[name],
                                       rtol=0, atol=0)


def _rank_patches(ax):
    return [p for p in ax.patches if str(p.get_label()).startswith("rank ")]


@pytest.mark.parametrize("t", [2, 4])
def test_mlp_split_colours_one_block_per_rank_in_each_matrix_with_f_and_g(state, t):
    ax = figures.plot_mlp_split(state, t)
    blocks = _rank_patches(ax)
    assert len(blocks) == 2 * t
    fc1, fc2 = blocks[:t], blocks[t:]
    assert {(p.get_width(), p.get_height()) for p in fc1} == {(8, 32 / t)}      # fc1: rows split, full width
    assert {(p.get_width(), p.get_height()) for p in fc2} == {(32 / t, 8)}      # fc2: columns split, full height
    assert [p.get_facecolor() for p in fc1] == [p.get_facecolor() for p in fc2]  # rank r's units: one colour
    assert len({p.get_facecolor() for p in fc1}) == t
    texts = [x.get_text() for x in ax.texts]
    assert figures.F_TEXT in texts and figures.G_TEXT in texts
    f_x, g_x = (next(x.get_position()[0] for x in ax.texts if x.get_text() == s) for s in (figures.F_TEXT,
                                                                                          figures.G_TEXT))
    assert f_x < min(p.get_x() for p in fc1) and g_x > max(p.get_x() + p.get_width() for p in fc2)
    plt.close("all")


def test_mlp_split_needs_the_unsplit_layers_state():
    with pytest.raises(ValueError, match="mlp.fc1.weight"):
        figures.plot_mlp_split({}, 2)


def _lines(ax, style):
    return [line for line in ax.lines if line.get_linestyle() == style]


def test_mesh_groups_draw_four_ranks_and_tp_and_dp_links_between_the_right_boxes():
    placements = {"tp_inside": ([[0, 1], [2, 3]], [[0, 2], [1, 3]]), "dp_inside": ([[0, 2], [1, 3]], [[0, 1], [2, 3]])}
    axes = figures.plot_mesh_groups(placements, link_bytes={"tp_inside": 2 * 2 ** 10, "dp_inside": 9 * 2 ** 10})
    assert len(axes) == 2
    for ax, (tp_groups, dp_groups) in zip(axes, placements.values()):
        assert sum(t.get_text().startswith("rank ") for t in ax.texts) == 4
        assert sum(t.get_text().startswith("node ") for t in ax.texts) == 2
        assert len(_lines(ax, "-")) == len(tp_groups) and len(_lines(ax, "--")) == len(dp_groups)
    solid, dashed = _lines(axes[0], "-"), _lines(axes[0], "--")      # TP inside: solid links stay in a node
    assert all(line.get_xdata()[0] == line.get_xdata()[1] for line in solid)
    assert all(line.get_ydata()[0] == line.get_ydata()[1] for line in dashed)
    assert all(line.get_ydata()[0] == line.get_ydata()[1] for line in _lines(axes[1], "-"))  # DP inside: TP crosses
    assert any("9 KiB per node per step" in t.get_text() for t in axes[1].texts)
    assert "rank 2\ntp 0, dp 1" in [t.get_text() for t in axes[0].texts]       # TP inside: rank 2 leads node 1's pair
    assert "rank 2\ntp 1, dp 0" in [t.get_text() for t in axes[1].texts]
    plt.close("all")


def test_a_group_of_three_draws_two_links():
    axes = figures.plot_mesh_groups({"tp3": ([[0, 1, 2]], [[0], [1], [2]])}, per_node=3)
    assert len(_lines(axes[0], "-")) == 2 and not _lines(axes[0], "--")
    plt.close("all")
