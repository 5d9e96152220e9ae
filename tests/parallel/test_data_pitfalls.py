"""Data pitfalls on the PyTorch side: broken and fixed variants give the evidence notebook 09 asserts on."""
import pytest

from labkit.parallel.data_pitfalls import padded_eval_accuracy, shard_coverage, torch_uneven_last_batch


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
