"""What code running on one rank of a launched group asks of the backend rule: which device it computes on.

Under NCCL every rank drives its own GPU (the launcher made it the current device); under gloo every rank is a
CPU process, even on a GPU box (``labkit.comm.backend.choose_backend``). The measured lessons of this package
(scaling, the pipeline, the distributed pitfalls) all place their tensors with :func:`rank_device`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def rank_device() -> torch.device:
    """This rank's device: its own GPU under NCCL (one GPU per rank), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
