"""torch's own context parallelism beside the hand-written ring: SDPA run under
``torch.distributed.tensor.experimental.context_parallel`` on NCCL ranks (one GPU each), its output gathered with
``context_parallel_unshard`` and compared with the hand-written ring's (:func:`ring_attention_simulated`, the
schedule :mod:`labkit.parallel.context.ring_runs` runs on gloo) on the same inputs.

torch's context_parallel is CUDA-first: it swaps SDPA's flash / memory-efficient / cuDNN kernels for ring versions,
and causal SDPA on CPU has no sharding strategy (torch 2.13+: "aten._scaled_dot_product_flash_attention_for_cpu ...
does not have a sharding strategy registered", seen on 2.14.1), so without one GPU per rank this says NOT CHECKED
and why (:func:`torch_cp_unavailable`) instead of running. Non-causal SDPA on gloo CPU ranks does run, but through
DTensor's generic sharding propagation of the op's decomposition, not a ring kernel (about 40 s for 64 tokens on 2
ranks here, 2.14.1): not torch's context parallelism worth comparing, so it is not used. Its causal load balancer is the head-tail split, the same
zig-zag as the hand-written ring (Liu et al. 2023, arXiv:2310.01889; Brandon et al. 2023, arXiv:2311.09431).
The API is a prototype (torch 2.7+ keeps it under ``experimental``): imported lazily and guarded.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.comm.launch import launch
from labkit.comm.worker import rank_device
from labkit.core.torch_compat import context_parallel_unshard
from labkit.core.validation import positive_int
from labkit.parallel.context.ring_attention import ring_attention_simulated
from labkit.parallel.context.ring_runs import RingConfig, reference_inputs

TOLERANCE = 1e-4        # float32 memory-efficient kernel against the float64 hand-written ring
CLAIM = "torch's context_parallel gives the same causal attention output as the hand-written ring"


@dataclass(frozen=True)
class CpComparison:
    """Ran or not; if not, why; if so, the largest |torch CP - hand-written ring| over the whole output."""

    ran: bool
    reason: str = ""
    max_error: float | None = None
    detail: str = ""

    @property
    def agrees(self) -> bool:
        """Ran and within :data:`TOLERANCE`."""
        return self.ran and self.max_error is not None and self.max_error <= TOLERANCE


def _torch_cp_api() -> tuple | None:
    """(context_parallel, context_parallel_unshard, init_device_mesh), or None where this torch lacks them."""
    try:
        from torch.distributed.device_mesh import init_device_mesh  # lazy: a prototype API, guarded
        from torch.distributed.tensor.experimental import context_parallel  # lazy: a prototype API, guarded
    except ImportError:
        return None
    unshard = context_parallel_unshard()
    return None if unshard is None else (context_parallel, unshard, init_device_mesh)


def torch_cp_unavailable(world_size: int = 2) -> str | None:
    """Why torch's context_parallel cannot run on ``world_size`` ranks here (one sentence), or None."""
    w = positive_int(world_size, "world_size")
    if w < 2:
        raise ValueError(f"a ring needs at least 2 ranks, got world_size={w}")
    if _torch_cp_api() is None:
        return f"torch {torch.__version__} has no torch.distributed.tensor.experimental.context_parallel"
    if not torch.cuda.is_available():
        return ("no CUDA GPU here: torch's context_parallel is CUDA-first (causal SDPA on CPU has no sharding "
                "strategy in torch 2.13+), so only the hand-written ring runs")
    gpus = torch.cuda.device_count()
    if gpus < w:
        return f"{w} context-parallel ranks need {w} GPUs (NCCL: one GPU per rank), {gpus} visible"
    if not dist.is_nccl_available():
        return "this torch build has no NCCL"
    return None


def torch_cp_job(cfg_dict: dict, seq_len: int) -> dict:
    """One NCCL rank: causal SDPA under context_parallel, the output unsharded, against the hand-written ring."""
    context_parallel, unshard, init_device_mesh = _torch_cp_api()  # type: ignore[misc]
    from torch.nn.attention import SDPBackend, sdpa_kernel  # lazy: only where CUDA runs it
    cfg, w = RingConfig(**cfg_dict), dist.get_world_size()
    mesh = init_device_mesh("cuda", (w,))
    q64, k64, v64, _ = reference_inputs(cfg, seq_len)
    q, k, v = (t.to(rank_device(), torch.float32) for t in (q64, k64, v64))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), context_parallel(mesh, buffers=[q, k, v],
                                                                       buffer_seq_dims=[2, 2, 2],
                                                                       no_restore_buffers={q, k, v}):
        local = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (whole,) = unshard(mesh, [local], [2])
    ring = ring_attention_simulated(q64, k64, v64, torch.zeros_like(q64), w, causal=True)[0]
    return {"rank": dist.get_rank(), "local_tokens": int(local.shape[2]),
            "max_error": float((whole.double().cpu() - ring).abs().max()), "torch": torch.__version__}


def cp_world_size(most: int = 4) -> int:
    """The GPUs visible, at most ``most``, at least 2 (a ring; the guard then says what is missing)."""
    return max(2, min(most, torch.cuda.device_count() if torch.cuda.is_available() else 0))


def compare_torch_cp(cfg: RingConfig | None = None, world_size: int | None = None, seq_len: int = 256,
                     timeout_s: float = 120.0) -> CpComparison:
    """Run :func:`torch_cp_job` on ``world_size`` NCCL ranks (default :func:`cp_world_size`) under a timeout, or
    say why not (never pretend)."""
    world_size = world_size or cp_world_size()
    reason = torch_cp_unavailable(world_size)
    if reason:
        return CpComparison(False, reason)
    if positive_int(seq_len, "seq_len") % (2 * world_size):
        raise ValueError(f"seq_len={seq_len} must be a multiple of 2 x world_size = {2 * world_size}")
    cfg = cfg or RingConfig()
    ranks = launch(torch_cp_job, world_size, args=(asdict(cfg), seq_len), backend="nccl", timeout_s=timeout_s,
                   show_output=False)
    err = max(r["max_error"] for r in ranks)
    return CpComparison(True, max_error=err, detail=f"torch {ranks[0]['torch']}, {world_size} GPUs, sequence "
                        f"{seq_len} ({ranks[0]['local_tokens']} tokens per rank), max |torch CP - ring| {err:.2e}")
