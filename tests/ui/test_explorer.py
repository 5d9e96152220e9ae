"""The speedup explorer's logic and its widget, without a browser."""
import matplotlib
import pytest

from labkit.ui import explorer as ex
from labkit.parallel.costmodel import predicted_speedup, sync_time_s
from labkit.parallel.scaling import ScalingPoint

matplotlib.use("Agg")


def test_explore_matches_the_model_by_hand():
    s = ex.ExplorerSettings(replicas=4, batch=32, model_params_m=10.0, latency_us=20.0, bandwidth_gb_s=5.0,
                            device_flops_per_s=1e12, n_samples=64_000)
    r = ex.explore(s)
    t_comp = 6 * 10e6 * 32 / 1e12
    t_sync = sync_time_s(40_000_000, 4, 20e-6, 5e9)
    assert r.t_comp_s == pytest.approx(t_comp) and r.t_sync_s == pytest.approx(t_sync)
    assert r.epoch_time_alone_s == pytest.approx(64_000 / 32 * t_comp)
    assert r.epoch_time_s == pytest.approx(64_000 / 128 * (t_comp + t_sync))
    assert r.speedup == pytest.approx(predicted_speedup(t_comp, t_sync, 4))
    assert r.efficiency == pytest.approx(r.speedup / 4)
    assert r.pays == (t_sync < 3 * t_comp)


def test_more_bandwidth_never_hurts_and_slow_links_do_not_pay():
    fast = ex.explore(ex.ExplorerSettings(bandwidth_gb_s=100.0))
    slow = ex.explore(ex.ExplorerSettings(bandwidth_gb_s=0.01, replicas=2))
    assert fast.speedup > ex.explore(ex.ExplorerSettings(bandwidth_gb_s=1.0)).speedup
    assert not slow.pays and slow.speedup < 1


def test_curve_and_settings_validation():
    curve = ex.speedup_curve(ex.ExplorerSettings(), [1, 2, 4])
    assert curve[0] == 1.0 and len(curve) == 3
    with pytest.raises(ValueError, match="replicas"):
        ex.ExplorerSettings(replicas=0)
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        ex.ExplorerSettings(bandwidth_gb_s=0)


def test_widget_hooks_and_readout_follow_the_sliders():
    panel = ex.SpeedupExplorer(draw=False)
    assert "labkit-explorer" in panel.widget._dom_classes
    assert "labkit-readout" in panel.readout._dom_classes
    assert [sl.description for sl in panel.sliders.values()] == list(ex.SLIDER_DESCRIPTIONS.values())
    before = panel.readout.value
    panel.sliders["replicas"].value = 32
    assert panel.readout.value != before and "R=32" in panel.readout.value
    expected = ex.explore(panel.settings())
    assert f"{expected.speedup:.2f}x" in panel.readout.value
    before = panel.readout.value
    panel.sliders["bandwidth_gb_s"].value = 0.05
    assert panel.readout.value != before


def test_measured_overlay_and_plot():
    pts = [ScalingPoint(1, 0.01, 0.0, 0.0, 1.0, 1.0, 1.0), ScalingPoint(2, 0.01, 0.002, 0.003, 1.0, 1.6, 1.5)]
    text = ex.measured_overlay_text(pts)
    assert "R=2" in text and "+7%" in text and "R=1" not in text
    fig = ex.plot_explorer(ex.ExplorerSettings(), pts, max_replicas=8)
    assert len(fig.axes) == 2
    panel = ex.SpeedupExplorer(measured=pts, draw=True)   # drawing works outside a notebook too
    assert "measured 1.50x" in panel.measured_label.value


def test_compute_rate_is_measured_on_the_device():
    from labkit.ui.explorer import measured_matmul_flops_per_s

    flops, note = measured_matmul_flops_per_s("cpu", size=128, repeats=3)
    assert 1e7 < flops < 1e14 and "measured" in note and "CPU" in note
    settings = ex.ExplorerSettings(device_flops_per_s=flops)
    assert ex.explore(settings).t_comp_s == pytest.approx(6.0 * 25e6 * 256 / flops)
