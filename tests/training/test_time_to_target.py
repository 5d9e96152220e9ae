"""MLPerf-style time to target: olympic mean, misses, spread, and the steps x step-time prediction."""
import math

import pytest

from labkit.training.time_to_target import TimeToTarget, fastest, olympic_mean, time_from_steps, time_runs


def test_olympic_mean_drops_the_fastest_and_slowest():
    assert olympic_mean([1.0, 10.0, 2.0, 3.0, 100.0]) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="3 or more"):
        olympic_mean([1.0, 2.0])


def test_one_miss_is_dropped_two_are_not():
    one = TimeToTarget("a", (1.0, 2.0, math.inf), (0, 1, 2))
    assert one.reached and one.olympic_mean_s == 2.0 and one.spread == pytest.approx(0.5)
    two = TimeToTarget("b", (1.0, math.inf, math.inf), (0, 1, 2))
    assert not two.reached and two.olympic_mean_s == math.inf and "missed" in str(two)


def test_time_runs_times_each_seed_and_counts_misses():
    result = time_runs(lambda seed: seed != 1, [0, 1, 2], "x")
    assert result.seeds == (0, 1, 2) and math.isinf(result.times_s[1]) and result.times_s[0] >= 0
    with pytest.raises(ValueError, match="3 or more seeds"):
        time_runs(lambda seed: True, [0, 1])


def test_time_from_steps_and_fastest():
    times = time_from_steps({8: 100, 16: 60, 32: 50}, {8: 0.01, 16: 0.015, 32: 0.04})
    assert times == pytest.approx({8: 1.0, 16: 0.9, 32: 2.0})
    assert fastest(times) == 16
    with pytest.raises(ValueError, match="no entry"):
        fastest({8: math.inf})
