"""Resharding across a dp x tp split: a checkpoint saved on a 2-D mesh loaded on another split of the ranks.

The model is the float64 MLP of :mod:`labkit.checkpoint.trainer`, placed on the kit's one grid
(:class:`labkit.comm.mesh.Mesh` and its ``device_mesh``) the way torchtitan composes FSDP2 with tensor parallelism:
``parallelize_module`` on the tp axis (Megatron's column- then row-parallel pair, the last layer column-parallel with
its output replicated), then ``fully_shard`` on the dp axis, so each parameter is a DTensor cut over both axes.
``dcp.save`` writes what each rank holds, with the global offsets; a run on another split (dp4 x tp1 on the same 4
ranks, dp1 x tp2 on 2 ranks) loads it with ``dcp.load``, every rank reading the pieces that overlap its own cut.
The global batch of a step is the same for any split (seeded by the step); each dp group trains on its slice.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from labkit.checkpoint.store import load_state, save_state, step_folder
from labkit.checkpoint.trainer import CheckpointConfig, full_state, global_batch, state_differences
from labkit.comm.launch import launch
from labkit.comm.mesh import Mesh, device_mesh
from labkit.core.models import mlp
from labkit.core.step import StepOptions, TrainStep

SAVED_ON = Mesh(dp=2, tp=2)
LOADED_ON = (Mesh(dp=4), Mesh(tp=2))          # the same 4 ranks cut another way; half the ranks, tp only


def tp_plan() -> dict:
    """Megatron's split of the MLP (layers 0, 2, 4 of the Sequential): column-parallel, row-parallel, and the
    classifier column-parallel with its logits gathered (replicated), so every tp rank computes the same loss."""
    return {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(output_layouts=Replicate())}


def build_on_mesh(cfg: CheckpointConfig, mesh: Mesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(model, Adam) on ``mesh``: tp by ``parallelize_module``, then dp by FSDP2's ``fully_shard`` (axes of size 1
    skipped); the same seeded weights on every split."""
    torch.manual_seed(cfg.seed)
    model = mlp(cfg.widths).double()
    dm = device_mesh(mesh)
    if mesh.tp > 1:
        parallelize_module(model, dm["tp"], tp_plan())
    if mesh.dp > 1:
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=dm["dp"])
        fully_shard(model, mesh=dm["dp"])
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def train_on_mesh(cfg: CheckpointConfig, mesh: Mesh, model: nn.Module, optimizer: torch.optim.Optimizer,
                  first_step: int, steps: int) -> list[float]:
    """Steps ``first_step ..``: each dp group its slice of the global batch; the global mean loss of each step."""
    dp_index = mesh.coords(dist.get_rank())["dp"]
    per_group = cfg.global_batch // mesh.dp
    step_fn = TrainStep(model, optimizer, device=torch.device("cpu"), options=StepOptions())
    losses = []
    for step in range(first_step, first_step + steps):
        x, y = global_batch(cfg, step)
        lo = dp_index * per_group
        loss = step_fn(x[lo:lo + per_group], y[lo:lo + per_group]).loss.clone()
        dist.all_reduce(loss)                        # tp ranks hold equal losses: the mean over all is the dp mean
        losses.append(float(loss) / dist.get_world_size())
    return losses


def local_cuts(model: nn.Module) -> dict[str, dict]:
    """Each parameter's local shape on this rank and its placements (e.g. '(_StridedShard(dim=0..), Shard(dim=0))')."""
    out = {}
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out[name] = {"shape": tuple(local.shape), "placements": str(getattr(p, "placements", "plain tensor"))}
    return out


def copied(state: object) -> object:
    """A deep copy of a (nested) state dict's tensors: a replicated DTensor's full tensor is the live parameter
    itself on CPU, and the next optimizer step would change the "saved" copy under us."""
    if isinstance(state, dict):
        return {k: copied(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(copied(v) for v in state)
    return state.detach().clone() if isinstance(state, torch.Tensor) else state


def load_and_train(cfg: CheckpointConfig, mesh: Mesh, path: Path) -> dict:
    """Build on ``mesh``, load ``path``, gather what was loaded (rank 0), train ``steps_after`` steps."""
    model, optimizer = build_on_mesh(cfg, mesh)
    load_state(model, optimizer, path)
    loaded = copied(full_state(model, optimizer))
    cuts = local_cuts(model)
    losses = train_on_mesh(cfg, mesh, model, optimizer, cfg.steps_before, cfg.steps_after)
    return {"split": mesh.label(), "world_size": mesh.world_size, "loaded_state": loaded, "cuts": cuts,
            "losses_after": losses}


def save_and_reload_worker(cfg_dict: dict, root: str) -> dict:
    """Run inside ``launch`` on 4 ranks: train on dp2 x tp2, save with DCP, gather the saved state, train on (the
    uninterrupted losses); then load the checkpoint on dp4 x tp1 on the same ranks and train on again."""
    torch.set_num_threads(1)
    cfg = CheckpointConfig(**cfg_dict)
    model, optimizer = build_on_mesh(cfg, SAVED_ON)
    train_on_mesh(cfg, SAVED_ON, model, optimizer, 0, cfg.steps_before)
    path = step_folder(root, cfg.steps_before)
    save_state(model, optimizer, path)
    saved = {"split": SAVED_ON.label(), "saved_state": copied(full_state(model, optimizer)), "cuts": local_cuts(model),
             "losses_after": train_on_mesh(cfg, SAVED_ON, model, optimizer, cfg.steps_before, cfg.steps_after)}
    return {"rank": dist.get_rank(), "saved": saved, "resumed": load_and_train(cfg, LOADED_ON[0], path)}


def reload_worker(cfg_dict: dict, root: str) -> dict:
    """Run inside ``launch`` on 2 ranks: load the dp2 x tp2 checkpoint on dp1 x tp2 and train on."""
    torch.set_num_threads(1)
    cfg = CheckpointConfig(**cfg_dict)
    return {"rank": dist.get_rank(), "resumed": load_and_train(cfg, LOADED_ON[1], step_folder(root, cfg.steps_before))}


def run_mesh_reshard(cfg: CheckpointConfig, root: str | Path, timeout_s: float = 120.0) -> dict:
    """Save on dp2 x tp2 (4 ranks) and reload on dp4 x tp1 and dp1 x tp2; {"saved": rank 0's, split: rank 0's}."""
    Path(root).mkdir(parents=True, exist_ok=True)
    four = launch(save_and_reload_worker, SAVED_ON.world_size, args=(asdict(cfg), str(root)), timeout_s=timeout_s,
                  show_output=False)
    two = launch(reload_worker, LOADED_ON[1].world_size, args=(asdict(cfg), str(root)), timeout_s=timeout_s,
                 show_output=False)
    return {"saved": four[0]["saved"], LOADED_ON[0].label(): four[0]["resumed"],
            LOADED_ON[1].label(): two[0]["resumed"], "cuts_by_rank": {
                SAVED_ON.label(): [r["saved"]["cuts"] for r in four],
                LOADED_ON[0].label(): [r["resumed"]["cuts"] for r in four],
                LOADED_ON[1].label(): [r["resumed"]["cuts"] for r in two]}}


def reshard_rows(run: dict) -> list[dict]:
    """One row per split: state differences against the saved state (exact) and the largest loss gap to the
    uninterrupted dp2 x tp2 run."""
    saved = run["saved"]
    rows = [{"split": saved["split"], "ranks": SAVED_ON.world_size, "state_differences": 0, "max_loss_gap": 0.0}]
    for mesh in LOADED_ON:
        got = run[mesh.label()]
        rows.append({"split": mesh.label(), "ranks": mesh.world_size,
                     "state_differences": len(state_differences(got["loaded_state"], saved["saved_state"])),
                     "max_loss_gap": max(abs(a - b) for a, b in zip(got["losses_after"], saved["losses_after"]))})
    return rows
