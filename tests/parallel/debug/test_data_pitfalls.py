"""Data pitfalls on the PyTorch side: broken and fixed variants give the evidence notebook 09 asserts on."""
import math

import pytest
import torch

from labkit.core.models import MLP
from labkit.parallel.debug.data_pitfalls import (lr_scaling_run, padded_eval_accuracy, samples_per_s_by_batch,
                                                 samples_per_s_rounds, shard_coverage, torch_uneven_last_batch)


def test_torch_uneven_last_batch():
    ev = torch_uneven_last_batch(num_examples=65, batch_size=8, world_size=2)
    assert ev.samples_per_rank == (33, 33) and ev.duplicated_samples == 1
    assert ev.last_batch_sizes == (1, 1) and "Expected more than 1 value" in ev.broken_error
    assert ev.fixed_last_batch_sizes == (8, 8) and ev.fixed_stats_finite
    assert ev.empty_batch_changes_stats is False


def test_padded_eval_accuracy_real_processes():
    ev = padded_eval_accuracy([0, 0] + [1] * 8, world_size=3)
    assert ev.padded_samples_seen == 12 and ev.padded_accuracy == pytest.approx(8 / 12)
    assert ev.fixed_samples_seen == 10 and ev.fixed_accuracy == pytest.approx(0.8)


def test_shard_coverage():
    assert shard_coverage(100, 4, False) == {"samples_read": 400, "distinct": 100, "per_rank": 100}
    assert shard_coverage(100, 4, True) == {"samples_read": 100, "distinct": 100, "per_rank": 25}


def test_more_ranks_than_samples_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 3, got 4; the dataset has 3 "
                                         r"samples, so each rank needs at least one; use fewer ranks$"):
        torch_uneven_last_batch(num_examples=3, batch_size=2, world_size=4)
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 2, got 3; the evaluation "
                                         r"set has 2 samples"):
        padded_eval_accuracy([1, 0], world_size=3)


def test_bad_batches_are_one_clear_error():
    with pytest.raises(ValueError, match=r"^batch_size must be an integer between 1 and 33, got 40; each rank holds 33"):
        torch_uneven_last_batch(num_examples=65, batch_size=40, world_size=2)
    with pytest.raises(ValueError, match=r"^each value in batch_sizes must be an integer >= 1, got 0$"):
        samples_per_s_by_batch(MLP(10, in_features=12, hidden=8), batch_sizes=(0, 2), image_shape=(12,))
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.raises(ValueError, match=r"^global_batch must be an integer between 1 and 20, got 32; the training"):
        lr_scaling_run(x, y, x, y, global_batch=32, lr=0.1)


def test_samples_per_s_by_batch_and_lr_scaling_run():
    sps = samples_per_s_by_batch(MLP(10, in_features=12, hidden=8), batch_sizes=(2, 8), image_shape=(12,), repeats=2)
    assert set(sps) == {2, 8} and all(v > 0 for v in sps.values())
    rounds = samples_per_s_rounds(MLP(10, in_features=12, hidden=8), (2, 8), rounds=3, image_shape=(12,), repeats=1)
    assert len(rounds) == 3 and all(set(r) == {2, 8} and min(r.values()) > 0 for r in rounds)   # one dict a round
    with pytest.raises(ValueError, match=r"^rounds must be an integer >= 1"):
        samples_per_s_rounds(MLP(10, in_features=12, hidden=8), (2,), rounds=0, image_shape=(12,))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    y = (x[:, 0] > 0).long()
    assert 0.0 <= lr_scaling_run(x, y, x, y, global_batch=16, lr=0.1, epochs=2) <= 1.0
    assert math.isnan(lr_scaling_run(x, y, x, y, global_batch=16, lr=1e30, epochs=2))      # diverged: NaN, not a score
