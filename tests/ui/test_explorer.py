"""The speedup explorer widget and its plot, without a browser."""
import matplotlib

from labkit.parallel import speedup as sp
from labkit.parallel.scaling import ScalingPoint
from labkit.ui import explorer as ex

matplotlib.use("Agg")


def test_widget_hooks_and_readout_follow_the_sliders():
    panel = ex.SpeedupExplorer(draw=False)
    assert "labkit-explorer" in panel.widget._dom_classes
    assert "labkit-readout" in panel.readout._dom_classes
    assert [sl.description for sl in panel.sliders.values()] == list(ex.SLIDER_DESCRIPTIONS.values())
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
    fig = ex.plot_explorer(sp.ExplorerSettings(), pts, max_world_size=8)
    assert len(fig.axes) == 2
    panel = ex.SpeedupExplorer(measured=pts, draw=True)   # drawing works outside a notebook too
    assert "measured 1.50x" in panel.measured_label.value


def test_displaying_the_explorer_shows_its_widget(monkeypatch):
    """`SpeedupExplorer(...)` as a cell's last line must render the sliders, readout and plot."""
    import labkit.ui.explorer as explorer_module

    shown = []
    monkeypatch.setattr(explorer_module, "display", shown.append)
    panel = explorer_module.SpeedupExplorer(draw=False)
    panel._ipython_display_()
    assert shown == [panel.widget]
