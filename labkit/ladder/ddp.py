"""The ladder's last rung: the same recipe on one process per local device with DistributedDataParallel
(NCCL with one GPU per rank; gloo processes on a CPU), started through :func:`labkit.comm.launch.launch`.

Each rank trains on its shard (a DistributedSampler) at the per-process batch; the global batch is
``world_size`` times larger and the learning rate is scaled with it (Goyal et al. 2017). DDP overlaps
the gradient all-reduce with the backward pass, bucket by bucket (Li et al. 2020, PyTorch Distributed).
"""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from labkit.comm.launch import launch
from labkit.core.data import make_device_loader, make_loader
from labkit.core.env import seed_everything
from labkit.core.timing import Stopwatch
from labkit.ladder.measure import Measurement, measure_model
from labkit.ladder.rungs import Recipe
from labkit.training.run_spec import RunSpec

if TYPE_CHECKING:
    from labkit.core.data import ImageData
    from labkit.core.device_loader import DeviceLoader


class EpochAdvancingSampler(DistributedSampler):
    """A DistributedSampler that reshuffles on every pass (the loop does not call ``set_epoch``)."""

    def __iter__(self):
        indices = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return indices


def shard_loader(dataset: Dataset, recipe: Recipe, rank: int, world_size: int, seed: int,
                 device: str = "cpu") -> DataLoader | DeviceLoader:
    """This rank's training loader: its shard of ``dataset`` at the per-process batch size."""
    if recipe.device_data:               # this rank's fixed shard, held on its own device
        shard = Subset(dataset, list(range(rank, len(dataset), world_size)))
        return make_device_loader(shard, recipe.batch_size, device=device, shuffle=True, drop_last=True, seed=seed)
    sampler = EpochAdvancingSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                    drop_last=True)
    extra = {}
    if recipe.num_workers:
        extra = {"prefetch_factor": recipe.prefetch_factor, "persistent_workers": recipe.persistent_workers}
    return DataLoader(dataset, batch_size=recipe.batch_size, sampler=sampler, num_workers=recipe.num_workers,
                      pin_memory=recipe.pin_memory and torch.cuda.is_available(), drop_last=True, **extra)


def ddp_rung_worker(job: dict) -> dict:
    """One rank of the DDP rung (runs inside ``launch``'s process group); returns its measurement."""
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe: Recipe = job["recipe"]
    on_gpu = dist.get_backend() == "nccl"
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    run = job["run"]
    seed_everything(run.seed)
    model = job["model_fn"]().to(device)                 # same seed -> same weights; DDP also broadcasts rank 0's
    if recipe.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[torch.cuda.current_device()] if on_gpu else None)
    loader = shard_loader(job["train"], recipe, rank, world, run.seed, device)
    val = make_loader(job["val"], min(256, len(job["val"]))) if rank == 0 else None
    with Stopwatch(device) as sw:
        m = measure_model(ddp, loader, val, recipe, run, steps=job["steps"], device=device,
                          warmup_steps=job["warmup_steps"], eval_model=model)
    return {"measurement": m, "train_wall_s": sw.elapsed_s}


def measure_ddp(recipe: Recipe, run: RunSpec, model_fn: Callable[[], nn.Module], data: ImageData, *, steps: int,
                warmup_steps: int, timeout_s: float, threads_per_rank: int) -> Measurement:
    """Run ``recipe`` as ``run`` (its per-process batch, the LR scaled to the global batch) on ``recipe.world_size``
    processes and combine the ranks into one measurement.

    Throughput is the sum over ranks (they step in lockstep); start-up adds the process launch
    (interpreter, torch import, process group) to rank 0's warm-up cost.
    """
    job = {"recipe": recipe, "run": run, "model_fn": model_fn, "train": data.train, "val": data.val, "steps": steps,
           "warmup_steps": warmup_steps}
    with Stopwatch() as sw:
        ranks = launch(ddp_rung_worker, recipe.world_size, args=(job,), timeout_s=timeout_s,
                       threads_per_rank=threads_per_rank, show_output=False)
    ms: list[Measurement] = [r["measurement"] for r in ranks]
    launch_overhead_s = max(0.0, sw.elapsed_s - max(r["train_wall_s"] for r in ranks))
    peaks = [m.peak_mem_bytes for m in ms if m.peak_mem_bytes is not None]
    return Measurement(
        samples_per_s=sum(m.samples_per_s for m in ms), step_time_s=max(m.step_time_s for m in ms),
        data_wait_fraction=statistics.fmean(m.data_wait_fraction for m in ms),
        peak_mem_bytes=max(peaks) if peaks else None, flops_per_sample=ms[0].flops_per_sample,
        val_accuracy=ms[0].val_accuracy, startup_s=ms[0].startup_s + launch_overhead_s, steps=ms[0].steps,
        samples_trained=sum(m.samples_trained for m in ms), math_mode=ms[0].math_mode)
