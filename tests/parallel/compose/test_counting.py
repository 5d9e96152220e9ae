"""Bytes per axis: each collective billed to the axis whose group it ran on, with the ring convention."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from labkit.comm.mesh import AxisGroup
from labkit.parallel.compose.counting import AxisBytes, counting_axes

TP, DP = object(), object()                 # stand-ins for two process groups
GROUPS = {"tp": AxisGroup(TP, (0, 1), 0), "dp": AxisGroup(DP, (0, 2, 4, 6), 0)}


@pytest.fixture
def fake_dist(monkeypatch):
    """torch.distributed's calls replaced by no-ops (no process group here): the counter wraps these."""
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "send", "isend"):
        monkeypatch.setattr(dist, name, lambda *a, **k: None)


def test_each_call_is_billed_to_its_axis_with_the_ring_convention(fake_dist):
    t = torch.zeros(256)                                          # 1 KiB
    with counting_axes(AxisBytes(GROUPS)) as counter:
        dist.all_reduce(t, group=TP)                              # 2 (2-1)/2 x 1024
        dist.all_gather_into_tensor(output_tensor=t, input_tensor=t[:64], group=DP)    # (4-1)/4 x 1024
        dist.reduce_scatter_tensor(t[:64], t, group=DP)           # (4-1)/4 x 1024 (the input is the full size)
        dist.send(t, 1, group=TP)                                 # its bytes
    assert counter.per_axis() == {"tp": 1024 + 1024, "dp": 768 + 768}
    assert dict(counter.calls) == {"tp": 2, "dp": 2}


def test_the_patches_are_removed_after_the_block(fake_dist):
    before = dist.all_reduce
    with counting_axes(AxisBytes(GROUPS)):
        assert dist.all_reduce is not before
    assert dist.all_reduce is before


def test_a_call_on_a_group_of_no_axis_is_an_error(fake_dist):
    with counting_axes(AxisBytes(GROUPS)):
        with pytest.raises(ValueError, match="not one of the mesh's axes"):
            dist.all_reduce(torch.zeros(1))                       # the default group: the whole world
    extra = AxisBytes(GROUPS, {"dp": (object(), 2)})              # e.g. a DeviceMesh's dp group for FSDP2
    assert extra.axis(DP) == ("dp", 4)
