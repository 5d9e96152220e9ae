"""The speedup explorer widget and its plot, without a browser."""
import matplotlib

from labkit.parallel.data import speedup as sp
from labkit.parallel.data.scaling import ScalingPoint
from labkit.ui import explorer as ex

matplotlib.use("Agg")
RATE = sp.ExplorerSettings(device_flops_per_s=20e12)   # a fixed compute rate: these tests check the widget


def test_without_a_rate_the_panel_measures_this_device_once(monkeypatch):
    calls = []
    monkeypatch.setattr(ex, "measured_training_flops_per_s", lambda: calls.append(1) or (3e12, "measured"))
    panel = ex.SpeedupExplorer(draw=False)
    assert calls == [1] and panel.settings().device_flops_per_s == 3e12
    panel.sliders["world_size"].value = 16
    assert calls == [1]


def test_widget_hooks_and_readout_follow_the_sliders():
    panel = ex.SpeedupExplorer(RATE, draw=False)
    assert "labkit-explorer" in panel.widget._dom_classes
    assert "labkit-readout" in panel.readout._dom_classes
    shown = [sl.description for sl in (*panel.sliders.values(), *panel.tier_sliders.values())]
    assert shown == list(ex.SLIDER_DESCRIPTIONS.values())
    before = panel.readout.value
    panel.sliders["world_size"].value = 32
    assert panel.readout.value != before and "R=32" in panel.readout.value
    expected = sp.explore(panel.settings())
    assert f"{expected.speedup:.2f}x" in panel.readout.value
    before = panel.readout.value
    panel.sliders["bandwidth_gb_s"].value = 0.05
    assert panel.readout.value != before


def test_measured_overlay_and_plot():
    pts = [ScalingPoint(1, 0.01, 0.0, 0.0, 1.0, 1.0, 1.0), ScalingPoint(2, 0.01, 0.002, 0.003, 1.0, 1.6, 1.5)]
    fig = ex.plot_explorer(RATE, pts, max_world_size=8)
    assert len(fig.axes) == 2
    panel = ex.SpeedupExplorer(RATE, measured=pts, draw=True)   # drawing works outside a notebook too
    assert "measured 1.50x" in panel.measured_label.value


def test_displaying_the_explorer_shows_its_widget(monkeypatch):
    """`SpeedupExplorer(...)` as a cell's last line must render the sliders, readout and plot."""
    import labkit.ui.explorer as explorer_module

    shown = []
    monkeypatch.setattr(explorer_module, "display", shown.append)
    panel = explorer_module.SpeedupExplorer(RATE, draw=False)
    panel._ipython_display_()
    assert shown == [panel.widget]


def test_the_node_tier_controls_move_the_readout():
    """Ranks per node below the replicas brings in the node link; the two-level toggle changes T_sync."""
    panel = ex.SpeedupExplorer(RATE, draw=False, max_world_size=16)
    one_node = panel.settings()
    assert one_node.ranks_per_node == 16 and sp.explore(one_node).t_sync_s == sp.explore(RATE).t_sync_s
    panel.tier_sliders["ranks_per_node"].value = 4
    panel.tier_sliders["inter_bandwidth_gb_s"].value = 0.1
    assert "node(s) of 4" in panel.readout.value
    flat = sp.explore(panel.settings())
    panel.algorithm.value = "hierarchical"
    assert panel.settings().algorithm == "hierarchical"
    assert sp.explore(panel.settings()).t_sync_s < flat.t_sync_s
    fig = ex.plot_explorer(panel.settings(), max_world_size=16)
    assert any(line.get_label() == "the node link enters" for line in fig.axes[0].lines)
