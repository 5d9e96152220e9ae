"""What the dashboard draws: bars to the device's scale with the measured tick where it belongs; plots; table."""
import re

from labkit.memory.model import MemoryBreakdown
from labkit.training.run_spec import RunSpec
from labkit.ui.batch_limits import BatchLimit
from labkit.ui.batch_runs import DashboardRun
from labkit.ui.batch_views import BAR_PX, bar_geometry, curves_png, memory_bars_html, results_html, rolling_median

LIMIT = BatchLimit(64, 100 * 10**6, 90 * 10**6, "memory", "cpu", "")
MB = 10**6


def run_with(adjust_mb: float, measured_mb: float | None = None, reserved_mb: float | None = None) -> DashboardRun:
    run = DashboardRun(RunSpec(model="small_cnn", batch_size=32, lr=0.05), 10)
    run.memory = MemoryBreakdown(32, 5 * MB, 5 * MB, 5 * MB, 10 * MB, int(adjust_mb * MB))
    run.measured_bytes = None if measured_mb is None else int(measured_mb * MB)
    run.reserved_bytes = None if reserved_mb is None else int(reserved_mb * MB)
    return run


def test_measured_tick_sits_at_the_bars_end_when_measured_equals_predicted():
    # The bug: the bar drew the four parts only, the text and the tick used the peak (parts + the step's
    # temporaries), so "predicted 26.0 MB, measured 26.0 MB" put the tick past the bar's end.
    for adjust in (6.0, 0.0, -4.0):
        run = run_with(adjust)
        run.measured_bytes = run.memory.total_bytes
        geo = bar_geometry(run, LIMIT)
        part, left, width = geo.segments[-1]
        assert abs(left + width - geo.predicted_end_px) < 0.02, (adjust, geo)
        assert geo.measured_px == geo.predicted_end_px
        assert geo.predicted_end_px == round(BAR_PX * run.memory.total_bytes / LIMIT.capacity_bytes, 2)
    assert bar_geometry(run_with(6.0), LIMIT).segments[-1][0] == "temporaries"
    assert bar_geometry(run_with(-4.0), LIMIT).segments[-1][0] == "activations"   # a peak below the parts' sum


def test_bars_are_drawn_to_the_capacity_with_the_usable_line_and_reserve():
    geo = bar_geometry(run_with(0.0, measured_mb=30.0, reserved_mb=10.0), LIMIT)
    assert geo.usable_px == 0.9 * BAR_PX and geo.measured_px == 0.3 * BAR_PX
    assert geo.reserve_px == (0.3 * BAR_PX, 0.1 * BAR_PX)
    html = memory_bars_html([run_with(0.0, 25.0)], LIMIT)
    assert "25.0% of the CPU budget" in html and "usable 90 MB" in html
    tick = re.search(r'labkit-measured-tick[^>]*left:([\d.]+)px', html)
    assert float(tick.group(1)) + 1 == 0.25 * BAR_PX
    assert "waiting" in memory_bars_html([], None)


def test_curves_and_table_render_with_and_without_runs():
    assert curves_png([])[:4] == b"\x89PNG"
    runs = []
    for acc in (0.9, 0.4):
        run = run_with(0.0, 25.0)
        run.add_step(1, 32, 0.1, 320.0, 2.0)
        run.add_accuracy(acc)
        run.ceiling_samples_per_s = 400.0
        run.result = type("R", (), {"samples_per_s_median": 320.0, "samples_per_s_p10": 300.0,
                                    "samples_per_s_p90": 330.0})()
        runs.append(run)
    assert curves_png(runs, target=0.8)[:4] == b"\x89PNG"
    table = results_html(runs, 0.8)
    assert "spread between repeats" in table and "0.40 to 0.90" in table
    assert "<td>320</td>" in table and "<td>300-330</td>" in table and "None" not in table
    assert results_html([], 0.8) == ""


def test_rolling_median_smooths_a_spike_without_moving_the_level():
    assert rolling_median([100.0, 100.0, 900.0, 100.0, 100.0], window=3) == [100.0, 100.0, 100.0, 100.0, 100.0]
    assert rolling_median([1.0, 3.0], window=5) == [1.0, 2.0]


def test_gpu_bars_name_the_card_and_show_the_reserve():
    card = BatchLimit(4096, 80 * 10**9, 72 * 10**9, "memory", "cuda", "")
    html = memory_bars_html([run_with(0.0, measured_mb=30.0, reserved_mb=900.0)], card)
    assert "against the GPU memory (80,000 MB" in html and "hatched = allocator reserve" in html
    assert "allocator reserve 900.0 MB" in html and 'title="allocator reserve"' in html
