"""One training step of the stack on this rank, for each composition, with the groups of one :class:`Mesh`.

Each step takes this rank's share of the model (tp: its heads and hidden units; pp: its stage's layers) and of the
batch (dp: its sequences; cp: its zig-zag tokens), runs forward and backward, averages the gradients over the data
x context group, and reports its loss, its gradients and the bytes each axis sent (:mod:`.counting`). The data axis
is the kit's hand-written sync SGD (:func:`labkit.parallel.data.sync_sgd.sync_gradients`) or torch's FSDP2
(``fully_shard(model, mesh=mesh["dp"])``); the pipeline is a two-stage GPipe by hand (Huang et al. 2019).
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from labkit.comm.mesh import AxisGroup, Mesh, device_mesh, process_groups
from labkit.core.step import LossFn, StepOptions, TrainStep
from labkit.parallel.compose.counting import AxisBytes, counting_axes
from labkit.parallel.compose.model import (StackShape, gradients_of, probe_mean_loss, stack_inputs, stage_layers,
                                           tp_stack)
from labkit.parallel.compose.ring import ring_block_forward
from labkit.parallel.context.ring_attention import zigzag_shard
from labkit.parallel.data.sync_sgd import sync_gradients
from labkit.parallel.tensor.megatron import Block, ParallelBlock
from labkit.sharding.checkpointing import Checkpointed

MICRO_BATCHES = 2          # the hand-written GPipe's micro-batches per step


def grad_axis(mesh: Mesh) -> str:
    """The axis gradients are averaged over: dp, or the flattened dp x cp group when cp > 1 (Megatron, FSDP)."""
    return "dp_cp" if mesh.cp > 1 else "dp"


def local_batch(shape: StackShape, mesh: Mesh, groups: dict[str, AxisGroup]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, probe) this rank trains on: its dp share of the sequences, and its zig-zag tokens when cp > 1."""
    dp, cp = groups["dp"], groups["cp"]
    x, probe = (t.chunk(mesh.dp, dim=0)[dp.index].contiguous() for t in stack_inputs(shape))   # (b/dp, s, h)
    if mesh.cp > 1:
        x, probe = (zigzag_shard(t, cp.size, cp.index) for t in (x, probe))                     # (b/dp, s/cp, h)
    return x, probe


def average_gradients(model: torch.nn.Module, group: AxisGroup) -> None:
    """Mean of every gradient over ``group`` (one bucketed all-reduce): the hand-written data parallel axis."""
    if group.size > 1:
        sync_gradients(model, lambda t: dist.all_reduce(t, group=group.group), group.size, bucket=True)


def data_parallel_step(model: torch.nn.Module, mesh: Mesh, groups: dict[str, AxisGroup],
                       optimizer: torch.optim.Optimizer | None, loss_fn: LossFn,
                       options: StepOptions = StepOptions(),
                       before_sync: Callable[[torch.nn.Module], None] | None = None) -> TrainStep:
    """The kit's one step for this rank's part of a model (tp-split or a pipeline stage): gradients averaged over
    the data x context group after backward, then the update. What a timed run (a placement, the planner's
    runner) trains with; the compositions below check the same reduction against one process. ``before_sync``
    sees the model after backward, before the reduction (the planner's runner reads the state held there)."""
    def sync(m: torch.nn.Module) -> None:
        if before_sync is not None:
            before_sync(m)
        average_gradients(m, groups[grad_axis(mesh)])

    return TrainStep(model, optimizer, loss_fn=loss_fn, options=options, grad_hook=sync)


def tp_layers(blocks: Sequence[Block], tp: AxisGroup, checkpointing: bool = False) -> torch.nn.Sequential:
    """This rank's tp part of each block (Megatron's split), each recomputed in backward when ``checkpointing``."""
    parts = [ParallelBlock(b, tp.index, tp.size, group=tp.group) for b in blocks]
    return torch.nn.Sequential(*(Checkpointed(p) if checkpointing else p for p in parts))


def tensor_data_step(blocks: Sequence[Block], tp: AxisGroup, dp: AxisGroup, inputs: Sequence[torch.Tensor],
                     make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
                     loss_fn: LossFn, *, options: StepOptions = StepOptions(), checkpointing: bool = False,
                     before_sync: Callable[[torch.nn.Module], None] | None = None) -> TrainStep:
    """The one tp x dp training step of a timed run: this rank's tp part of ``blocks``, its dp share of ``inputs``
    (``step.feed``), gradients averaged over ``dp`` after backward. The groups come from one :class:`Mesh`, in
    whichever placement the caller chose (the multi-node lab swaps which axis a node's ranks form)."""
    model = tp_layers(blocks, tp, checkpointing)
    groups = {"tp": tp, "dp": dp}
    step = data_parallel_step(model, Mesh(dp=dp.size, tp=tp.size), groups, make_optimizer(model.parameters()),
                              loss_fn, options, before_sync)
    step.feed = tuple(v.chunk(dp.size, dim=0)[dp.index].contiguous() for v in inputs)  # type: ignore[attr-defined]
    return step


def mean_over(value: float, group: AxisGroup) -> float:
    """A float averaged over ``group`` (each dp x cp rank's loss is the mean over its share)."""
    t = torch.tensor([value], dtype=torch.float64)
    if group.size > 1:
        dist.all_reduce(t, group=group.group)
    return float(t) / group.size


def _full(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FSDP2's gradients are DTensors sharded over dp: gather each (outside the byte count, it is not the step's)."""
    return {n: g.full_tensor() if isinstance(g, DTensor) else g for n, g in grads.items()}


def upstream_loss(out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """sum(out * grad): its gradient with respect to ``out`` is ``grad``, so one backward through it carries the
    gradient the next pipeline stage sent back into this stage's layers."""
    return (out * grad).sum()


def data_tensor_step(shape: StackShape, mesh: Mesh, fsdp: bool = False) -> dict:
    """dp x tp (and dp x cp x tp): Megatron's layer split over tp, the batch over dp, ring attention over cp;
    gradients averaged by hand, or FSDP2 sharding the model over the dp sub-mesh."""
    groups = process_groups(mesh)
    ring = None if mesh.cp == 1 else (lambda layer, h: ring_block_forward(layer, h, groups["cp"], shape.seq_len))
    model, extra = tp_stack(shape, list(range(shape.layers)), groups["tp"], ring), {}
    if fsdp:
        if mesh.cp > 1:
            raise ValueError("the FSDP2 composition here is dp x tp (cp = 1)")
        dm = device_mesh(mesh)
        fully_shard(model, mesh=dm["dp"])                 # the dp axis is FSDP2: parameters sharded over dp
        extra = {"dp": (dm["dp"].get_group(), mesh.dp)}
    x, probe = local_batch(shape, mesh, groups)
    sync = None if fsdp else (lambda m: average_gradients(m, groups[grad_axis(mesh)]))
    with counting_axes(AxisBytes(groups, extra)) as counter:
        loss, grads = gradients_of(model, x, probe, probe_mean_loss, sync)
    return {"loss": mean_over(loss, groups[grad_axis(mesh)]), "grads": _full(grads), "bytes": counter.per_axis()}


def _send(t: torch.Tensor, peer: AxisGroup, index: int) -> None:
    dist.send(t.detach().contiguous(), peer.ranks[index], group=peer.group)


def _recv(like: torch.Tensor, peer: AxisGroup, index: int) -> torch.Tensor:
    buf = torch.empty_like(like)
    dist.recv(buf, peer.ranks[index], group=peer.group)
    return buf


def gpipe_exchange(model: torch.nn.Module, x: torch.Tensor, pp: AxisGroup, micro_batches: int,
                   run: Callable[[torch.Tensor, torch.Tensor], float]) -> float | None:
    """The hand-written two-stage GPipe on this rank (Huang et al. 2019): stage 0 runs every micro-batch forward
    without keeping activations and sends each down the pp group, then ``run(x, upstream gradient)`` recomputes and
    back-propagates its whole share (re-materialisation, Section 2.3); stage 1 receives every micro-batch, ``run(acts,
    None)`` trains on them and sends their gradients back. ``run`` is the stage's step through the kit's one step
    (:func:`gradients_of`, or a :class:`TrainStep` with an optimizer); stage 1's loss (None on stage 0)."""
    micro = x.chunk(micro_batches)                                             # (b/dp/m, s, h) each
    if pp.index == 0:
        with torch.no_grad():
            outs = [model(mb) for mb in micro]
        for out in outs:
            _send(out, pp, 1)
        run(x, torch.cat([_recv(out, pp, 1) for out in outs]))
        return None
    acts = torch.cat([_recv(mb, pp, 0) for mb in micro]).requires_grad_()
    loss = run(acts, None)
    for g in acts.grad.chunk(micro_batches):
        _send(g, pp, 0)
    return loss


def pipeline_step(shape: StackShape, mesh: Mesh) -> dict:
    """dp x pp or pp x tp: two stages (each tp-split when tp > 1), GPipe by hand (:func:`gpipe_exchange`, with
    :data:`MICRO_BATCHES`): activations go down the pp group, their gradients come back up; stage 0 keeps no
    activations and recomputes its forward in backward (GPipe's re-materialisation, Huang et al. 2019, Section 2.3)."""
    if mesh.pp != 2 or mesh.cp != 1:
        raise ValueError(f"the hand-written pipeline has two stages and no cp; got {mesh.label()}")
    groups = process_groups(mesh)
    pp = groups["pp"]
    model = tp_stack(shape, stage_layers(shape, 2, pp.index), groups["tp"])
    x, probe = local_batch(shape, mesh, groups)
    sync, grads = (lambda m: average_gradients(m, groups["dp"])), {}

    def run(inputs: torch.Tensor, upstream: torch.Tensor | None) -> float:
        loss, got = (gradients_of(model, inputs, upstream, upstream_loss, sync) if upstream is not None else
                     gradients_of(model, inputs, probe, probe_mean_loss, sync, micro_batches=MICRO_BATCHES))
        grads.update(got)
        return loss

    with counting_axes(AxisBytes(groups)) as counter:
        loss = gpipe_exchange(model, x, pp, MICRO_BATCHES, run)
    return {"loss": None if loss is None else mean_over(loss, groups["dp"]), "grads": grads,
            "bytes": counter.per_axis()}


COMPOSITIONS = {
    "dp x tp": (Mesh(dp=2, tp=2), "data_tensor"),
    "fsdp x tp": (Mesh(dp=2, tp=2), "fsdp_tensor"),
    "dp x pp": (Mesh(dp=2, pp=2), "pipeline"),
    "tp x cp": (Mesh(cp=2, tp=2), "data_tensor"),
    "pp x tp": (Mesh(pp=2, tp=2), "pipeline"),
}


def composed_step(name: str, shape: StackShape) -> dict:
    """Run composition ``name`` (a key of :data:`COMPOSITIONS`) on this rank."""
    mesh, kind = COMPOSITIONS[name]
    shape.check(mesh)
    if kind == "pipeline":
        return pipeline_step(shape, mesh)
    return data_tensor_step(shape, mesh, fsdp=kind == "fsdp_tensor")


def compose_job(shape_dict: dict, names: list[str]) -> dict[str, dict]:
    """Launched on 4 ranks: every named composition in turn, this rank's result for each."""
    shape = StackShape(**shape_dict)
    return {name: composed_step(name, shape) for name in names}

