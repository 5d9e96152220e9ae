"""The ladder's configuration: the budget in optimizer steps and one clear error per bad setting."""
import pytest

from labkit.ladder.config import LadderConfig, budget_samples


def test_budget_gives_the_largest_batch_enough_optimizer_steps():
    """The H100 run gave batch 512 six steps (chance accuracy): the budget now guarantees min_optimizer_steps."""
    cfg = LadderConfig.full()
    assert budget_samples(cfg, 1438) == 30 * 512                    # digits: raised from 2 epochs (2876)
    assert budget_samples(cfg, 10_000) == 20_000                    # CIFAR-10 subset: 2 epochs already give 39
    assert budget_samples(LadderConfig.fast(), 1024) == 3 * 1024
    assert budget_samples(cfg, 100) == 30 * 64                      # only candidates the data allows count
    assert budget_samples(cfg, 1438, world_size=8) == 30 * 512 * 8  # the DDP rung's global batch learns too

@pytest.mark.parametrize("kwargs, match", [
    ({"model": "vgg"}, "model must be one of"),
    ({"budget_epochs": 0}, "budget_epochs must be an integer >= 1, got 0"),
    ({"min_optimizer_steps": 0}, "min_optimizer_steps must be an integer >= 1"),
    ({"batch_candidates": ()}, "batch_candidates"),
    ({"batch_candidates": (8, 0)}, "each value in batch_candidates must be an integer >= 1, got 0"),
    ({"skip": ("naive",)}, "rung 0 is the baseline"),
    ({"skip": ("warp_drive",)}, "skip may name"),
    ({"lr": -1.0}, "lr must be a number > 0, got -1.0"),
    ({"ddp_timeout_s": 0}, "ddp_timeout_s must be a number > 0, got 0; seconds"),
    ({"min_gain": 1.5}, "min_gain"),
    ({"num_workers": -1}, "num_workers must be an integer >= 0"),
    ({"ddp_world_size": 0}, "ddp_world_size must be an integer >= 1"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LadderConfig(**kwargs)
