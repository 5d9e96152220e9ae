import pytest

from labkit import timing


def test_percentile_matches_numpy():
    import numpy as np

    xs = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0]
    for q in (0, 10, 50, 90, 100):
        assert timing.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    with pytest.raises(ValueError):
        timing.percentile([], 50)


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
