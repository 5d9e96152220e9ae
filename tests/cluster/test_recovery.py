"""Checkpoints of the failure lesson: written atomically, loaded with weights_only=True, resume exactly."""
from __future__ import annotations

import torch
from torch import nn

from labkit.cluster.recovery import CHECKPOINT, load_checkpoint, save_checkpoint


def _model_and_opt(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
    opt.zero_grad()
    model(torch.full((3, 4), float(k))).pow(2).sum().backward()
    opt.step()


def test_resuming_from_a_checkpoint_gives_the_uninterrupted_weights(tmp_path):
    straight, straight_opt = _model_and_opt(0)
    for k in range(6):
        _step(straight, straight_opt, k)
    first, first_opt = _model_and_opt(0)
    for k in range(3):
        _step(first, first_opt, k)
    save_checkpoint(tmp_path, first, first_opt, 3)
    assert (tmp_path / CHECKPOINT).exists() and not list(tmp_path.glob("*.tmp"))
    resumed, resumed_opt = _model_and_opt(1)                # different start: the checkpoint must win
    start = load_checkpoint(tmp_path, resumed, resumed_opt)
    assert start == 3
    for k in range(start, 6):
        _step(resumed, resumed_opt, k)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)                            # momentum restored too: bit-identical


def test_no_checkpoint_means_step_zero(tmp_path):
    model, opt = _model_and_opt(0)
    assert load_checkpoint(tmp_path, model, opt) == 0
