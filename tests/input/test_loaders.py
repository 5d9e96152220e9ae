"""Tests for labkit.input.loaders: configs, transforms and the shape of benchmark results."""
from __future__ import annotations

import pickle

import matplotlib
import pytest
import torch
from torch.utils.data import TensorDataset

from labkit.input.loaders import (ExpensiveTransform, LoaderConfig, TransformedDataset, benchmark_loader, default_grid,
                              plot_overlap, simulated_step, sweep_loaders)

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
