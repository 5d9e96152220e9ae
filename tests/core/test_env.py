import pytest
import torch

from labkit.core import env


def test_mode_automatic_fast_without_gpu():
    mode = env.get_mode(environ={}, cuda_available=False)
    assert mode.fast and mode.name == "fast" and "no CUDA GPU" in mode.reason


def test_mode_automatic_full_with_gpu():
    mode = env.get_mode(environ={}, cuda_available=True)
    assert not mode.fast and mode.name == "full"


@pytest.mark.parametrize("value, expected, gpu", [("fast", "fast", True), ("FULL", "full", False), (" full ", "full", False)])
def test_mode_forced_by_env_both_ways(value, expected, gpu):
    mode = env.get_mode(environ={env.MODE_ENV_VAR: value}, cuda_available=gpu)
    assert mode.name == expected and env.MODE_ENV_VAR in mode.reason


def test_mode_bad_env_value_is_clear():
    with pytest.raises(ValueError, match="LABKIT_MODE must be one of"):
        env.get_mode(environ={env.MODE_ENV_VAR: "turbo"})


def test_pick_follows_mode():
    assert env.pick(1, 100, env.Mode("fast", "test")) == 1
    assert env.pick(1, 100, env.Mode("full", "test")) == 100


def test_mode_rejects_unknown_name():
    with pytest.raises(ValueError):
        env.Mode("medium", "x")


def test_seed_everything_reproducible():
    env.seed_everything(3)
    a = torch.rand(4)
    env.seed_everything(3)
    assert torch.equal(a, torch.rand(4))


def test_deterministic_kernels_hold_for_the_block_then_restore():
    import torch

    from labkit.core.env import deterministic_kernels

    cudnn = torch.backends.cudnn
    before = cudnn.deterministic, cudnn.benchmark
    cudnn.benchmark = True
    try:
        with deterministic_kernels():
            assert cudnn.deterministic is True and cudnn.benchmark is False
        assert cudnn.benchmark is True and cudnn.deterministic == before[0]
        with pytest.raises(RuntimeError):
            with deterministic_kernels():
                raise RuntimeError("a run that fails")
        assert cudnn.benchmark is True                 # restored after an error too
    finally:
        cudnn.deterministic, cudnn.benchmark = before
