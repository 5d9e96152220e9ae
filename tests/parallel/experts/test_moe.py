"""The one-process MoE: the capacity rule on hand-worked numbers, the queue that drops copies over it (first choices
first), pack/unpack as the gate-weighted sum, and groups routed apart."""
import math

import pytest
import torch

from labkit.parallel.experts.moe import MoE, MoEConfig, pack, predicted_dropped, route, unpack


def test_capacity_is_switch_s_rule_rounded_up():
    # ceil(1.25 x 10 x 2 / 8) = ceil(3.125) = 4 (a floor would give 3)
    assert MoEConfig(capacity_factor=1.25).capacity(10) == 4
    assert MoEConfig(experts=4, top_k=1, capacity_factor=1.0).capacity(8) == 2


def test_config_refuses_what_cannot_run():
    with pytest.raises(ValueError):
        MoEConfig(experts=2, top_k=3)
    with pytest.raises(ValueError):
        MoEConfig(capacity_factor=0)
    with pytest.raises(ValueError):
        MoEConfig(experts=6).experts_per_rank(4)
    assert [MoEConfig().expert_rank(e, 4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_first_choices_queue_before_second_choices_and_the_rest_are_dropped():
    # 3 tokens, 3 experts, k=2, capacity 2: every token's first choice is expert 0, second expert 1 or 2
    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 0.0, 1.0], [5.0, 1.0, 0.0]])
    r = route(logits, top_k=2, capacity=2)
    assert r.expert[:, 0].tolist() == [0, 0, 0]
    assert r.keep[:, 0].tolist() == [True, True, False]          # expert 0 full after two first choices
    assert r.keep[:, 1].tolist() == [True, True, True]           # expert 1 gets 2 (tokens 0, 2), expert 2 gets 1
    assert r.routed.tolist() == [3, 2, 1] and r.kept.tolist() == [2, 2, 1]
    assert r.dropped == predicted_dropped(r.routed, 2) == 1


def test_pack_sorts_kept_copies_by_expert_and_unpack_sums_gate_weighted_outputs():
    x = torch.arange(6.0).view(3, 2)
    logits = torch.tensor([[0.0, 3.0], [3.0, 0.0], [0.0, 3.0]])
    r = route(logits, top_k=1, capacity=5)
    rows, order, per_expert = pack(x, r)
    assert per_expert.tolist() == [1, 2] and rows.tolist() == [[2.0, 3.0], [0.0, 1.0], [4.0, 5.0]]
    y = unpack(rows, order, r, 3)
    assert torch.allclose(y, x * r.gate)                          # identity experts: each token times its gate


def test_groups_route_apart_and_the_layer_gives_gradients_everywhere():
    config = MoEConfig(capacity_factor=1.0)
    moe = MoE(config, seed=3)
    x = torch.randn(2, 16, config.hidden, requires_grad=True)
    y = moe(x)
    assert y.shape == x.shape and len(moe.routings) == 2
    single = MoE(config, seed=3)
    torch.testing.assert_close(single(x[1:2].detach())[0], y[1].detach())   # group 1 alone: the same tokens out
    y.pow(2).sum().backward()
    assert moe.router.weight.grad.abs().sum() > 0 and x.grad.abs().sum() > 0
    capacity = config.capacity(16)
    assert all(int(r.kept.max()) <= capacity for r in moe.routings)
    assert math.ceil(16 * 2 / 8) == capacity


def test_the_seed_fixes_the_weights_and_leaves_the_caller_s_generator_alone():
    torch.manual_seed(5)
    expected = torch.rand(1)
    torch.manual_seed(5)
    a, b = MoE(MoEConfig(), seed=1), MoE(MoEConfig(), seed=1)
    assert torch.equal(torch.rand(1), expected)
    assert torch.equal(a.router.weight, b.router.weight)
    assert not torch.equal(a.router.weight, MoE(MoEConfig(), seed=2).router.weight)
