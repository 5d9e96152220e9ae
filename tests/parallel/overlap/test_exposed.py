"""Exposed communication on hand-worked numbers (ms, with alpha and beta chosen to make the arithmetic exact)."""
import math

import pytest

from labkit.parallel.overlap import exposed


def test_exposed_is_what_communication_leaves_after_the_overlappable_compute():
    assert exposed.exposed_time_s(30.0, 20.0) == 10.0
    assert exposed.exposed_time_s(10.0, 20.0) == 0.0
    with pytest.raises(ValueError):
        exposed.exposed_time_s(-1.0, 2.0)


def test_buckets_share_one_link_and_what_runs_past_backward_is_exposed():
    # backward 10; buckets ready at 2, 5, 10 with 4 bytes each, alpha 1, beta 1 -> each takes 5
    # starts 2, 7 (waits for the first), 12; ends 7, 12, 17 -> exposed 7; comm 15 (the rival: all of it)
    sched = exposed.schedule_buckets([2.0, 5.0, 10.0], [4, 4, 4], 10.0, 1.0, 1.0)
    assert sched.starts_s == (2.0, 7.0, 12.0) and sched.ends_s == (7.0, 12.0, 17.0)
    assert sched.exposed_s == 7.0 and sched.comm_s == 15.0


def test_one_bucket_overlaps_nothing_and_tiny_buckets_pay_alpha_each():
    # 12 bytes, backward 10, alpha 1, beta 0.5: one bucket ready at 10 -> 1 + 6 = 7 exposed
    one = exposed.schedule_buckets([10.0], [12], 10.0, 1.0, 0.5)
    assert one.exposed_s == 7.0
    # three buckets of 4 bytes ready at 2, 6, 10: each 3 -> ends 5, 9, 13 -> 3 exposed
    three = exposed.schedule_buckets([2.0, 6.0, 10.0], [4, 4, 4], 10.0, 1.0, 0.5)
    assert three.exposed_s == 3.0
    # twelve of 1 byte, ready every 10/12: each 1.5 -> 18 in all, the link is the bottleneck: exposed > three's
    ready = [10.0 * (k + 1) / 12 for k in range(12)]
    many = exposed.schedule_buckets(ready, [1] * 12, 10.0, 1.0, 0.5)
    assert many.exposed_s > three.exposed_s
    assert exposed.best_cap({0: many.exposed_s, 4: three.exposed_s, math.inf: one.exposed_s}) == 4


def test_ready_times_come_from_the_latest_layer_of_each_bucket():
    ends = {"2": 1.0, "1": 4.0, "0": 9.0}
    assert exposed.bucket_ready_s([["2"], ["1", "0"]], ends) == [1.0, 9.0]
    assert exposed.overlappable_s([1.0, 9.0], 9.0) == 8.0
    with pytest.raises(ValueError, match="no backward end"):
        exposed.bucket_ready_s([["7"]], ends)


def test_cap_names():
    assert exposed.describe_cap(0) == "one per parameter"
    assert exposed.describe_cap(math.inf) == "one bucket"
    assert exposed.describe_cap(256 << 10) == "256 KiB" and exposed.describe_cap(4 << 20) == "4 MiB"
