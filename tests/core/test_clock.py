"""The one clock: host time, wall-clock stamps, deadlines, interleaved runs, percentiles."""
import subprocess
import sys
import time

import pytest

from labkit.core.clock import Deadline, host_times_s, interleaved, now_s, percentile, timestamp_s


def test_now_s_measures_elapsed_host_time():
    start = now_s()
    time.sleep(0.02)
    assert 0.015 < now_s() - start < 1.0


def test_timestamp_s_is_wall_clock_seconds():
    assert abs(timestamp_s() - time.time()) < 1.0



def test_host_times_s_warms_up_then_times_each_call():
    calls = []
    times = host_times_s(lambda: (calls.append(1), time.sleep(0.01)), warmup=2, repeats=3)
    assert len(calls) == 5 and len(times) == 3 and all(0.005 < t < 1.0 for t in times)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        host_times_s(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        host_times_s(lambda: None, warmup=-1)


def test_deadline_counts_down_and_expires():
    deadline = Deadline(0.05)
    assert not deadline.expired and 0 < deadline.remaining_s <= 0.05
    time.sleep(0.06)
    assert deadline.expired and deadline.remaining_s == 0.0
    for bad in (0, -1, "5", None, True):
        with pytest.raises(ValueError, match="timeout_s must be a number > 0"):
            Deadline(bad)


def test_percentile_interpolates_like_numpy():
    np = pytest.importorskip("numpy")
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0, 10, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_interleaved_calls_each_run_once_per_round_in_turn():
    calls = []
    out = interleaved({"a": lambda: calls.append("a") or len(calls), "b": lambda: calls.append("b") or len(calls)},
                      rounds=3)
    assert calls == ["a", "b"] * 3                       # a b a b a b: never a block of a's then b's
    assert out == {"a": [1, 3, 5], "b": [2, 4, 6]}
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
            interleaved({"a": lambda: 1}, rounds=bad)
    with pytest.raises(ValueError, match="at least one run"):
        interleaved({}, rounds=2)


def test_the_clock_is_torch_free():
    """TensorFlow-only children read the same clock, so importing it must not load torch."""
    code = "import sys, labkit.core.clock; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_process_time_counts_cpu_work_not_sleep():
    from labkit.core.clock import process_time_s

    start = process_time_s()
    time.sleep(0.05)
    slept = process_time_s() - start
    start = process_time_s()
    sum(i * i for i in range(300_000))
    assert slept < 0.03 and process_time_s() - start > 0


def test_thread_time_counts_this_threads_cpu_work_not_sleep():
    from labkit.core.clock import thread_time_s

    start = thread_time_s()
    time.sleep(0.05)
    assert thread_time_s() - start < 0.03


def test_paired_median_compares_round_by_round():
    from labkit.core.clock import paired_median

    # a load that starts after round 1 and stays: the fastest rounds would say 4.2 vs 23 (batch 1 quiet, 16 busy);
    # round by round the larger batch wins 2 of 3
    big, small = [4.2, 4.3, 4.8], [23.2, 0.5, 0.9]
    assert max(big) < max(small) and paired_median(big, small) == pytest.approx(4.8 / 0.9)
    assert paired_median([90.0, 9.0, 95.0], [100.0, 10.0, 100.0]) < 1        # really slower: still below 1
    assert paired_median([1.0, float("nan"), 3.0, 5.0], [1.0, 1.0, None, 0.0]) == 1.0   # unusable pairs skipped
    assert paired_median([], []) is None and paired_median([1.0], [None]) is None
