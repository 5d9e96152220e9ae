"""What this machine offers the ladder: DDP ranks and TF32, with CUDA mocked (no GPU needed)."""
import torch

import labkit.ladder.capabilities as capabilities
from labkit.ladder.capabilities import ddp_plan
from labkit.ladder.rungs import Capabilities, Recipe, propose


def test_ddp_plan_one_rank_per_gpu_with_mocked_devices(monkeypatch):
    world, why = ddp_plan(torch.device("cpu"), None, 2)
    assert world == 2 and why.startswith("gloo") and "CPU process" in why   # the rung says its ranks are CPU processes
    assert "at least 2 processes" in ddp_plan(torch.device("cpu"), 1, 2)[1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    world, why = ddp_plan(torch.device("cuda"), None, 16)
    assert world == 1 and "only 1 GPU(s)" in why
    world, why = ddp_plan(torch.device("cuda"), 2, 16)
    assert world == 1 and "not run on these GPUs" in why and "NCCL needs one GPU per rank" in why  # no CPU ranks
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert ddp_plan(torch.device("cuda"), None, 16) == (4, "NCCL: 4 rank(s) on 4 GPU(s), one GPU per rank")
    caps = Capabilities("cuda", 16, "bf16", True, "", 4, "NCCL: 4 rank(s) on 4 GPU(s), one GPU per rank", 4, True, "")
    recipe, why = propose("ddp", Recipe(batch_size=8), caps, 8)
    assert recipe.world_size == 4 and recipe.global_batch == 32 and "global batch 32" in why and "(NCCL: 4 rank" in why

def test_tf32_status_with_mocked_gpus(monkeypatch):
    assert capabilities.tf32_status(torch.device("cpu"))[0] is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert capabilities.tf32_status(torch.device("cuda")) == (True, "compute capability 9.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    ok, why = capabilities.tf32_status(torch.device("cuda"))
    assert not ok and "Ampere" in why and "7.0" in why
    caps = Capabilities("cuda", 16, "bf16", True, "", 1, "", 4, True, "")
    assert propose("tf32", Recipe(batch_size=8), caps, 8)[0].tf32 is True
