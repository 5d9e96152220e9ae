"""The load-balancing loss on a hand-worked example, the skewed router, the capacity sweep, and a short training
run in which the loss evens the load (the notebook's claim, on a smaller run)."""
from dataclasses import replace

import pytest
import torch

from labkit.parallel.experts import balance
from labkit.parallel.experts.moe import MoE, MoEConfig


def test_aux_loss_matches_a_hand_worked_example():
    # 2 tokens, 2 experts, k=1: both tokens to expert 0, f = (1, 0); P = mean probs = (0.7, 0.3)
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    expert = torch.tensor([[0], [0]])
    # alpha x E x sum f_i P_i = 0.01 x 2 x (1 x 0.7 + 0 x 0.3) = 0.014
    assert float(balance.aux_loss(probs, expert, 0.01)) == pytest.approx(0.014)
    uniform = torch.full((4, 4), 0.25)
    assert float(balance.aux_loss(uniform, torch.tensor([[0], [1], [2], [3]]), 0.01)) == pytest.approx(0.01)


def test_a_skewed_router_sends_most_tokens_to_its_expert():
    model = MoE(MoEConfig(), 0)
    x = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(0))
    even = balance.tokens_per_expert(model, x)
    balance.skew_router(model, 0, 3.0)
    skewed = balance.tokens_per_expert(model, x)
    assert int(skewed[0]) > int(even[0]) and balance.imbalance(skewed) > balance.imbalance(even)


def test_capacity_sweep_counts_equal_the_rule_and_fall_with_the_factor():
    rows = balance.capacity_sweep(MoEConfig(), (0.5, 1.0, 2.0, 4.0), tokens=64)
    assert all(r["dropped"] == r["rule"] for r in rows)
    drops = [r["dropped"] for r in rows]
    assert drops == sorted(drops, reverse=True) and drops[0] > 0 and drops[-1] == 0     # cf = E/k: capacity = T


def test_training_with_the_aux_loss_evens_the_load_and_without_it_does_not():
    task = balance.BalanceTask(steps=20, lr=2e-2, skew_bias=2.0, groups=2)
    without, with_aux = balance.train_balance(task, 0.0), balance.train_balance(task, 0.01)
    assert without["before"] == with_aux["before"]
    assert with_aux["imbalance_after"] < 0.75 * without["imbalance_after"]
    assert len(with_aux["losses"]) == 20


def test_task_refuses_a_bad_setting():
    with pytest.raises(ValueError):
        balance.BalanceTask(steps=0)
    with pytest.raises(ValueError):
        replace(balance.BalanceTask(), lr=0.0)
