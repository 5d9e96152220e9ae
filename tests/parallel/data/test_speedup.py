"""The speedup explorer's maths: the model's numbers by hand, the curve, the measured compute rate."""
from dataclasses import replace
from functools import partial

import pytest

from labkit.parallel.data import speedup as sp
from labkit.parallel.data.costmodel import predicted_speedup, sync_time_s
from labkit.parallel.data.scaling import ScalingPoint

Settings = partial(sp.ExplorerSettings, device_flops_per_s=20e12)   # a fixed rate: these tests check the maths


def test_explore_matches_the_model_by_hand():
    s = sp.ExplorerSettings(world_size=4, batch=32, model_params_m=10.0, latency_us=20.0, bandwidth_gb_s=5.0,
                            device_flops_per_s=1e12, n_samples=64_000)
    r = sp.explore(s)
    t_comp = 6 * 10e6 * 32 / 1e12
    t_sync = sync_time_s(40_000_000, 4, 20e-6, 5e9)
    assert r.t_comp_s == pytest.approx(t_comp) and r.t_sync_s == pytest.approx(t_sync)
    assert r.epoch_time_alone_s == pytest.approx(64_000 / 32 * t_comp)
    assert r.epoch_time_s == pytest.approx(64_000 / 128 * (t_comp + t_sync))
    assert r.speedup == pytest.approx(predicted_speedup(t_comp, t_sync, 4))
    assert r.efficiency == pytest.approx(r.speedup / 4)
    assert r.pays == (t_sync < 3 * t_comp)


def test_more_bandwidth_never_hurts_and_slow_links_do_not_pay():
    fast = sp.explore(Settings(bandwidth_gb_s=100.0))
    slow = sp.explore(Settings(bandwidth_gb_s=0.01, world_size=2))
    assert fast.speedup > sp.explore(Settings(bandwidth_gb_s=1.0)).speedup
    assert not slow.pays and slow.speedup < 1


def test_curve_and_settings_validation():
    curve = sp.speedup_curve(Settings(), [1, 2, 4])
    assert curve[0] == 1.0 and len(curve) == 3
    with pytest.raises(ValueError, match="world_size"):
        sp.ExplorerSettings(world_size=0)
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        sp.ExplorerSettings(bandwidth_gb_s=0)


def test_measured_overlay_text():
    pts = [ScalingPoint(1, 0.01, 0.0, 0.0, 1.0, 1.0, 1.0), ScalingPoint(2, 0.01, 0.002, 0.003, 1.0, 1.6, 1.5)]
    text = sp.measured_overlay_text(pts)
    assert "R=2" in text and "+7%" in text and "R=1" not in text


def test_compute_rate_is_measured_on_the_device():
    from labkit.training.flops import measured_matmul_flops_per_s

    flops, note = measured_matmul_flops_per_s("cpu", size=128, repeats=3)
    assert 1e7 < flops < 1e14 and "measured" in note and "CPU" in note
    settings = sp.ExplorerSettings(device_flops_per_s=flops)
    assert sp.explore(settings).t_comp_s == pytest.approx(6.0 * 25e6 * 256 / flops)


def test_rate_must_be_given_or_measured():
    with pytest.raises(ValueError, match=r"^device_flops_per_s is unset: pass this device's sustained rate"):
        sp.explore(sp.ExplorerSettings())
    with pytest.raises(ValueError, match="device_flops_per_s"):
        sp.ExplorerSettings(device_flops_per_s=0)


def test_settings_counts_must_be_integers():
    with pytest.raises(ValueError, match=r"^batch must be an integer >= 1, got 2.0 \(float\)"):
        sp.ExplorerSettings(batch=2.0)
    with pytest.raises(ValueError, match=r"^latency_us must be >= 0"):
        sp.ExplorerSettings(latency_us=-1.0)
    assert sp.explore(Settings(latency_us=0.0)).t_sync_s > 0      # an ideal link still moves bytes


def test_a_second_link_tier_prices_the_all_reduce_across_nodes():
    """8 replicas on 2 nodes of 4: T_sync is the two-tier cost; the node link decides it once it is slow."""
    from labkit.comm.two_tier import Link, two_tier_cost_s

    base = sp.ExplorerSettings(world_size=8, model_params_m=25.0, device_flops_per_s=20e12, latency_us=5.0,
                               bandwidth_gb_s=100.0, ranks_per_node=4, inter_latency_us=20.0,
                               inter_bandwidth_gb_s=1.0, algorithm="flat")
    nbytes = int(25e6 * 4)
    by_hand = two_tier_cost_s("flat", 8, 4, nbytes, Link(5e-6, 1 / 100e9), Link(20e-6, 1 / 1e9))
    assert sp.explore(base).t_sync_s == pytest.approx(by_hand)
    two_level = sp.explore(replace(base, algorithm="hierarchical"))
    assert two_level.t_sync_s < sp.explore(base).t_sync_s            # a slow node link: send less across it
    one_node = sp.explore(replace(base, ranks_per_node=8))           # every replica inside one node
    assert one_node.t_sync_s == pytest.approx(sync_time_s(nbytes, 8, 5e-6, 100e9))
    assert one_node.speedup > sp.explore(base).speedup
    assert "2 node(s) of 4" in sp.readout_text(base, sp.explore(base))


def test_two_tiers_take_only_the_two_tier_algorithms():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        sp.ExplorerSettings(device_flops_per_s=1e12, ranks_per_node=4, algorithm="tree")
    with pytest.raises(ValueError, match="inter_latency_us"):
        sp.ExplorerSettings(device_flops_per_s=1e12, ranks_per_node=4, algorithm="flat", inter_latency_us=-1.0)
