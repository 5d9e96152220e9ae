"""The hand-written syncs' pieces that need no process group: DDP-style buckets and the layer timeline."""
import math

import pytest
import torch
from torch import nn

from labkit.parallel.overlap.grad_sync import GradSync, assign_buckets, record_layer_backward


def test_buckets_fill_from_the_last_parameter_and_close_once_they_reach_the_cap():
    # sizes 100, 300, 50, 400 (indices 0..3); reversed: 3 (400) >= 350 closes; 2 + 1 = 350 closes; 0 alone
    assert assign_buckets([100, 300, 50, 400], 350) == [[3], [2, 1], [0]]
    assert assign_buckets([100, 300, 50, 400], 0) == [[3], [2], [1], [0]]
    assert assign_buckets([100, 300, 50, 400], math.inf) == [[3, 2, 1, 0]]


def test_every_parameter_lands_in_exactly_one_bucket():
    sizes = [7, 1, 30, 2, 2, 19, 4]
    for cap in (0, 3, 10, 25, 1000):
        flat = [i for bucket in assign_buckets(sizes, cap) for i in bucket]
        assert sorted(flat) == list(range(len(sizes))) and flat == sorted(flat, reverse=True)


@pytest.mark.parametrize("sizes, cap", [([4, 0], 1), ([4], -1), ([4], float("nan"))])
def test_bad_sizes_or_caps_are_refused(sizes, cap):
    with pytest.raises(ValueError):
        assign_buckets(sizes, cap)


def test_an_unknown_mode_is_refused_before_any_hook_is_registered():
    with pytest.raises(ValueError, match="mode must be one of"):
        GradSync(nn.Linear(2, 2), "eager")


def test_the_layer_timeline_sees_every_linear_in_backward_order_and_the_hooks_come_off():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    timeline, handles = record_layer_backward(model)
    model(torch.randn(3, 4)).sum().backward()
    spans = timeline.spans()
    assert [name for name, _, _ in spans] == ["4", "2", "0"]
    assert all(start <= end for _, start, end in spans)
    assert all(spans[i][2] <= spans[i + 1][1] for i in range(len(spans) - 1))
    for handle in handles:
        handle.remove()
    timeline.clear()
    model(torch.randn(3, 4)).sum().backward()
    assert timeline.spans() == []
