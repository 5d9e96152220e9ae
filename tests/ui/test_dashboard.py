"""The batch-size dashboard driven without a browser: values, buttons, readout, history, Stop."""
import time

import pytest

from labkit.core.clock import Deadline
from labkit.core.data import synthetic_data
from labkit.ui.dashboard import BatchSizeDashboard, DashboardRun, curves_png, memory_bars_html


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=128, n_val=64, image_shape=(3, 8, 8))


def make(data, **kw):
    return BatchSizeDashboard(data=data, models=("mlp", "small_cnn"), update_every=1, eval_every=3, **kw)


def test_hooks_for_the_browser(data):
    dash = make(data)
    assert dash.batch_size.description == "Batch size"
    assert dash.run_button.description == "Run" and dash.stop_button.description == "Stop"
    assert "labkit-readout" in dash.readout._dom_classes
    assert "labkit-dashboard" in dash.widget._dom_classes
    assert dash.stop_button.disabled and not dash.run_button.disabled


def test_blocking_run_updates_views_and_history(data):
    dash = make(data, steps=6)
    dash.batch_size.value = 16
    run = dash.run(blocking=True)
    assert isinstance(run, DashboardRun) and run.batch_size == 16 and len(run.points) == 6
    assert run.result is not None and not run.stopped and run.error is None
    text = dash.readout.value
    assert "samples/s" in text and "ms" in text and "MB" in text and "step 6/6" in text
    assert run.lr == pytest.approx(0.05 * 16 / 32)                 # linear scaling on by default
    assert run.accuracy and run.accuracy[-1][0] == 6 and 0 <= run.accuracy[-1][1] <= 1
    assert run.measured_bytes >= run.memory.params_bytes
    assert "predicted" in dash.memory_view.value and dash.curves_view.value[:4] == b"\x89PNG"
    assert not dash.run_button.disabled and dash.stop_button.disabled


def test_second_run_keeps_the_first_and_lr_scaling_off(data):
    dash = make(data, steps=3)
    dash.run(blocking=True)
    dash.batch_size.value, dash.lr_scaling.value, dash.model_name.value = 8, False, "small_cnn"
    dash.run(blocking=True)
    assert [r.batch_size for r in dash.history] == [32, 8] and dash.history[1].lr == 0.05
    assert dash.memory_view.value.count("predicted") == 2


def test_run_button_and_stop_button(data):
    dash = make(data, steps=10_000)
    dash.run_button.click()                                        # non-blocking, background thread
    deadline = Deadline(60)
    while "samples/s" not in dash.readout.value and not deadline.expired:
        time.sleep(0.05)
    try:
        assert dash.running and "samples/s" in dash.readout.value and not dash.stop_button.disabled
    finally:
        dash.stop_button.click()
    dash.wait(timeout_s=60)
    run = dash.history[-1]
    assert not dash.running and run.stopped and len(run.points) < 10_000
    assert "stopped" in dash.status.value


def test_bad_batch_size_is_reported_not_raised(data):
    dash = make(data, steps=2)
    dash.batch_size.value = 0
    assert dash.run(blocking=True) is None
    assert "ValueError" in dash.status.value and "Batch size" in dash.status.value
    dash.batch_size.value = 10_000
    dash.run(blocking=True)
    assert "larger than the dataset" in dash.status.value and not dash.run_button.disabled


def test_render_helpers_without_runs():
    assert "waiting" in memory_bars_html([])
    assert curves_png([])[:4] == b"\x89PNG"


def test_cpu_measurement_counts_activations_independently(data):
    dash = make(data, steps=3)
    run = dash.run(blocking=True)
    pred = run.memory
    assert abs(run.measured_bytes - pred.total_bytes) / pred.total_bytes < 0.02


def test_bad_steps_and_settings_are_clear_errors(data):
    dash = make(data, steps=2)
    dash.steps.value = 0
    assert dash.run(blocking=True) is None
    assert "Steps must be an integer &gt;= 1, got 0" in dash.status.value and not dash.history
    with pytest.raises(ValueError, match="update_every must be an integer >= 1"):
        BatchSizeDashboard(data=data, update_every=0)
