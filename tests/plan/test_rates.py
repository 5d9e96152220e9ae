"""Per-shape GEMM rates: wave quantization, the memory roof, the cited large-GEMM rate, and no derating where a
device gives no SMs or bandwidth (the self-score's measured CPU)."""
import pytest

from labkit.plan.rates import (DeviceSpec, elementwise_s, gemm_s, layer_forward_s, mamf_efficiency, memory_bandwidth,
                               sm_count, wave_utilisation)

A100 = DeviceSpec.from_table("NVIDIA A100 SXM", 80)


def test_listed_gpus_get_their_cited_rate_sms_and_bandwidth_and_others_the_old_default():
    assert A100.efficiency == pytest.approx(271.2 / 312) and A100.sms == 108 and A100.memory_bytes_per_s == 2039e9
    assert "Maximum Achievable Matmul FLOPS" in mamf_efficiency("NVIDIA A100 SXM")[1]
    l4 = DeviceSpec.from_table("NVIDIA L4", 24)
    assert (l4.efficiency, l4.sms, l4.memory_bytes_per_s) == (0.4, 0, 0.0)
    assert DeviceSpec.from_table("NVIDIA A100 SXM", 80, efficiency=0.5).efficiency == 0.5   # a measured rate wins
    assert sm_count("NVIDIA H200") == 132 and memory_bandwidth("NVIDIA A100 SXM", 40) == 1555e9


def test_one_tile_too_many_costs_a_whole_wave():
    """108 tiles of 256 x 128 fill the A100's 108 SMs once; one more tile takes a second wave (rival: no
    quantization, 1.0 both times)."""
    assert wave_utilisation(256 * 108, 128, 1, 108) == pytest.approx(1.0)
    assert wave_utilisation(256 * 108 + 1, 128, 1, 108) < 0.7      # best tile 128 x 128: 217 tiles, 3 waves
    assert wave_utilisation(7, 9, 1, 0) == 1.0              # no SM count: not derated


def test_a_thin_gemm_is_memory_bound_and_a_large_one_runs_at_the_large_gemm_rate():
    peak, eff, sms, bw = A100.peak_flops_per_s, A100.efficiency, A100.sms, A100.memory_bytes_per_s
    thin = gemm_s(16384, 16384, 16, peak, eff, sms, bw)                          # K = 16: writing C dominates
    assert thin == pytest.approx(2 * (16384 * 16 * 2 + 16384 * 16384) / bw)      # bytes over bandwidth
    big = gemm_s(256 * 108, 128 * 64, 8192, peak, eff, sms, bw)
    assert big == pytest.approx(2 * 256 * 108 * 128 * 64 * 8192 / (peak * eff))


def test_splitting_a_layer_finer_lowers_its_rate():
    """The issue's fault: a tp or cp split cost nothing. A 2304-wide layer split 8 ways runs its GEMMs slower per
    FLOP than unsplit (rival: the same rate)."""
    args = (A100.peak_flops_per_s, A100.efficiency, A100.sms, A100.memory_bytes_per_s)
    whole = layer_forward_s(2304, 24, 24, 4 * 2304, False, 2048, 2048, 1, 1, 1, *args)[0]
    split = layer_forward_s(2304, 24, 24, 4 * 2304, False, 2048, 2048, 1, 8, 1, *args)[0]
    assert split * 8 > 1.1 * whole


def test_element_wise_work_is_three_passes_of_the_kept_bytes_four_recomputed():
    assert elementwise_s(1e9, 2e12, False) == pytest.approx(1.5e-3)
    assert elementwise_s(1e9, 2e12, True) == pytest.approx(2e-3)
    assert elementwise_s(1e9, 0.0, True) == 0.0
