"""Sharding factors, ZeRO's formulas and the per-rank storage count (no processes needed)."""
import pytest
import torch
from torch import nn

from labkit.memory.model import MemoryModel
from labkit.sharding.memory import (STRATEGIES, count_rank_state_bytes, predict_per_rank, sharding_factors,
                                    zero_paper_bytes)


def test_zero_paper_figure_1():
    """ZeRO Figure 1: Psi = 7.5 B, N_d = 64, K = 12 -> 120, 31.4, 16.6, 1.9 GB per GPU."""
    gb = {s: zero_paper_bytes(7_500_000_000, s, 64) / 1e9 for s in STRATEGIES}
    assert gb["ddp"] == pytest.approx(120.0)
    assert gb["zero1"] == pytest.approx(31.4, abs=0.05)
    assert gb["zero2"] == pytest.approx(16.6, abs=0.05)
    assert gb["zero3"] == pytest.approx(1.9, abs=0.05)


def test_factors_by_stage():
    assert sharding_factors("ddp", 4) == sharding_factors("ddp", 1)
    z1, z2, z3 = (sharding_factors(s, 4) for s in ("zero1", "zero2", "zero3"))
    assert (z1.params, z1.grads, z1.optimizer) == (1.0, 1.0, 0.25)
    assert (z2.params, z2.grads, z2.optimizer) == (1.25, 0.25, 0.25)      # FSDP2 keeps its shard too
    assert sharding_factors("zero2", 4, fsdp_keeps_shard=False).params == 1.0
    assert (z3.params, z3.grads, z3.optimizer) == (0.25, 0.25, 0.25)


@pytest.mark.parametrize("bad", ["zero4", "", "fsdp"])
def test_unknown_strategy_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="strategy must be one of ddp, zero1, zero2, zero3"):
        sharding_factors(bad, 2)


def test_world_size_validated():
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got 0"):
        sharding_factors("zero1", 0)


def test_predict_per_rank_scales_state_not_activations():
    mm = MemoryModel(param_bytes=4000, param_elements=1000, optimizer="adam", activation_bytes_per_sample=100.0,
                     activation_fixed_bytes=0.0)
    ddp, z3 = predict_per_rank(mm, 8, "ddp", 4), predict_per_rank(mm, 8, "zero3", 4)
    assert (ddp.params_bytes, ddp.grads_bytes, ddp.optimizer_bytes) == (4000, 4000, 8000)
    assert (z3.params_bytes, z3.grads_bytes, z3.optimizer_bytes) == (1000, 1000, 2000)
    assert z3.activations_bytes == ddp.activations_bytes == 800


def test_predict_keeps_the_model_dtype():
    mm = MemoryModel(param_bytes=8000, param_elements=1000, optimizer="adam", activation_bytes_per_sample=0.0,
                     activation_fixed_bytes=0.0)                     # float64 parameters
    assert predict_per_rank(mm, 1, "zero1", 2).optimizer_bytes == 8000


def test_count_dedups_storages_and_views():
    model = nn.Linear(10, 4)                               # 40 + 4 floats
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    counted = count_rank_state_bytes(model.parameters(), opt)
    assert counted["params"] == counted["grads"] == 44 * 4
    assert 2 * 44 * 4 <= counted["optimizer"] <= 2 * 44 * 4 + 2 * 8    # exp_avg, exp_avg_sq + step scalars
    flat = torch.zeros(44)
    views = [flat[:40].view(4, 10), flat[40:]]
    assert count_rank_state_bytes(views)["params"] == 44 * 4          # two views of one buffer: counted once
    assert count_rank_state_bytes(views, extra_params=[flat[10:20]])["total"] == 44 * 4
