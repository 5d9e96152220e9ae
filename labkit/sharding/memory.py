"""Memory per rank under sharding: DDP vs ZeRO-1/2/3, predicted with a sharding factor and counted per rank.

ZeRO (Rajbhandari et al. 2020, SC20, arXiv:1910.02054, Figure 1 and Section 5) splits training memory into
parameters, gradients and optimizer state, and shards them across the ``world_size`` data-parallel ranks in
stages: stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters. For
mixed-precision Adam it counts 2Ψ (fp16 params) + 2Ψ (fp16 grads) + KΨ (K = 12: fp32 params, momentum,
variance) bytes for Ψ parameters. ``predict_per_rank`` applies the same factors to the kit's *measured*
memory model; ``count_rank_state_bytes`` is the independent check: it adds up the storages a rank really
holds, deduplicated, so a shard is counted at its true size and a view twice is counted once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from labkit.core.validation import positive_int
from labkit.memory.model import MemoryBreakdown, MemoryModel
from labkit.memory.saved import storage_bytes, storage_key

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
ZERO_PAPER_K_MIXED_ADAM = 12   # ZeRO Section 3.1: fp32 params + momentum + variance = 12 bytes per parameter


def check_strategy(strategy: str) -> str:
    """The strategy name, lower-cased, or one clear ValueError."""
    name = str(strategy).lower()
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return name


@dataclass(frozen=True)
class ShardingFactors:
    """Fraction of the full parameters / gradients / optimizer state one rank holds at its peak."""

    params: float
    grads: float
    optimizer: float

    def __post_init__(self) -> None:
        for name in ("params", "grads", "optimizer"):
            if not 0.0 < getattr(self, name) <= 2.0:
                raise ValueError(f"{name} factor must be in (0, 2], got {getattr(self, name)}")


def sharding_factors(strategy: str, world_size: int, fsdp_keeps_shard: bool = True) -> ShardingFactors:
    """ZeRO's per-stage factors; ``fsdp_keeps_shard``: FSDP2's ZeRO-2 also keeps its 1/R parameter shard.

    FSDP2 expresses ZeRO-2 as ``reshard_after_forward=False``: between forward and backward a rank holds the
    whole unsharded parameters *and* its persistent shard, so params count 1 + 1/R there.
    """
    strategy, r = check_strategy(strategy), positive_int(world_size, "world_size")
    shard = 1.0 / r
    if strategy == "ddp":
        return ShardingFactors(1.0, 1.0, 1.0)
    if strategy == "zero1":
        return ShardingFactors(1.0, 1.0, shard)
    if strategy == "zero2":
        return ShardingFactors(1.0 + (shard if fsdp_keeps_shard else 0.0), shard, shard)
    return ShardingFactors(shard, shard, shard)


def predict_per_rank(model: MemoryModel, batch_size_per_rank: int, strategy: str, world_size: int,
                     fsdp_keeps_shard: bool = True) -> MemoryBreakdown:
    """One rank's predicted bytes: the memory model's parts times the strategy's sharding factors.

    Activations are not sharded by ZeRO: each rank keeps those of its own micro-batch. This is the state held
    right after the forward pass (what ``count_rank_state_bytes`` counts); the memory model's backward-peak
    adjustment is left out (0), since it is not yet known how it shards.
    """
    full = model.predict(batch_size_per_rank)
    scale = model.param_bytes / full.params_bytes if full.params_bytes else 1.0   # keep the model's real dtype
    f = sharding_factors(strategy, world_size, fsdp_keeps_shard)
    return MemoryBreakdown(full.batch_size, round(full.params_bytes * scale * f.params),
                           round(full.grads_bytes * scale * f.grads),
                           round(full.optimizer_bytes * scale * f.optimizer), full.activations_bytes)


def zero_paper_bytes(num_params: int, strategy: str, world_size: int,
                     k: int = ZERO_PAPER_K_MIXED_ADAM) -> int:
    """Model-state bytes per rank from the ZeRO paper's formulas (mixed-precision Adam: 2Ψ + 2Ψ + KΨ).

    DDP: (2+2+K)Ψ; ZeRO-1: 4Ψ + KΨ/R; ZeRO-2: 2Ψ + (2+K)Ψ/R; ZeRO-3: (4+K)Ψ/R (Rajbhandari et al. 2020, Fig. 1).
    """
    psi = positive_int(num_params, "num_params")
    strategy, r = check_strategy(strategy), positive_int(world_size, "world_size")
    params, grads, opt = 2 * psi, 2 * psi, k * psi
    f = sharding_factors(strategy, r, fsdp_keeps_shard=False)
    return round(params * f.params + grads * f.grads + opt * f.optimizer)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this process stores: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _add_storage(t: torch.Tensor | None, seen: dict[int, int]) -> int:
    """Add ``t``'s storage once (keyed by address); return the bytes newly counted."""
    if t is None or not isinstance(t, torch.Tensor):
        return 0
    ptr, nbytes = storage_key(_local(t)), storage_bytes(_local(t))
    if ptr == 0 or ptr in seen:
        return 0
    seen[ptr] = nbytes
    return nbytes


def count_rank_state_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None = None,
                           extra_params: Iterable[torch.Tensor] = ()) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank really holds, each storage counted once.

    ``params``: the tensors the model uses now (FSDP2 swaps in unsharded ones during forward/backward);
    ``extra_params``: ones held elsewhere (the optimizer's shards). Counted in that order, so a storage shared
    by a parameter and a gradient or state (a flat buffer) is billed to the first part that holds it.
    """
    seen: dict[int, int] = {}
    all_params = list(params) + list(extra_params)
    if optimizer is not None:
        all_params += [p for group in optimizer.param_groups for p in group["params"]]
    out = {"params": sum(_add_storage(p, seen) for p in all_params)}
    out["grads"] = sum(_add_storage(p.grad, seen) for p in all_params)
    state = optimizer.state.values() if optimizer is not None else ()
    out["optimizer"] = sum(_add_storage(v, seen) for s in state for v in s.values())
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def model_state_bytes(model: nn.Module) -> int:
    """Bytes of one full copy of the trainable parameters (what DDP replicates on every rank)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
