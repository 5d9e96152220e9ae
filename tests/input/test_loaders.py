"""Tests for labkit.input.loaders: configs, transforms and the shape of benchmark results."""
from __future__ import annotations

import pickle

import matplotlib
import pytest
import torch
from torch.utils.data import TensorDataset

from labkit.input.loaders import (ExpensiveTransform, LoaderConfig, TransformedDataset, benchmark_loader, default_grid,
                                  measure_consumer_ceiling, plot_overlap, simulated_step, sweep_loaders)

matplotlib.use("Agg")


def dataset(n: int = 24):
    return TensorDataset(torch.arange(n, dtype=torch.float32).view(n, 1), torch.arange(n))


def test_config_validation_and_label():
    assert LoaderConfig(2, True, 4, True).label == "workers=2 pin prefetch=4 persistent"
    assert LoaderConfig().label == "workers=0"
    with pytest.raises(ValueError, match="num_workers"):
        LoaderConfig(-1)
    with pytest.raises(ValueError, match="need num_workers >= 1"):
        LoaderConfig(0, persistent_workers=True)
    with pytest.raises(ValueError, match="prefetch_factor"):
        LoaderConfig(1, prefetch_factor=0)


def test_transform_is_identity_and_picklable():
    x = torch.randn(3, 4)
    for kind in ("io", "cpu"):
        t = pickle.loads(pickle.dumps(ExpensiveTransform(0.0005, kind)))
        assert torch.equal(t(x), x)
    with pytest.raises(ValueError, match="kind"):
        ExpensiveTransform(0.001, "gpu")
    with pytest.raises(ValueError, match="delay_s"):
        ExpensiveTransform(-1.0)


def test_benchmark_result_shape():
    ds = TransformedDataset(dataset(), ExpensiveTransform(0.0, "io"))
    res = benchmark_loader(ds, LoaderConfig(0), batch_size=5, epochs=2, step_fn=simulated_step(0.0))
    assert res.samples == 48 and len(res.timeline) == 10          # 5 batches per epoch (last one of 4 samples)
    assert all(t0 <= t1 <= t2 for t0, t1, t2 in res.timeline)
    assert 0.0 <= res.data_wait_fraction <= 1.0 and res.samples_per_s > 0
    row = res.row()
    assert {"config", "num_workers", "samples_per_s", "data_wait_fraction", "total_s", "samples"} <= set(row)


def test_sweep_with_workers_sees_every_sample():
    seen = []
    ds = TransformedDataset(dataset(), ExpensiveTransform(0.0, "io"))
    sweep = sweep_loaders(ds, [LoaderConfig(0), LoaderConfig(2, persistent_workers=True)], batch_size=6,
                          epochs=2, step_fn=lambda b: seen.append(b[1].tolist()), progress=False)
    assert [r["config"] for r in sweep.rows] == ["workers=0", "workers=2 persistent"]
    flat = sorted(i for batch in seen for i in batch)
    assert flat == sorted(list(range(24)) * 4)                      # 2 configs x 2 epochs, nothing lost
    frame = sweep.to_dataframe()
    assert list(frame.columns) == ["samples_per_s", "data_wait_fraction", "total_s"]
    sweep.plot()
    plot_overlap(sweep.results)


def test_default_grid():
    grid = default_grid(2)
    assert grid[0] == LoaderConfig(0) and all(c.num_workers == 2 for c in grid[2:])
    assert len({c.label for c in grid}) == len(grid)


def test_bad_epochs():
    with pytest.raises(ValueError, match="epochs"):
        benchmark_loader(dataset(), LoaderConfig(0), epochs=0)


def test_consumer_ceiling_times_the_step_on_batches_in_memory():
    seen = []
    slow = TransformedDataset(dataset(), ExpensiveTransform(0.001, "io"))

    def step(batch):
        seen.append(batch[1].tolist())
        simulated_step(0.005)(batch)

    top = measure_consumer_ceiling(step, 6, sample_from=slow, steps=5, repeats=2)
    assert len(top.repeat_samples_per_s) == 2 and top.samples_per_s == max(top.repeat_samples_per_s)
    # a sleep of 5 ms per batch of 6 bounds it above; below, a machine at load 14 read 0.29 of it
    assert 0.2 * 6 / 0.005 < top.samples_per_s <= 6 / 0.005
    assert top.step_time_s == pytest.approx(6 / top.samples_per_s)
    assert len(seen) == 2 * (1 + 5)                                 # one warm-up + 5 timed steps per repeat
    assert seen[:5] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17], [18, 19, 20, 21, 22, 23],
                        [0, 1, 2, 3, 4, 5]]                         # real batches, cycled from a resident pool


def test_sweep_with_ceiling_reports_each_row_as_a_fraction_of_it():
    ds = TransformedDataset(dataset(), ExpensiveTransform(0.001, "io"))
    sweep = sweep_loaders(ds, [LoaderConfig(0)], batch_size=6, epochs=1, step_fn=simulated_step(0.004),
                          progress=False, ceiling=True)
    assert sweep.ceiling is not None and sweep.ceiling.samples_per_s > 0
    frame = sweep.to_dataframe()
    assert list(frame.columns) == ["samples_per_s", "data_wait_fraction", "total_s", "fraction_of_ceiling"]
    got = frame.loc["workers=0"]
    assert got.fraction_of_ceiling == pytest.approx(got.samples_per_s / sweep.ceiling.samples_per_s)
    assert 0 < got.fraction_of_ceiling < 1.0                        # 6 ms of loading per batch, in series: below it
    ax = sweep.plot()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ceiling: the step alone"]


def test_consumer_ceiling_bad_input():
    step = simulated_step(0.0)
    with pytest.raises(ValueError, match="batch_size must be an integer between 1 and 24, got 0"):
        measure_consumer_ceiling(step, 0, sample_from=dataset())
    with pytest.raises(ValueError, match="got 25; sample_from has 24 samples"):
        measure_consumer_ceiling(step, 25, sample_from=dataset())
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        measure_consumer_ceiling(step, 4, sample_from=dataset(), steps=0)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        measure_consumer_ceiling(step, 4, sample_from=dataset(), repeats=0)
    with pytest.raises(ValueError, match="step_fn must be a callable"):
        measure_consumer_ceiling(0.04, 4, sample_from=dataset())
    with pytest.raises(ValueError, match="ceiling=True needs step_fn"):
        sweep_loaders(dataset(), [LoaderConfig(0)], batch_size=4, progress=False, ceiling=True)
