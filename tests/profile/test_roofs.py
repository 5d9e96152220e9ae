"""Tests for labkit.profile.roofs: the roofs measured on this CPU, the sweep's plateau rule, datasheet lookups."""
from __future__ import annotations

import types
from unittest import mock

import pytest
import torch

from labkit.profile import roofs as roofs_mod
from labkit.profile.roofs import (RoofConfig, measure_bandwidth_roofs, measure_compute_roof,
                                  measure_roofs, supported_matmul_dtypes, sweep_matmul)
from labkit.training.flops import fp32_math, peak_memory_bytes_per_s

TINY = RoofConfig(min_matmul_n=64, max_matmul_n=256, bandwidth_bytes=4 * 2**20, repeats=3, cache_bytes=2**16)


def test_measured_roofs_on_this_cpu_are_positive_and_say_there_is_no_datasheet():
    roofs = measure_roofs("cpu", TINY, modes=["fp32"])
    fp32 = roofs.compute["fp32"]
    assert fp32.median > 1e8 and len(fp32.rounds) == 3 and fp32.datasheet is None and "CPU" in fp32.source
    assert set(roofs.bandwidth) == {"copy", "triad", "copy in cache", "triad in cache"}
    assert all(r.median > 1e8 for r in roofs.bandwidth.values())
    assert roofs.bandwidth["triad"].size == 4 * 2**20 and roofs.bandwidth["triad in cache"].size == 2**16
    assert 0 < roofs.ridge_flops_per_byte() < 1e4


def test_bandwidth_counts_stream_bytes():
    """copy moves 2 arrays, triad 3: with a fake clock of 1 s per call the rates are exactly that many bytes."""
    fake = mock.Mock(times_s=[1.0, 1.0, 1.0])
    with mock.patch.object(roofs_mod, "time_fn", return_value=fake):
        bw = measure_bandwidth_roofs("cpu", TINY)
    assert bw["copy"].median == 2 * TINY.bandwidth_bytes and bw["triad"].median == 3 * TINY.bandwidth_bytes
    assert bw["triad in cache"].median == 3 * TINY.cache_bytes


def test_sweep_stops_at_the_plateau_not_at_one_noisy_dip():
    rates = {64: [1.0], 128: [4.0], 256: [2.0], 512: [9.0], 1024: [9.5], 2048: [9.6], 4096: [20.0]}
    with mock.patch.object(roofs_mod, "matmul_rates", side_effect=lambda n, *a, **k: rates[n]):
        best, swept = sweep_matmul("fp32", torch.device("cpu"), RoofConfig(64, 4096, 2**20, 3))
    # 256 dipped (one flat size), 512 beat the best again, then 1024 and 2048 gained < 10%: stop before 4096
    assert [n for n, _ in swept] == [64, 128, 256, 512, 1024, 2048] and best == 2048


def test_compute_roof_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        measure_compute_roof("fp8", "cpu", TINY)


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_matmul_n"):
        RoofConfig(min_matmul_n=512, max_matmul_n=256)
    assert RoofConfig.full().max_matmul_n > RoofConfig.fast().max_matmul_n


def test_the_roofs_use_the_kits_one_tf32_switch_and_restore_it():
    before = torch.backends.cuda.matmul.fp32_precision
    with fp32_math(True):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before


def test_gpu_dtypes_by_compute_capability_with_mocks():
    with mock.patch.object(roofs_mod, "get_device", return_value=torch.device("cuda", 0)), \
            mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)):
        assert supported_matmul_dtypes("cuda") == ["fp32", "tf32", "bf16", "fp16"]
    with mock.patch.object(roofs_mod, "get_device", return_value=torch.device("cuda", 0)), \
            mock.patch("torch.cuda.get_device_capability", return_value=(7, 0)):
        assert supported_matmul_dtypes("cuda") == ["fp32", "fp16"]
    assert supported_matmul_dtypes("cpu")[0] == "fp32"


def test_datasheet_bandwidth_only_where_traced():
    bw, source = peak_memory_bytes_per_s("NVIDIA H100 PCIe")
    assert bw == 2000e9 and "PB-11133-001" in source
    bw, why = peak_memory_bytes_per_s("NVIDIA H100 80GB HBM3")
    assert bw is None and "no memory bandwidth traced" in why
    assert peak_memory_bytes_per_s("Some Unknown GPU")[0] is None


def _bandwidths(copy: tuple[float, ...], triad: tuple[float, ...]):
    from labkit.profile.roofline import RoofMeasurement, Roofs
    fp32 = RoofMeasurement("matmul fp32", "FLOP/s", (1e11,), 1024)
    return Roofs("cpu", {"fp32": fp32}, {"copy": RoofMeasurement("copy", "B/s", copy, 2**20),
                             "triad": RoofMeasurement("triad", "B/s", triad, 2**20)})


def test_copy_and_triad_are_compared_round_by_round_and_judged_with_the_load():
    quiet = types.SimpleNamespace(share=1.0, gpu_neighbours={})     # a meter that saw a whole core, no neighbour
    same = _bandwidths((10e9, 5e9, 10e9), (11e9, 5.5e9, 12e9))          # a slow round slowed both alike
    assert roofs_mod.copy_triad_agreement("one memory", same, quiet).state == "checked"
    apart = _bandwidths((10e9, 10e9, 10e9), (31e9, 30e9, 32e9))        # 3x apart in every round, quiet: failed
    assert roofs_mod.copy_triad_agreement("one memory", apart, quiet).state == "failed"
    one_close = _bandwidths((10e9, 10e9, 10e9), (31e9, 30e9, 12e9))    # one round agreed: the rounds cannot settle it
    assert roofs_mod.copy_triad_agreement("one memory", one_close, quiet).state == "INCONCLUSIVE"


def test_stream_rounds_are_interleaved_one_copy_and_one_triad_per_round():
    order = []
    real = roofs_mod.time_fn

    def spy(fn, **kw):
        order.append(fn)
        return real(fn, **kw)

    with mock.patch.object(roofs_mod, "time_fn", spy):
        roofs = roofs_mod.stream_roofs(2**16, repeats=3, device=torch.device("cpu"))
    assert len(roofs["copy"].rounds) == 3 == len(roofs["triad"].rounds)
    copy_fn, triad_fn = order[0], order[1]                               # the untimed warm-ups, then the rounds
    assert order[2:] == [copy_fn, triad_fn] * 3


def test_a_raise_is_read_round_by_round_from_back_to_back_matmuls():
    """The bf16 claim's paired rounds: one ratio per round, both modes at one size."""
    from labkit.profile.roofline import RoofMeasurement, Roofs
    from labkit.profile.roofs import raise_by_round

    roofs = Roofs("cpu", {m: RoofMeasurement(f"matmul {m}", "FLOP/s", (1.0,), 64) for m in ("fp32", "bf16")},
                  {"copy": RoofMeasurement("copy", "B/s", (1.0,), 1 << 20)})
    ratios = raise_by_round(roofs, "bf16", torch.device("cpu"), rounds=3)
    assert len(ratios) == 3 and all(r > 0 for r in ratios)
    same = raise_by_round(roofs, "fp32", torch.device("cpu"), rounds=3, baseline="fp32")
    assert all(0.2 < r < 5 for r in same)            # one mode against itself: near 1, whatever the machine


def test_a_raise_times_both_modes_at_the_larger_of_their_best_sizes():
    """A sweep stopped early on a burst left one mode at a small size: the pair is still timed at one size, the
    larger, so a small matmul is never held against a large one."""
    from labkit.profile.roofline import RoofMeasurement, Roofs
    from labkit.profile import roofs as roofs_mod

    roofs = Roofs("cpu", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (1.0,), 512),
                          "bf16": RoofMeasurement("matmul bf16", "FLOP/s", (1.0,), 128)},
                  {"copy": RoofMeasurement("copy", "B/s", (1.0,), 1 << 20)})
    sizes = []
    with mock.patch.object(roofs_mod, "matmul_rates", lambda n, mode, device, repeats: sizes.append((n, mode)) or [1.0]):
        assert roofs_mod.raise_by_round(roofs, "bf16", torch.device("cpu"), rounds=2) == [1.0, 1.0]
    assert sorted(set(sizes)) == [(512, "bf16"), (512, "fp32")] and len(sizes) == 4


def _swept(sizes):
    from labkit.profile.roofline import RoofMeasurement, Roofs
    fp32 = RoofMeasurement("matmul fp32", "FLOP/s", (1e11,), sizes[-1], sweep=tuple((n, 1e10) for n in sizes))
    return Roofs("cpu", {"fp32": fp32}, {"copy": RoofMeasurement("copy", "B/s", (1e9,), 2**20)})


def _meter_at(fraction: float):
    """A ShareMeter that reports ``fraction`` of a core: the mocked rounds take no time, so the real meter would read
    whatever the test machine's neighbours did in those microseconds (a busy CI run read a share that made 'failed'
    INCONCLUSIVE)."""
    from labkit.core.contention import CpuShare

    class Meter:
        result = CpuShare(on_cpu_s=fraction, waiting_s=1.0 - fraction, wall_s=1.0)
        share_value = fraction
        gpu_neighbours: dict = {}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        @property
        def share(self):
            return self.share_value

    return Meter


def test_the_size_gain_is_judged_on_paired_rounds_against_size_does_not_matter():
    roofs = _swept([64, 128, 256])
    gains = iter([3.0, 2.8, 3.1, 2.9, 3.0])
    with mock.patch.object(roofs_mod, "ShareMeter", _meter_at(1.0)), \
            mock.patch.object(roofs_mod, "size_gain_by_round", lambda *a, **k: [next(gains) for _ in range(5)]):
        verdict = roofs_mod.matmul_size_gain("big beats small", roofs, "cpu", rounds=5)
    assert verdict.state == "checked" and verdict.rival == "size does not matter"
    flat = lambda *a, **k: [1.0, 1.02, 0.98, 1.0, 1.01]  # noqa: E731 - the rival's numbers
    with mock.patch.object(roofs_mod, "ShareMeter", _meter_at(1.0)), \
            mock.patch.object(roofs_mod, "size_gain_by_round", flat):
        assert roofs_mod.matmul_size_gain("big beats small", roofs, "cpu", rounds=5).state == "failed"   # quiet: fails
    with mock.patch.object(roofs_mod, "ShareMeter", _meter_at(0.3)), \
            mock.patch.object(roofs_mod, "size_gain_by_round", flat):
        assert roofs_mod.matmul_size_gain("big beats small", roofs, "cpu", rounds=5).state == "INCONCLUSIVE"   # busy


def test_the_size_gain_times_the_smallest_and_largest_swept_sizes_back_to_back():
    seen = []
    real = roofs_mod.matmul_rates

    def spy(n, mode, device, repeats):
        seen.append(n)
        return real(n, mode, device, repeats)

    with mock.patch.object(roofs_mod, "matmul_rates", spy):
        gains = roofs_mod.size_gain_by_round(16, 64, torch.device("cpu"), rounds=3)
    assert seen == [16, 64] * 3 and len(gains) == 3 and all(g > 0 for g in gains)
    with pytest.raises(ValueError, match="two sizes"):
        roofs_mod.matmul_size_gain("x", _swept([64]), "cpu")


def test_copy_and_triad_reject_the_rival_two_roofs_a_factor_of_2_apart():
    quiet = types.SimpleNamespace(share=1.0, gpu_neighbours={})
    near = roofs_mod.copy_triad_agreement("one memory", _bandwidths((9e9, 9e9, 9e9), (10e9, 10e9, 10e9)), quiet)
    assert near.state == "checked" and near.rival == "two different roofs, a factor of 2 apart"
    # the rival true: copy reads half of triad's bandwidth every round, on a steady machine: failed
    twice = _bandwidths((5e9, 5e9, 5e9), (10e9, 10e9, 10e9))
    assert roofs_mod.copy_triad_agreement("one memory", twice, quiet).state == "failed"
    # the same with a starved kernel: the band admits the rival only because the run was busy -> INCONCLUSIVE (load)
    busy = types.SimpleNamespace(share=0.3, gpu_neighbours={})
    ratio_07 = _bandwidths((7e9, 7e9, 7e9), (10e9, 10e9, 10e9))
    verdict = roofs_mod.copy_triad_agreement("one memory", ratio_07, busy)
    assert verdict.state == "INCONCLUSIVE" and verdict.kind == "load" and "also holds the rival" in verdict.detail
    assert roofs_mod.copy_triad_agreement("one memory", ratio_07, quiet).state == "failed"     # steady: failed
