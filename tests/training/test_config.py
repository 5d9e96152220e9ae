"""The training config: exactly one length, known optimizers and dtypes, counts through the one validator."""
import pytest

from labkit.training.config import TrainConfig


def test_config_validation():
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig()
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig(steps=3, epochs=1)
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(steps=3, optimizer="lamb")
    with pytest.raises(ValueError, match="amp_dtype"):
        TrainConfig(steps=3, amp_dtype="fp8")
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(steps=3, lr=0)
    assert TrainConfig.fast().steps == 10


def test_config_counts_use_the_one_validator():
    with pytest.raises(ValueError, match="epochs must be an integer or None >= 1, got 2.0"):
        TrainConfig(epochs=2.0)
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0, got -1"):
        TrainConfig(steps=3, warmup_steps=-1)
    with pytest.raises(ValueError, match="log_every must be an integer >= 1, got True"):
        TrainConfig(steps=3, log_every=True)
    with pytest.raises(ValueError, match="lr must be a number > 0, got -0.1"):
        TrainConfig(steps=3, lr=-0.1)
