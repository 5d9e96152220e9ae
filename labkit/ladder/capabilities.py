"""What this machine offers the tuning ladder: bf16 or fp16, TF32, a compiler for torch.compile, and how many
processes the DDP rung gets, each 'no' with its reason (so :func:`labkit.ladder.rungs.propose` can say why).
"""
from __future__ import annotations

import shutil

import torch

from labkit.comm.backend import choose_backend
from labkit.core.machine import cpu_count
from labkit.core.torch_compat import dynamo_unsupported_reason, has_triton
from labkit.ladder.rungs import Capabilities


def compiler_status(device_type: str) -> tuple[bool, str]:
    """Whether torch.compile's default backend can generate code here, and why not."""
    reason = dynamo_unsupported_reason()
    if reason is not None:
        return False, reason
    if device_type == "cuda":
        return (True, "Triton found") if has_triton() else (False, "Triton is not installed (Inductor needs it on GPU)")
    cxx = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    return (True, f"C++ compiler {cxx}") if cxx else (False, "no C++ compiler found (Inductor needs one on CPU)")


def tf32_status(device: torch.device) -> tuple[bool, str]:
    """Whether TF32 tensor-core math exists on ``device`` (CUDA compute capability >= 8.0), and why not."""
    if device.type != "cuda":
        return False, Capabilities.tf32_reason
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return False, f"TF32 needs an Ampere or later GPU (compute capability >= 8.0); this one is {major}.{minor}"
    return True, f"compute capability {major}.{minor}"


def ddp_plan(device: torch.device, requested: int | None, cores: int) -> tuple[int, str]:
    """(processes for the DDP rung, why). On a GPU box the kit's one backend rule decides (NCCL, one GPU per
    rank); a world size it would run as gloo CPU ranks is refused here, since those would not time these GPUs."""
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        world, what = (gpus if requested is None else requested), f"{gpus} GPU(s)"
        if world >= 2:
            choice = choose_backend(world)
            if not choice.uses_gpus:
                return 1, f"not run on these GPUs: {choice.reason}"
    else:
        world, what = (min(2, cores) if requested is None else requested), f"{cores} CPU core(s) for gloo processes"
    if world < 2:
        return world, f"only {what} here; data parallelism needs at least 2 processes"
    return world, choose_backend(world).reason      # says whether the ranks are GPUs on NCCL or gloo CPU processes


def detect_capabilities(device: torch.device, ddp_world_size: int | None = None,
                        num_workers: int | None = None) -> Capabilities:
    """Probe the device for bf16, TF32, a compiler, and how many processes DDP gets."""
    cores = cpu_count()
    amp = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if device.type == "cuda" else "bf16"
    world, reason = ddp_plan(device, ddp_world_size, cores)
    ok, why = compiler_status(device.type)
    tf32_ok, tf32_why = tf32_status(device)
    workers = num_workers if num_workers is not None else max(1, min(4, cores // 2))
    return Capabilities(device.type, cores, amp, ok, why, world, reason, workers, tf32_ok, tf32_why)
