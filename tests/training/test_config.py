"""The training config: exactly one length, counts through the one validator, and the run it trains (a RunSpec,
whose facts are checked there and nowhere else)."""
import pytest

from labkit.training.config import DEFAULT_RUN, TrainConfig
from labkit.training.run_spec import RunSpec


def test_config_validation():
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig()
    with pytest.raises(ValueError, match="exactly one of steps"):
        TrainConfig(steps=3, epochs=1)
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        TrainConfig(steps=0)
    assert TrainConfig.fast().steps == 10


def test_the_run_is_one_runspec_not_a_second_copy_of_its_fields():
    """The optimizer, lr, precision ... are the run's: a config neither repeats nor re-checks them."""
    for field in ("lr", "momentum", "weight_decay", "optimizer", "precision", "channels_last", "compile",
                  "lr_warmup_steps", "seed"):
        with pytest.raises(TypeError, match="unexpected keyword"):
            TrainConfig(steps=3, **{field: 0})
    with pytest.raises(ValueError, match="run must be a labkit RunSpec"):
        TrainConfig(steps=3, run={"lr": 0.1})
    assert TrainConfig(steps=3).spec is DEFAULT_RUN == RunSpec()
    run = RunSpec(lr=0.2, precision="bfloat16")
    assert TrainConfig(steps=3, run=run).spec is run


def test_config_counts_use_the_one_validator():
    with pytest.raises(ValueError, match="epochs must be an integer or None >= 1, got 2.0"):
        TrainConfig(epochs=2.0)
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0, got -1"):
        TrainConfig(steps=3, warmup_steps=-1)
    with pytest.raises(ValueError, match="log_every must be an integer >= 1, got True"):
        TrainConfig(steps=3, log_every=True)
