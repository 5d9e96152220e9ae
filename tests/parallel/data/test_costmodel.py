"""The data-parallel performance model: hand-worked numbers, the break-even point, the alpha-beta fit."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.comm.collectives import allreduce_cost
from labkit.parallel.data import costmodel as cm


def test_epoch_time_hand_numbers():
    assert cm.epoch_time_s(1000, 10, 0.5) == pytest.approx(50.0)                      # (N/B) T_comp
    assert cm.epoch_time_s(1000, 10, 0.5, 0.1, world_size=4) == pytest.approx(15.0)      # N/(RB) (T_comp+T_sync)


def test_break_even_is_exactly_one():
    assert cm.predicted_speedup(1.0, 3.0, 4) == pytest.approx(1.0)
    assert not cm.pays_off(1.0, 3.0, 4)
    assert cm.pays_off(1.0, 2.9, 4)


@settings(max_examples=50, deadline=None)
@given(t_comp=st.floats(1e-4, 1.0), t_sync=st.floats(0, 2.0), r=st.integers(2, 64))
def test_pays_off_iff_speedup_above_one(t_comp, t_sync, r):
    speedup = cm.predicted_speedup(t_comp, t_sync, r)
    if not math.isclose(speedup, 1.0, rel_tol=1e-9):
        assert cm.pays_off(t_comp, t_sync, r) == (speedup > 1.0)
    assert cm.epoch_time_s(10_000, 8, t_comp) / cm.epoch_time_s(10_000, 8, t_comp, t_sync, r) == pytest.approx(speedup)


def test_sync_time_is_the_ring_cost():
    assert cm.sync_time_s(4_000_000, 8, 5e-6, 1e10) == pytest.approx(allreduce_cost("ring", 8, 4_000_000, 5e-6, 1e-10))
    with pytest.raises(ValueError, match="bandwidth"):
        cm.sync_time_s(10, 2, 0.0, 0.0)


def test_core_sharing():
    assert cm.core_sharing_slowdown(2, 2) == 1.0
    assert cm.core_sharing_slowdown(4, 2) == 2.0
    with pytest.raises(ValueError, match="cores"):
        cm.core_sharing_slowdown(2, 0)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_fit_alpha_beta_recovers_the_model(world_size):
    sizes = [4, 4096, 1 << 20, 1 << 22]
    times = [allreduce_cost("ring", world_size, n, 3e-5, 2e-9) for n in sizes]
    alpha, beta = cm.fit_alpha_beta(sizes, times, world_size)
    assert alpha == pytest.approx(3e-5, rel=1e-6) and beta == pytest.approx(2e-9, rel=1e-6)


def test_counts_and_times_go_through_the_validator():
    with pytest.raises(ValueError, match=r"^batch must be an integer >= 1, got 0$"):
        cm.epoch_time_s(1000, 0, 0.5)
    with pytest.raises(ValueError, match=r"^t_comp_s must be a number > 0, got 0"):
        cm.epoch_time_s(1000, 10, 0)
    with pytest.raises(ValueError, match=r"^t_sync_s must be a number >= 0, got -0.1"):
        cm.epoch_time_s(1000, 10, 0.5, -0.1, world_size=2)
    with pytest.raises(ValueError, match=r"^world_size must be an integer >= 1, got 2.0 \(float\)"):
        cm.predicted_speedup(1.0, 0.1, 2.0)
