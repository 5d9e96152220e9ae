"""A node fails, the job goes on: checkpointed synchronous SGD under torchrun's elastic agent (rank side).

Every rank trains the kit's toy problem with synchronous SGD (:mod:`labkit.training.reference`, :mod:`labkit.parallel.data.sync_sgd`: the same batches,
gradients averaged by all-reduce); rank 0 saves model and optimizer state every ``every_k`` steps (written to a
temporary file, then renamed, so a crash never leaves half a checkpoint). When a node's workers die, torchrun's
agents (``--max-restarts``) stop the survivors, meet again at the rendezvous and start every worker anew; each
loads the last checkpoint with ``torch.load(..., weights_only=True)`` and carries on from its step. Rank 0 logs
every step it completes (attempt, step, wall-clock time) so the lesson can show which steps ran twice and how long
recovery took, and compares the final weights with the kit's single-process reference.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from labkit.cluster.rankside import job_params, place, report
from labkit.core.clock import timestamp_s
from labkit.core.step import TrainStep
from labkit.parallel.data.sync_sgd import sync_gradients, sync_initial_weights, torch_allreduce_sum, torch_broadcast
from labkit.training.reference import (ToyProblem, build_toy_model, max_weight_difference, shard, toy_batch,
                                       toy_optimizer, train_single_process)

CHECKPOINT = "last.pt"
STEP_LOG = "steps.log"


def save_checkpoint(folder: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Model and optimizer state after ``step`` steps, written atomically (temporary file, then rename)."""
    tmp = folder / (CHECKPOINT + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, folder / CHECKPOINT)


def load_checkpoint(folder: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Restore the last checkpoint if there is one (tensors only: ``weights_only=True``); the step to start from."""
    path = folder / CHECKPOINT
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def elastic_training() -> dict:
    """Train ``steps`` steps with a checkpoint every ``every_k``; resume from the checkpoint after a restart."""
    torch.set_num_threads(1)
    me = place()
    params, folder = job_params(), Path(os.environ["LABKIT_RESULT_DIR"])
    steps, every_k, pace_s = int(params["steps"]), int(params["every_k"]), float(params.get("pace_s", 0.0))
    problem = ToyProblem(seed=int(params.get("seed", 0)))
    attempt = int(os.environ.get("LABKIT_START", "0"))   # set when the rank joined (labkit.comm.worker)
    model = build_toy_model(problem, init_seed=problem.seed + me.rank)
    sync_initial_weights(model, torch_broadcast, src=0)
    opt = toy_optimizer(model, problem)
    start = load_checkpoint(folder, model, opt)
    train_step = TrainStep(model, opt,                                   # gradients averaged before the update
                           grad_hook=lambda m: sync_gradients(m, torch_allreduce_sum, me.world_size, bucket=True))
    for step in range(start, steps):
        x, y = toy_batch(problem, step, me.world_size * problem.micro_batch)
        train_step(shard(x, me.rank, me.world_size), shard(y, me.rank, me.world_size))
        time.sleep(pace_s)          # stands in for a longer step: time to kill a node mid-run (this one takes ~1 ms)
        if me.rank == 0:
            with open(folder / STEP_LOG, "a", encoding="utf-8") as f:
                f.write(f"{attempt} {step} {timestamp_s():.6f}\n")
            if (step + 1) % every_k == 0:
                save_checkpoint(folder, model, opt, step + 1)
    dist.barrier()
    final = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reference = train_single_process(me.world_size, steps=steps, seed=problem.seed)
    log = (folder / STEP_LOG).read_text() if me.rank == 0 else ""
    return report({"rank": me.rank, "attempt": attempt, "started_at_step": start, "step_log": log,
                   "max_diff_vs_reference": max_weight_difference(final, reference)}, me.rank)
