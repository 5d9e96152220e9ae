"""Which torch.distributed backend a run uses, and how many ranks this machine can run.

One rule for every launcher in the kit (``launch`` from a notebook, the ranks under torchrun, the ladder's DDP
rung, the scaling lessons): NCCL only when every rank on the node gets its own GPU, otherwise gloo, with the
one-line reason a notebook prints next to its numbers.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labkit.core.choices import BACKENDS
from labkit.core.machine import cpu_count
from labkit.core.validation import checked_int, positive_int

GLOO_RANKS_PER_CORE = 4  # each gloo rank is a whole Python process with torch (~300 MB, ~2-3 s to start)


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and the one-line reason a notebook prints next to its numbers."""

    backend: str      # "gloo" or "nccl"
    reason: str
    uses_gpus: bool   # True: rank r drives cuda:<local rank>; False: every rank computes on the CPU


def choose_backend(world_size: int, backend: str = "auto", local_world_size: int | None = None) -> BackendChoice:
    """The one backend rule: NCCL only when every rank on this node gets its own GPU, otherwise gloo (and why).

    Two ranks on one GPU fail with "invalid device ordinal" under NCCL, so 'auto' never picks it then, and an
    explicit 'nccl' that cannot work is refused up front. ``local_world_size`` is the ranks on this node
    (torchrun's LOCAL_WORLD_SIZE); it defaults to ``world_size`` (one node).
    """
    world_size = checked_int(world_size, "world_size")
    local = world_size if local_world_size is None else checked_int(local_world_size, "local_world_size")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_nccl_available()
    fits = gpus >= local and nccl
    if backend == "nccl" and not fits:
        raise ValueError(f"backend='nccl' needs one CUDA GPU per rank: {local} rank(s) on this node but {gpus} "
                         f"GPU(s) visible (NCCL available: {nccl}); use backend='gloo' or fewer ranks")
    if backend == "nccl" or (backend == "auto" and fits):
        return BackendChoice("nccl", f"NCCL: {local} rank(s) on {gpus} GPU(s), one GPU per rank", True)
    if backend == "gloo":
        why = "gloo as requested: every rank computes on the CPU"
    elif gpus == 0:
        why = "gloo: no CUDA GPU visible, so every rank is a CPU process"
    elif not nccl:
        why = f"gloo: {gpus} GPU(s) but this torch build has no NCCL, so every rank is a CPU process"
    else:
        why = (f"gloo: {local} ranks but only {gpus} GPU(s) (NCCL needs one GPU per rank), so every rank is a "
               "CPU process and these timings are CPU timings")
    return BackendChoice("gloo", why, False)


def where_ranks_run(world_size: int, backend: str = "auto", what: str = "ranks") -> str:
    """One line a notebook prints where it starts ranks: how many, the backend chosen here and now, and why,
    and what carries their messages, so a one-GPU box says its ranks are gloo CPU processes."""
    choice = choose_backend(world_size, backend)
    link = ("NCCL between the GPUs (NVLink or PCIe, whichever this node has)" if choice.uses_gpus else
            "gloo over loopback TCP between processes sharing this machine's CPU cores")
    return f"{world_size} {what} -> {choice.reason}; messages: {link}"


def check_data_size(world_size: int, num_samples: int, what: str = "the dataset") -> None:
    """One clear error when there are more ranks than samples to shard (a rank would get no data)."""
    checked_int(world_size, "world_size", maximum=max(1, int(num_samples)),
                hint=f"{what} has {num_samples} samples, so each rank needs at least one; use fewer ranks")


def check_world_size(world_size: object, limit: tuple[int, str] | None = None) -> int:
    """The one world-size check: an integer >= 1 (the kit's validator), then at most the launcher's own limit.

    ``limit`` is (most ranks, why), e.g. :func:`world_size_limit` for a torch.distributed backend or
    ``labkit.comm.mpi.rank_limit`` for MPI; the why ends the error message. Returns ``world_size``.
    """
    world_size = positive_int(world_size, "world_size")
    if limit is not None:
        most, why = limit
        positive_int(world_size, "world_size", maximum=most, hint=why)
    return world_size


def world_size_limit(backend: str) -> tuple[int, str] | None:
    """(most ranks this machine runs on ``backend``, why): gloo GLOO_RANKS_PER_CORE per core; None for NCCL.

    NCCL's limit is one GPU per rank, which :func:`choose_backend` enforces.
    """
    if backend != "gloo":
        return None
    cores = cpu_count()
    return GLOO_RANKS_PER_CORE * cores, (f"gloo runs at most {GLOO_RANKS_PER_CORE} processes per CPU core x "
                                         f"{cores} cores here, and every rank is a full Python process with torch: "
                                         "use fewer ranks, or GPUs with NCCL")


@dataclass(frozen=True)
class RetiredSpellings:
    """What this PyTorch says about two spellings older tutorials use: ``dist.reduce_op`` and ``backend="tcp"``."""

    reduce_op_present: bool          # the old attribute still exists (deprecated) or is gone
    reduce_op_warnings: tuple[str, ...]
    reduce_op_same_operation: bool   # the old SUM is the modern ReduceOp.SUM
    modern_warnings: tuple[str, ...]
    backends: tuple[str, ...]        # the built-in backends; "tcp" is no longer one


def retired_spellings() -> RetiredSpellings:
    """Probe the old names by string (never used for work) so the lesson checks the library, not a claim."""
    old = getattr(dist, "reduce_op", None)          # probed by name: the one place the kit touches it
    with warnings.catch_warnings(record=True) as old_caught:
        warnings.simplefilter("always")
        old_sum = getattr(old, "SUM", None) if old is not None else None
    with warnings.catch_warnings(record=True) as modern_caught:
        warnings.simplefilter("always")
        modern_sum = dist.ReduceOp.SUM
    as_text = lambda caught: tuple(f"{w.category.__name__}: {w.message}" for w in caught)  # noqa: E731
    return RetiredSpellings(old is not None, as_text(old_caught), old is None or old_sum == modern_sum,
                            as_text(modern_caught), tuple(dist.Backend.backend_list))
