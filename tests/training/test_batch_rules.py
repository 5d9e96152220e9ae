"""Batch-size rules: linear LR scaling (Goyal et al. 2017) and each replica's share of the global batch."""
import pytest

from labkit.training.batch_rules import per_replica_batch, scaled_lr


def test_lr_scaling():
    assert scaled_lr(0.1, 256, 32) == pytest.approx(0.8)


def test_per_replica_batch_rule_of_thumb():
    assert per_replica_batch(256, 8) == 32
    with pytest.raises(ValueError, match="not a multiple of replicas=3"):
        per_replica_batch(256, 3)
    with pytest.raises(ValueError, match="8 per GPU, below 16"):
        per_replica_batch(64, 8)
