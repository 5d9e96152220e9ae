import pytest

from labkit.core import timing


def test_time_fn_counts_warmup_and_repeats():
    calls = []
    result = timing.time_fn(lambda: calls.append(1), warmup=3, repeats=4, device="cpu")
    assert len(calls) == 7 and len(result.times_s) == 4
    assert result.p10_s <= result.median_s <= result.p90_s
    assert "CPU" in result.device and "median" in str(result)


def test_time_fn_rejects_bad_counts():
    with pytest.raises(ValueError):
        timing.time_fn(lambda: None, repeats=0)


def test_stopwatch_measures_sleep():
    import time

    with timing.Stopwatch("cpu") as sw:
        time.sleep(0.02)
    assert sw.elapsed_s >= 0.02


def test_time_fn_uses_the_device_clock():
    result = timing.time_fn(lambda: None, warmup=0, repeats=3, device="cpu")
    assert result.clock == "host" and all(t >= 0 for t in result.times_s)
    assert timing.PhaseClock("cpu").mode == "host"
    assert timing.PhaseClock("cpu", sync_every_step=True).mode == "host"      # a CPU has nothing to sync


def test_phase_clock_picks_events_on_cuda_without_touching_a_gpu():
    import torch

    assert timing.PhaseClock(torch.device("cuda", 0)).mode == "events"       # construction reads only the type
    clock = timing.PhaseClock(torch.device("cuda", 0), sync_every_step=True)
    assert clock.mode == "sync" and clock.elapsed_s(1.0, 1.25) == 0.25


def test_time_fn_measures_sleep():
    import time

    result = timing.time_fn(lambda: time.sleep(0.01), warmup=0, repeats=3, device="cpu")
    assert min(result.times_s) >= 0.01



def test_stopwatch_cpu_time_ignores_sleep_on_a_cpu():
    """cpu_time=True on a CPU counts this process's CPU seconds: a sleep (other work's time) does not count."""
    import time

    with timing.Stopwatch("cpu", cpu_time=True) as sw:
        time.sleep(0.05)
    assert sw.elapsed_s < 0.03
    with timing.Stopwatch("cpu", cpu_time=True) as busy:
        sum(i * i for i in range(300_000))
    assert busy.elapsed_s > 0
