"""The batch-size sweep: rows, memory budget, LR scaling, time budget, the knee."""
import math

import pytest

from labkit.training.batch_size import batch_size_sweep, knee_batch
from labkit.core.data import synthetic_data
from labkit.training.memory import build_memory_model
from labkit.core.models import MLP

SHAPE = (3, 8, 8)


def test_knee():
    assert knee_batch([1, 2, 4, 8, 16], [10, 50, 92, 100, 99]) == 4
    assert knee_batch([], []) is None


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=96, n_val=32, image_shape=SHAPE)


def test_sweep_rows_budget_and_lr_scaling(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    budget = build_memory_model(make(), SHAPE).predict(16).total_bytes
    res = batch_size_sweep(make, data, [2, 8, 32], steps=3, lr_scaling=True, base_lr=0.04, base_batch=8,
                           memory_budget_bytes=budget, progress=False)
    df = res.to_dataframe()
    assert list(df.batch_size) == [2, 8, 32] and list(df.fits) == [True, True, False]
    assert list(df.lr) == pytest.approx([0.01, 0.04, 0.16])
    assert "does not fit" in res.rows[2].note and math.isnan(res.rows[2].samples_per_s)
    assert all(r.samples_per_s > 0 and 0 <= r.val_accuracy <= 1 and r.steps == 3 for r in res.rows[:2])
    assert res.knee() in (2, 8)
    import matplotlib
    matplotlib.use("Agg")
    axes = res.plot()
    assert axes[0].get_xscale() == "log"


def test_sweep_time_budget_and_bad_sizes(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    res = batch_size_sweep(make, data, [4], steps=500, time_budget_s=1e-9, progress=False)
    assert res.rows[0].steps == 1                                 # stopped by the time budget after one step
    with pytest.raises(ValueError, match="larger than the dataset"):
        batch_size_sweep(make, data, [1000], steps=1, progress=False)
    with pytest.raises(ValueError, match=r"batch size in batch_sizes must be an integer between 1 and \d+, got 0"):
        batch_size_sweep(make, data, [0], steps=1, progress=False)


def test_sweep_ceiling_beside_every_row_that_ran(data):
    """ceiling=True: each row that ran gets its ceiling, measured with the row's recipe, steps and real samples."""
    from types import SimpleNamespace

    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    budget = build_memory_model(make(), SHAPE).predict(16).total_bytes
    calls = []

    def fake_ceiling(model, batch_size, config, **kwargs):
        calls.append((batch_size, config, kwargs))
        return SimpleNamespace(samples_per_s_median=1000.0 * batch_size)

    res = batch_size_sweep(make, data, [2, 8, 32], steps=3, lr_scaling=True, base_batch=8, memory_budget_bytes=budget,
                           progress=False, ceiling=True, ceiling_repeats=2, ceiling_fn=fake_ceiling)
    assert [c[0] for c in calls] == [2, 8]                         # batch 32 does not fit: nothing to bound
    for (bs, cfg, kwargs), row in zip(calls, res.rows):
        assert cfg.steps == row.steps == 3 and cfg.epochs is None and not cfg.evaluate and cfg.lr == row.lr
        assert kwargs["repeats"] == 2 and kwargs["sample_from"] is data.train
        assert kwargs["image_shape"] == SHAPE and kwargs["num_classes"] == data.num_classes
        assert row.ceiling_samples_per_s == 1000.0 * bs
        assert row.fraction_of_ceiling == pytest.approx(row.samples_per_s / row.ceiling_samples_per_s)
    assert res.rows[2].ceiling_samples_per_s is None and res.rows[2].fraction_of_ceiling is None
    assert {"ceiling_samples_per_s", "fraction_of_ceiling"} <= set(res.to_dataframe().columns)


def test_sweep_ceiling_measured_for_real(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    res = batch_size_sweep(make, data, [4, 16], steps=4, progress=False, ceiling=True, ceiling_repeats=1)
    for row in res.rows:
        assert row.ceiling_samples_per_s > 0 and row.fraction_of_ceiling > 0
        assert row.fraction_of_ceiling == pytest.approx(row.samples_per_s / row.ceiling_samples_per_s)
    import matplotlib
    matplotlib.use("Agg")
    axes = res.plot()
    assert "ceiling (batches on the device)" in [t.get_text() for t in axes[0].get_legend().get_texts()]
    plain = batch_size_sweep(make, data, [4], steps=2, progress=False)
    assert plain.rows[0].ceiling_samples_per_s is None and plain.rows[0].fraction_of_ceiling is None


def test_sweep_bad_ceiling_repeats(data):
    make = lambda: MLP(10, in_features=3 * 8 * 8, hidden=16)     # noqa: E731
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="ceiling_repeats must be an integer >= 1"):
            batch_size_sweep(make, data, [4], steps=1, progress=False, ceiling=True, ceiling_repeats=bad)
