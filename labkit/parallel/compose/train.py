"""A timed training step of any composition on this rank: the planner's runner trains each layout through it.

One :class:`Mesh` (dp, pp, cp, tp), a ZeRO stage, a micro-batch size and checkpointing give this rank's model and
step, built from the compositions of :mod:`.steps` (no second pipeline or ring):
- tp: Megatron's split of every layer (:func:`.model.tp_stack`);
- cp: ring attention over the cp group (:func:`.ring.ring_block_forward`), the sequence in zig-zag shares;
- pp: the hand-written two-stage GPipe (:func:`.steps.gpipe_exchange`) with the layout's micro-batches;
- dp: gradients averaged over dp (x cp) by hand (:func:`.steps.data_parallel_step`), or torch's FSDP2 on the dp
  sub-mesh, each layer then the stack ``fully_shard``-ed (torchtitan's order): ZeRO-3 frees each layer's gathered
  parameters after its forward (``reshard_after_forward=True``) and gathers them again in backward; ZeRO-2 keeps
  them from forward to backward (``False``); gradients and Adam's state are sharded in both (Rajbhandari et al.
  2020). FSDP2 has no ZeRO-1 (optimizer state alone sharded), so neither has this runner.
Every step is the kit's one step (:class:`labkit.core.step.TrainStep`) with the optimizer given.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from labkit.comm.mesh import AxisGroup, Mesh, device_mesh, process_groups
from labkit.core.step import StepOptions, TrainStep
from labkit.parallel.compose.model import StackShape, probe_mean_loss, stage_layers, tp_stack
from labkit.parallel.compose.ring import ring_block_forward
from labkit.parallel.compose.steps import data_parallel_step, gpipe_exchange, local_batch, upstream_loss
from labkit.sharding.memory import count_rank_state_bytes
from labkit.sharding.checkpointing import Checkpointed

ZERO_STAGES = (0, 2, 3)          # 0: gradients all-reduced by hand; 2, 3: FSDP2 (it has no ZeRO-1)


def runner_problem(mesh: Mesh, zero: int = 0) -> str | None:
    """Why this runner cannot execute the mesh and ZeRO stage (one sentence), or None."""
    if zero not in ZERO_STAGES:
        return f"zero={zero}: FSDP2 has no ZeRO-1 (it shards gradients too: ZeRO-2, or everything: ZeRO-3); " \
               f"choose zero in {ZERO_STAGES}"
    if mesh.pp not in (1, 2):
        return f"pp={mesh.pp}: the hand-written GPipe has two stages"
    if mesh.pp > 1 and mesh.cp > 1:
        return "pp x cp: the hand-written GPipe runs no ring attention"
    if zero and (mesh.pp > 1 or mesh.cp > 1):
        return f"zero={zero} with pp or cp: FSDP2 shards over the dp sub-mesh of dp x tp here"
    if zero and mesh.dp == 1:
        return f"zero={zero} shards over data-parallel ranks: needs dp > 1"
    return None


class RingLayer(nn.Module):
    """One tp-split layer whose attention is ring attention over ``cp`` (so it can be checkpointed whole)."""

    def __init__(self, layer: nn.Module, cp: AxisGroup, seq_len: int) -> None:
        super().__init__()
        self.layer, self.cp, self.seq_len = layer, cp, seq_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`ring_block_forward` on this rank's zig-zag tokens."""
        return ring_block_forward(self.layer, x, self.cp, self.seq_len)


def build_model(shape: StackShape, mesh: Mesh, groups: dict[str, AxisGroup], checkpointing: bool = False) -> nn.Module:
    """This rank's layers: its pipeline stage's (all when pp = 1), tp-split, with ring attention when cp > 1, each
    checkpointed (non-reentrant) when asked. Not sharded: :class:`ComposedStep` adds FSDP2."""
    ids = stage_layers(shape, mesh.pp, groups["pp"].index) if mesh.pp > 1 else list(range(shape.layers))
    stack = tp_stack(shape, ids, groups["tp"])
    layers: Iterable[nn.Module] = stack.layers.values()
    if mesh.cp > 1:
        layers = [RingLayer(layer, groups["cp"], shape.seq_len) for layer in layers]
    return nn.Sequential(*(Checkpointed(layer) if checkpointing else layer for layer in layers))


class ComposedStep:
    """``step()``: one training step of this rank's part of the layout (Adam, the layout's micro-batches), on its
    share of the batch (``feed``). ``held`` holds the model state read where the step holds most of it: parameters
    at the end of the first forward (ZeRO-2 still holds them gathered there, ZeRO-3 has freed them), gradients
    after the first backward (sharded by FSDP2, whole otherwise). ``shared``: a dict kept across the steps a rank
    builds, so layouts on one mesh share its process groups (each gloo group holds threads and buffers)."""

    def __init__(self, shape: StackShape, mesh: Mesh, zero: int = 0, micro_batch: int = 1,
                 checkpointing: bool = False,
                 make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                 shared: dict | None = None) -> None:
        problem = runner_problem(mesh, zero)
        if problem:
            raise ValueError(problem)
        shape.check(mesh)
        shared = {} if shared is None else shared        # per mesh: its groups and DeviceMesh, built once per rank
        self.mesh, self.zero = mesh, zero
        if ("groups", mesh) not in shared:                # every rank builds the same layouts in the same order
            shared[("groups", mesh)] = process_groups(mesh)
        self.groups = shared[("groups", mesh)]
        self.model = build_model(shape, mesh, self.groups, checkpointing)
        if zero:
            if ("device_mesh", mesh) not in shared:
                shared[("device_mesh", mesh)] = device_mesh(mesh)
            dp = shared[("device_mesh", mesh)]["dp"]
            for layer in self.model:
                fully_shard(layer, mesh=dp, reshard_after_forward=zero == 3)
            fully_shard(self.model, mesh=dp, reshard_after_forward=zero == 3)
        make_optimizer = make_optimizer or (lambda params: torch.optim.Adam(params, lr=1e-4))
        self.optimizer = make_optimizer(self.model.parameters())
        self.feed = local_batch(shape, mesh, self.groups)
        self.micro_batches = self.feed[0].shape[0] // micro_batch
        self.held: dict[str, int] = {}
        self.model.register_forward_hook(self._read_params)
        self.step = self._train_step()

    def _read_params(self, model: nn.Module, *_: object) -> None:
        if "params" not in self.held:
            self.held["params"] = count_rank_state_bytes(model.parameters())["params"]

    def _read_grads(self, model: nn.Module) -> None:
        if "grads" not in self.held:
            self.held["grads"] = count_rank_state_bytes(model.parameters())["grads"]

    def _train_step(self) -> TrainStep:
        """The kit's one step for this rank: stage 0 of a pipeline back-propagates the gradient stage 1 sent (one
        pass over its share), every other rank the probe loss over the layout's micro-batches."""
        first_stage = self.mesh.pp > 1 and self.groups["pp"].index == 0
        loss_fn = upstream_loss if first_stage else probe_mean_loss
        options = StepOptions(accumulation_steps=1 if first_stage else self.micro_batches)
        if self.zero:                                       # FSDP2 reduce-scatters the gradients itself
            return TrainStep(self.model, self.optimizer, loss_fn=loss_fn, options=options, grad_hook=self._read_grads)
        return data_parallel_step(self.model, self.mesh, self.groups, self.optimizer, loss_fn, options,
                                  before_sync=self._read_grads)

    def __call__(self) -> float | None:
        """One training step; the loss on ranks that compute it (None on pipeline stage 0)."""
        x, probe = self.feed
        if self.mesh.pp == 1:
            return float(self.step(x, probe).loss)
        return gpipe_exchange(self.model, x, self.groups["pp"], self.micro_batches,
                              lambda inputs, upstream: float(self.step(inputs, probe if upstream is None
                                                                       else upstream).loss))

    def activation_inputs(self) -> torch.Tensor:
        """What this rank forwards with autograd recording at once: one micro-batch, or on pipeline stage 0 its whole
        share (GPipe recomputes every micro-batch's forward together in backward)."""
        x = self.feed[0]
        first_stage = self.mesh.pp > 1 and self.groups["pp"].index == 0
        return x.clone() if first_stage else x[:x.shape[0] // self.micro_batches].clone()

