"""Pitfall functions: broken and fixed variants give the evidence the notebook asserts on."""
import pytest
import torch

from labkit.core.models import MLP
from labkit.training.batch_size import scaled_lr
from labkit.parallel.pitfalls import (padded_eval_accuracy, rank0_extra_work, save_wrapped_model,
                                   shard_coverage, torch_uneven_last_batch)


def test_torch_uneven_last_batch():
    ev = torch_uneven_last_batch(num_examples=65, batch_size=8, world_size=2)
    assert ev.samples_per_rank == (33, 33) and ev.duplicated_samples == 1
    assert ev.last_batch_sizes == (1, 1) and "Expected more than 1 value" in ev.broken_error
    assert ev.fixed_last_batch_sizes == (8, 8) and ev.fixed_stats_finite
    assert ev.empty_batch_changes_stats is False


def test_save_wrapped_model():
    torch.manual_seed(0)   # on a GPU box DataParallel moves the model to cuda:0: the evidence must not mix devices
    ev = save_wrapped_model(MLP(10, in_features=12, hidden=8), torch.randn(3, 12), MLP(10, in_features=12, hidden=8))
    assert ev.wrapped_keys_sample[0].startswith("module.")
    assert "Missing key" in ev.broken_error and ev.fixed_max_abs_diff == 0.0
    assert "Weights only load failed" in ev.pickled_model_error


def test_padded_eval_accuracy_real_processes():
    ev = padded_eval_accuracy([0, 0] + [1] * 8, world_size=3)
    assert ev.padded_samples_seen == 12 and ev.padded_accuracy == pytest.approx(8 / 12)
    assert ev.fixed_samples_seen == 10 and ev.fixed_accuracy == pytest.approx(0.8)


def test_rank0_extra_work_times_out_then_fixed():
    broken = rank0_extra_work("broken", extra_work_s=4.5, pg_timeout_s=3.0)
    assert not broken.ok and broken.failed_rank == 1 and "Timed out" in broken.error
    fixed = rank0_extra_work("all_ranks", extra_work_s=1.0, pg_timeout_s=3.0)
    assert fixed.ok and fixed.all_reduce_result == [3.0] * 4
    with pytest.raises(ValueError, match="variant"):
        rank0_extra_work("sometimes")


def test_shard_coverage_and_lr_rules():
    assert shard_coverage(100, 4, False) == {"samples_read": 400, "distinct": 100, "per_rank": 100}
    assert shard_coverage(100, 4, True) == {"samples_read": 100, "distinct": 100, "per_rank": 25}
    assert scaled_lr(0.1, 256, base_batch=32) == pytest.approx(0.8)
    assert scaled_lr(0.1, 128, base_batch=32, rule="sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 256, base_batch=32, rule="none") == 0.1
    with pytest.raises(ValueError):
        scaled_lr(0.1, 256, base_batch=32, rule="cubic")


def test_more_ranks_than_samples_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 3, got 4; the dataset has 3 "
                                         r"samples, so each rank needs at least one; use fewer ranks$"):
        torch_uneven_last_batch(num_examples=3, batch_size=2, world_size=4)
    with pytest.raises(ValueError, match=r"^world_size must be an integer between 1 and 2, got 3; the evaluation "
                                         r"set has 2 samples"):
        padded_eval_accuracy([1, 0], world_size=3)
