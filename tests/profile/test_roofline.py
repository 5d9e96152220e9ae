"""Tests for labkit.profile.roofline: the roofline's arithmetic by hand, the roofs' statistics, the plot."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.profile.roofline import RoofMeasurement, Roofs, attainable_flops_per_s, plot_roofline


def roofs(peak: float = 100e9, bw: float = 10e9) -> Roofs:
    return Roofs("test", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (peak,), 1024)},
                 {"copy": RoofMeasurement("copy", "B/s", (bw / 2,), 2**20),
                  "triad": RoofMeasurement("triad", "B/s", (bw,), 2**20)})


def test_ridge_point_is_peak_over_the_faster_bandwidth():
    r = roofs(100e9, 10e9)
    assert r.bandwidth_bytes_per_s == 10e9          # the triad, the faster of the two
    assert r.ridge_flops_per_byte() == pytest.approx(10.0)


def test_prediction_is_the_larger_of_the_two_times():
    r = roofs(100e9, 10e9)
    assert r.predict_time_s(1e9, 1e6) == pytest.approx(1e-2)       # 1 GFLOP at 100 GFLOP/s; bytes take 0.1 ms
    assert r.predict_time_s(1e6, 1e9) == pytest.approx(1e-1)       # 1 GB at 10 GB/s
    assert r.bound(1e9, 1e6) == "compute" and r.bound(1e6, 1e9) == "memory"
    assert r.bound(10e6, 1e6) == "compute"                          # exactly at the ridge: compute
    assert r.bound(5.0, 0) == "compute"


def test_the_cache_roof_prices_small_operators_and_moves_their_ridge():
    r = Roofs("test", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (100e9,), 1)},
              {"copy": RoofMeasurement("copy", "B/s", (10e9,), 2**30),
               "copy in cache": RoofMeasurement("copy in cache", "B/s", (40e9,), 2**20)})
    assert r.bandwidth_bytes_per_s == 10e9 and r.cache_bytes_per_s == 40e9
    assert r.bandwidth_for(2**20) == 40e9 and r.bandwidth_for(2**30) == 10e9
    assert r.ridge_flops_per_byte() == pytest.approx(10.0) and r.ridge_flops_per_byte(in_cache=True) == 2.5
    assert r.bound(5e6, 1e6) == "compute" and r.bound(5e9, 1e9) == "memory"   # both at 5 FLOP/B
    with pytest.raises(ValueError, match="memory bandwidth roof"):
        Roofs("test", r.compute, {"copy in cache": r.bandwidth["copy in cache"]})


def test_attainable_is_min_of_roof_and_slope():
    assert attainable_flops_per_s(1.0, 100e9, 10e9) == 10e9
    assert attainable_flops_per_s(1000.0, 100e9, 10e9) == 100e9


def test_measurement_statistics_and_fraction_of_datasheet():
    m = RoofMeasurement("copy", "B/s", (1.0, 2.0, 3.0, 4.0, 5.0), 64, datasheet=10.0, source="sheet",
                        sweep=((256, 1.0), (512, 4.0), (1024, 3.0)))
    assert m.median == 3.0 and m.p10 == pytest.approx(1.4) and m.p90 == pytest.approx(4.6) and m.roof == 5.0
    assert m.fraction_of_datasheet == pytest.approx(0.5)          # the best repeat: the strictest check
    assert m.sweep_gain == pytest.approx(4.0)
    assert RoofMeasurement("copy", "B/s", (1.0,), 64).fraction_of_datasheet is None
    assert RoofMeasurement("m", "FLOP/s", (1.0, 2.0), 64, sweep=((64, 3.0),)).roof == 3.0   # the best rate seen
    row = m.row()
    assert row["unit"] == "GB/s" and row["fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs, message", [({"unit": "GB"}, "unit"), ({"rounds": ()}, "rounds"),
                                             ({"rounds": (0.0,)}, "rounds"), ({"rounds": (float("nan"),)}, "rounds")])
def test_bad_measurements_are_refused(kwargs, message):
    base = dict(name="x", unit="B/s", rounds=(1.0,), size=1)
    with pytest.raises(ValueError, match=message):
        RoofMeasurement(**{**base, **kwargs})


def test_roofs_need_fp32_and_a_bandwidth_and_name_a_missing_dtype():
    with pytest.raises(ValueError, match="fp32"):
        Roofs("test", {}, {})
    with pytest.raises(ValueError, match="bf16"):
        roofs().peak_flops_per_s("bf16")


def test_plot_marks_the_ridge_point():
    points = [{"kind": "matmul/conv", "intensity_flops_per_byte": 50.0, "achieved_flops_per_s": 5e10},
              {"kind": "elementwise/other", "intensity_flops_per_byte": 0.1, "achieved_flops_per_s": 1e8}]
    ax = plot_roofline(roofs(), points)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert any("ridge point 10.0" in t.get_text() for t in ax.get_legend().get_texts())


def test_measurement_spread_is_the_best_repeat_over_the_median_of_the_roofs_used():
    steady = roofs()
    assert steady.measurement_spread() == 0.0
    noisy = Roofs("test", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (90e9, 100e9, 95e9), 1024),
                           "bf16": RoofMeasurement("matmul bf16", "FLOP/s", (1e9, 50e9, 2e9), 1024)},
                  {"copy": RoofMeasurement("copy", "B/s", (1e9, 4e9, 2e9), 2**20)})
    assert noisy.measurement_spread() == pytest.approx(1.0)           # copy: best 4 over median 2
    assert noisy.measurement_spread("bf16") == pytest.approx(24.0)    # bf16's best repeat is 25x its median
