"""The figures draw from the objects: one box per rank coloured by its group, one bar per composition and axis."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from labkit.comm.mesh import Mesh  # noqa: E402
from labkit.parallel.compose.plots import draw_axis_groups, mesh_figure, plot_axis_bytes  # noqa: E402


def test_each_rank_is_a_box_coloured_by_its_group():
    ax = plt.subplots()[1]
    draw_axis_groups(Mesh(dp=2, tp=2), "dp", ax)
    colours = [tuple(p.get_facecolor()) for p in ax.patches]
    assert len(colours) == 4 and colours[0] == colours[1] != colours[2] == colours[3]   # groups [0, 2] and [1, 3]
    assert "[[0, 2], [1, 3]]" in ax.get_title()
    plt.close("all")


def test_the_figures_have_a_panel_per_axis_and_a_bar_per_row():
    fig = mesh_figure({"dp x tp": Mesh(dp=2, tp=2), "dp x pp": Mesh(dp=2, pp=2)})
    assert sum(bool(a.patches) for a in fig.axes) == 4
    rows = [{"composition": "dp x tp", "axis": "tp", "measured_bytes": 2048.0, "predicted_bytes": 2048.0,
             "rival_bytes": 4096.0}, {"composition": "dp x tp", "axis": "dp", "measured_bytes": 1024.0,
                                      "predicted_bytes": 1024.0, "rival_bytes": 2048.0}]
    ax = plot_axis_bytes(rows)
    assert [p.get_height() for p in ax.patches] == [2.0, 1.0]
    plt.close("all")
