"""Fixtures shared by the communication tests."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has ``count`` CUDA GPUs (and NCCL or not): ``gpus(2)``, ``gpus(2, nccl=False)``."""
    def set_gpus(count: int, nccl: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    return set_gpus
