"""B_simple from two gradient norms: the estimator is exact on expectations, the one-process measurement matches a
hand computation of the true |G|^2 and tr(Sigma) on a tiny problem, and real gloo ranks give the same answer."""
import math

import pytest
import torch
from torch import nn

from labkit.training.noise_scale import (dp_noise_scale, gradient_sq_norm, measure_two_batch,
                                         noise_scale_from_norms, two_norm_estimate)


def test_two_norm_estimate_inverts_the_expected_norms():
    grad_sq, trace = 0.3, 12.0
    small, big = grad_sq + trace / 4, grad_sq + trace / 64
    assert two_norm_estimate(small, big, 4, 64) == pytest.approx((grad_sq, trace))


def test_bad_batch_sizes_get_one_clear_error():
    with pytest.raises(ValueError, match="b_small < b_big"):
        two_norm_estimate(1.0, 0.5, 8, 8)
    with pytest.raises(ValueError, match="two or more"):
        noise_scale_from_norms([1.0], [0.5], 4, 8)


def test_ratio_of_means_and_its_error_shrinks_with_pairs():
    gen = torch.Generator().manual_seed(0)
    def draws(n):
        noise = 1 + 0.1 * torch.randn(2, n, generator=gen)
        return ((0.5 + 20 / 8) * noise[0]).tolist(), ((0.5 + 20 / 128) * noise[1]).tolist()
    few, many = noise_scale_from_norms(*draws(10), 8, 128), noise_scale_from_norms(*draws(1000), 8, 128)
    assert many.b_simple == pytest.approx(40, rel=0.1)
    assert many.stderr < few.stderr and many.relative_error < 0.1
    assert "B_simple" in str(many)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.w(x)


class _Data:
    def __init__(self, n=40):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _true_noise_scale(model, data):
    """Per-sample gradients by hand: |G|^2 of their mean and tr(Sigma) = mean |g_i - G|^2 (population)."""
    grads = []
    for i in range(len(data)):
        model.zero_grad()
        nn.functional.cross_entropy(model(data.x[i:i + 1]), data.y[i:i + 1]).backward()
        grads.append(model.w.weight.grad.flatten().clone())
    g = torch.stack(grads)
    mean = g.mean(0)
    return float(((g - mean) ** 2).sum(1).mean() / mean.pow(2).sum())


def test_one_process_measurement_converges_to_the_exact_noise_scale():
    torch.manual_seed(0)
    model, data = _Tiny(), _Data()
    exact = _true_noise_scale(model, data)
    est = measure_two_batch(model, data, 2, 16, pairs=400, seed=3)
    assert abs(est.b_simple - exact) < 3 * est.stderr + 0.05 * exact


def test_gradient_sq_norm_uses_the_mean_loss_and_leaves_no_gradient():
    model, data = _Tiny(), _Data()
    model.zero_grad()
    nn.functional.cross_entropy(model(data.x), data.y).backward()
    want = float(model.w.weight.grad.pow(2).sum())
    model.zero_grad(set_to_none=True)
    assert gradient_sq_norm(model, data.x, data.y) == pytest.approx(want)
    assert model.w.weight.grad is None


def _tiny():
    torch.manual_seed(0)
    return _Tiny()


def test_real_gloo_ranks_agree_with_one_process_at_the_same_weights():
    model, data = _tiny(), _Data()
    dp = dp_noise_scale(_tiny, model.state_dict(), data, 4, world_size=2, pairs=60, timeout_s=90)
    one = measure_two_batch(model, data, 4, 8, pairs=60, seed=5)
    assert dp.source == "2 gloo ranks" and dp.b_small == 4 and dp.b_big == 8
    assert abs(dp.b_simple - one.b_simple) < 4 * math.hypot(dp.stderr, one.stderr)
    with pytest.raises(ValueError, match="world_size"):
        dp_noise_scale(_tiny, model.state_dict(), data, 4, world_size=1)


def test_pooled_estimates_weigh_by_inverse_variance():
    from labkit.training.noise_scale import NoiseScale, pooled
    a, b = NoiseScale(10, 1, 1, 10, 5, 8, 64), NoiseScale(40, 4, 1, 40, 5, 8, 64)   # both 10% relative error
    both = pooled([a, b])
    assert both.b_simple == pytest.approx(20)                                        # the geometric mean
    assert both.stderr == pytest.approx(20 * 0.1 / math.sqrt(2)) and both.pairs == 10
    with pytest.raises(ValueError, match="pool"):
        pooled([NoiseScale(1, 0, 1, 1, 2, 8, 64)])
