"""The same split with torch's API: ``parallelize_module`` on a device mesh, and ``CommDebugMode`` to count what it
sends.

``ColwiseParallel`` shards a Linear's weight by output features (Megatron's column-parallel linear),
``RowwiseParallel`` by input features and sums the partial outputs (the row-parallel linear with its g);
``SequenceParallel`` runs a norm on its sequence shard, and ``PrepareModuleInput`` gathers the sequence before a
block (f under sequence parallelism), as torchtitan's ``parallelize.py`` composes them. The block code is the
unsplit layer's own: attention infers how many heads it holds from q's width.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from labkit.parallel.tensor.megatron import COLUMN, SPLITS


def tp_plan(sequence_parallel: bool = False) -> dict[str, object]:
    """The parallelize plan of the kit's layer: every linear as Megatron splits it; with SP the norms on sequence
    shards, each block's input gathered once, each block's output reduce-scattered back to the sequence shards."""
    seq, whole = Shard(1), Replicate()
    arrives = seq if sequence_parallel else whole
    # one f per block: the block's input becomes a DTensor once, so q, k and v sum their input gradients before
    # the one all-reduce (without it, each ColwiseParallel all-reduces its own: 4 in backward instead of 2)
    plan: dict[str, object] = {block: PrepareModuleInput(input_layouts=(arrives,), desired_input_layouts=(whole,),
                                                         use_local_output=False) for block in ("attn", "mlp")}
    if sequence_parallel:
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel()})
    for path, split in SPLITS.items():
        plan[path] = ColwiseParallel() if split == COLUMN else RowwiseParallel(output_layouts=arrives)
    return plan


def device_mesh(world_size: int, device_type: str) -> DeviceMesh:
    """A one-dimensional mesh over every rank of the default process group (already initialised by the launcher)."""
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("tp",))


def dtensor_block(block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool = False) -> nn.Module:
    """A copy of the unsplit layer, parallelized in place by torch: its parameters become DTensor shards."""
    return parallelize_module(copy.deepcopy(block), mesh, tp_plan(sequence_parallel))


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a plain tensor as it is)."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_params(model: nn.Module) -> int:
    """Elements this rank holds of the model's parameters."""
    return sum(local(p).numel() for p in model.parameters())


def comm_counts(fn: Callable[[], object]) -> dict[str, int]:
    """Collectives ``fn`` issued, by name, as CommDebugMode counts them (e.g. {'all_reduce': 2})."""
    with CommDebugMode() as mode:
        fn()
    return {str(op).split(".")[-1].removesuffix("_"): n for op, n in mode.get_comm_counts().items()}


def replicated_local_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient as this rank holds it (its shard; a replicated one whole)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            g = g.redistribute(placements=[Replicate()] * len(g.placements))
        out[name] = local(g).detach().clone()
    return out


def world() -> int:
    """The default group's size (1 outside a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1
