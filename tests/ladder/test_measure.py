"""How one rung is measured: strict fp32 vs TF32 math, MFU against the peak of the math that ran, the budget.
"""
from types import SimpleNamespace

import pytest
import torch

from labkit.ladder.measure import steps_for_budget, summarise_run
from labkit.training.flops import fp32_math, math_mode_of


def test_fp32_math_sets_strict_or_tf32_and_restores():
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    with fp32_math(False):
        assert torch.backends.cudnn.conv.fp32_precision == "ieee" == torch.backends.cuda.matmul.fp32_precision
    with fp32_math(True):
        assert torch.backends.cudnn.conv.fp32_precision == "tf32" == torch.backends.cuda.matmul.fp32_precision
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    assert math_mode_of(None, True, "cuda") == "tf32" and math_mode_of(None, True, "cpu") == "fp32"
    assert math_mode_of("bfloat16", True, "cuda") == "bf16" and math_mode_of("fp32", False, "cuda") == "fp32"

def test_mfu_uses_the_peak_of_the_math_mode_run(monkeypatch):
    """The H100 showed 93% 'MFU' on fp32 rungs: the fp32 peak against TF32 math. Each mode has its own peak."""
    from labkit.ladder.measure import mfu_of

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    flops = 1e9
    assert mfu_of(flops, 67_000, "cuda", "fp32") == pytest.approx(1e9 * 67_000 / 67e12)
    assert mfu_of(flops, 67_000, "cuda", "tf32") == pytest.approx(1e9 * 67_000 / 494.5e12)
    assert mfu_of(flops, 67_000, "cpu", "fp32") is None

def test_budget_arithmetic_and_summary():
    assert steps_for_budget(1000, 32, 4) == 31 and steps_for_budget(10, 32, 4) == 4
    recs = [SimpleNamespace(samples=4, step_time_s=t) for t in (1.0, 0.1, 0.2, 0.1)]
    res = SimpleNamespace(steps=recs, samples_per_s_median=99.0)
    sps, step_s, startup_s = summarise_run(res, warmup_steps=1, sync_every_step=True)
    assert sps == pytest.approx(12 / 0.4) and step_s == pytest.approx(0.4 / 3)
    assert startup_s == pytest.approx(1.0 - 0.4 / 3)
    assert summarise_run(res, 1, sync_every_step=False)[0] == 99.0                 # the loop's window rate


def _look(share: float, rate: float, monkeypatch) -> tuple[bool, dict]:
    """One slow-rung look at steady steps running at ``rate`` samples/s while this process got ``share`` of a core."""
    from labkit.core.contention import CpuShare
    from labkit.ladder import measure
    from labkit.training.config import TrainConfig

    monkeypatch.setattr(measure, "share_since", lambda mark: CpuShare(share, 1.0 - share, 1.0))
    cfg, extra, seen = measure.slow_rung_check(TrainConfig(steps=40, warmup_steps=1, device="cpu"), 50.0, 40)
    records = [SimpleNamespace(samples_per_s=rate)] * (1 + measure.SLOW_CHECK_STEPS)
    return extra["callback"](records[-1], SimpleNamespace(records=records)), seen


def test_a_slow_rung_stops_only_if_slow_with_the_cores_to_itself(monkeypatch):
    """40 samples/s against a 50 samples/s bar: too slow on a quiet machine, kept going when a neighbour took
    half the core (it would run 80 with the core to itself); the share of the look is kept for the row."""
    stop, seen = _look(1.0, 40.0, monkeypatch)
    assert stop and seen["cpu_share"] == pytest.approx(1.0)
    stop, seen = _look(0.5, 40.0, monkeypatch)
    assert not stop and seen["cpu_share"] == pytest.approx(0.5)
    assert _look(0.5, 20.0, monkeypatch)[0]                       # 40 with the core to itself: still too slow


def test_the_look_waits_for_its_steady_steps(monkeypatch):
    from labkit.ladder import measure
    from labkit.training.config import TrainConfig

    cfg, extra, _ = measure.slow_rung_check(TrainConfig(steps=40, warmup_steps=2, device="cpu"), 50.0, 40)
    assert cfg.log_every == 2 + measure.SLOW_CHECK_STEPS
    few = [SimpleNamespace(samples_per_s=1.0)] * (1 + measure.SLOW_CHECK_STEPS)   # 9 steady steps after 2 warm-ups
    assert extra["callback"](few[-1], SimpleNamespace(records=few)) is False
