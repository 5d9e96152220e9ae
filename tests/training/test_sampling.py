"""Utilisation sampled in a background thread: process CPU use and RSS on a CPU, NVML on a GPU."""
import pytest
import torch

from labkit.core.clock import Deadline
from labkit.training.sampling import UtilizationSampler, nvml_device_utilization


def test_cpu_sampler_sees_the_process_working():
    with UtilizationSampler("cpu", interval_s=0.05) as sampler:
        busy = Deadline(0.4)
        while not busy.expired:
            torch.randn(64, 64) @ torch.randn(64, 64)
    summary = sampler.summary()
    assert summary.kind == "cpu" and summary.samples >= 2
    assert summary.mean_percent is not None and summary.mean_percent >= 0
    assert summary.peak_rss_bytes > 0 and "one core" in summary.note


def test_no_samples_says_so():
    with UtilizationSampler("cpu", interval_s=60) as sampler:
        pass
    summary = sampler.summary()
    assert summary.samples == 0 and summary.mean_percent is None and "too short" in summary.note


def test_interval_is_validated():
    with pytest.raises(ValueError, match="interval_s must be a number > 0, got 0"):
        UtilizationSampler("cpu", interval_s=0)


def test_nvml_reading_is_none_or_a_triple():
    reading = nvml_device_utilization(0)
    if not torch.cuda.is_available():
        assert reading is None or len(reading) == 3
    if reading is not None:
        util, used, total = reading
        assert 0 <= util <= 100 and 0 <= used <= total
