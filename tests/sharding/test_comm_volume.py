"""Bytes per step: closed form, the ring simulator and a counted real collective agree."""
import pytest
import torch.distributed as dist

from labkit.sharding.comm_volume import (CommCounter, counting_collectives, predicted_bytes_per_step, ring_bytes_sent,
                                simulated_bytes_per_step)
from labkit.sharding.memory import STRATEGIES


def test_ring_convention():
    assert ring_bytes_sent("all_reduce", 1000, 4) == 1500
    assert ring_bytes_sent("reduce_scatter", 1000, 4) == ring_bytes_sent("all_gather", 1000, 4) == 750
    assert ring_bytes_sent("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="kind must be one of"):
        ring_bytes_sent("broadcast", 1000, 2)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_simulator_matches_closed_form(strategy, world_size):
    nbytes = 4 * 240 * world_size
    assert simulated_bytes_per_step(strategy, nbytes, world_size) == predicted_bytes_per_step(strategy, nbytes,
                                                                                              world_size)


def test_zero3_costs_half_more_than_ddp():
    ddp, z2, z3 = (predicted_bytes_per_step(s, 4096, 4) for s in ("ddp", "zero2", "zero3"))
    assert z2 == ddp and z3 == 1.5 * ddp


def test_simulation_size_is_bounded():
    with pytest.raises(ValueError, match="simulate a smaller model"):
        simulated_bytes_per_step("ddp", 1 << 28, 4)


def test_counting_patches_and_restores():
    original = dist.all_gather_single
    counter = CommCounter(world_size=2)
    with counting_collectives(counter):
        assert dist.all_gather_single is not original
    assert dist.all_gather_single is original
    counter.record("all_gather", 800)
    counter.record("reduce_scatter", 800)
    assert counter.bytes_sent() == 800 and counter.by_kind()["all_gather"] == 1


def test_the_ddp_hook_is_accepted_by_ddp():
    """register_comm_hook checks the hook's annotations against the real classes (strings are refused)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from labkit.sharding.comm_volume import CommCounter

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        model.register_comm_hook(None, CommCounter.ddp_hook)
        model(torch.randn(3, 4)).sum().backward()
    finally:
        dist.destroy_process_group()


def test_on_a_torch_without_the_single_names_the_older_names_are_called_and_counted(monkeypatch):
    """torch before 2.12 (GPU images ship 2.11) has all_gather_into_tensor / reduce_scatter_tensor only."""
    import torch

    from labkit.sharding.comm_volume import all_gather_single, reduce_scatter_single

    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.delattr(dist, "reduce_scatter_single", raising=False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        counter = CommCounter(world_size=1)
        with counting_collectives(counter):
            out, grads = torch.empty(4), torch.arange(4.0)
            all_gather_single(out, grads.clone())
            reduced = torch.empty(4)
            reduce_scatter_single(reduced, grads)
        assert torch.equal(out, grads) and torch.equal(reduced, grads)
        kinds = counter.by_kind()          # gloo may carry reduce_scatter_tensor on an all_reduce: counted too
        assert kinds["all_gather"] == 1 and kinds["reduce_scatter"] == 1
    finally:
        dist.destroy_process_group()
