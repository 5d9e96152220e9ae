import torch

from labkit.checkpoint.trainer import (CheckpointConfig, global_batch, parameter_count, predicted_state_bytes,
                                       state_differences)


def test_config_refuses_nonsense_and_presets_divide_by_four():
    import pytest
    with pytest.raises(ValueError):
        CheckpointConfig(hidden=0)
    for cfg in (CheckpointConfig.fast(), CheckpointConfig.smoke()):
        assert cfg.hidden % 4 == 0 and cfg.global_batch % 12 == 0


def test_predicted_bytes_are_params_and_two_moments_in_float64_divided_by_ranks():
    cfg = CheckpointConfig(in_features=4, hidden=8, classes=2)
    assert parameter_count(cfg) == 4 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2
    assert predicted_state_bytes(cfg) == parameter_count(cfg) * 3 * 8
    assert predicted_state_bytes(cfg, 4) == predicted_state_bytes(cfg) / 4


def test_the_global_batch_depends_on_the_step_only():
    cfg = CheckpointConfig.smoke()
    a, b = global_batch(cfg, 3), global_batch(cfg, 3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(global_batch(cfg, 4)[0], a[0])


def test_state_differences_finds_one_changed_element_and_a_missing_key():
    a = {"model": {"w": torch.zeros(3)}, "optim": {"state": {"w": {"step": torch.tensor(1.0)}}}}
    b = {"model": {"w": torch.zeros(3)}, "optim": {"state": {"w": {"step": torch.tensor(1.0)}}}}
    assert state_differences(a, b) == []
    b["model"]["w"][1] = 1e-30
    assert state_differences(a, b) == ["model.w"]
    b["model"]["v"] = torch.zeros(1)
    assert "model.v: only in one" in state_differences(a, b)
