"""The device a rank computes on follows the backend: gloo ranks are CPU processes."""
import torch
import torch.distributed as dist

from labkit.parallel.ranks import rank_device


def test_gloo_rank_computes_on_the_cpu():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert rank_device() == torch.device("cpu")
    finally:
        dist.destroy_process_group()
