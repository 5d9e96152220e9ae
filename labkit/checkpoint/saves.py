"""Saving and resuming on real ranks: rank-0 ``torch.save`` against DCP, a save that runs out of disk, a rank killed
mid-save, and a resume on another number of ranks compared exactly with what was saved.

``run_save`` trains on N ranks, saves with ``dcp.save`` (each rank its shards) and with the classic rank-0
``torch.save`` of the gathered state, measures each rank's time and peak resident memory (``labkit.memory.host``),
continues training uninterrupted (the reference losses), then tries one more save whose writer fails with ENOSPC.
``run_killed_save`` resumes and SIGKILLs one rank inside ``dcp.save``. ``run_resume`` loads the newest complete
checkpoint on M ranks and trains on; it also trains a rival that reloads the weights but starts Adam afresh.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from labkit.checkpoint.store import (FailingWriter, latest_complete, load_state, save_error_line, save_state,
                                     step_folder)
from labkit.checkpoint.trainer import CheckpointConfig, Trainer, build_sharded, full_state, held_state_bytes
from labkit.comm.launch import RankFailedError, launch
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.validation import positive_int
from labkit.memory.host import measure_host_peak_bytes

TORCH_SAVE_FILE = "rank0_full.pt"


def _timed_peak(work: Callable[[], object]) -> tuple[float, int]:
    """(seconds, peak resident bytes above the start) of ``work()``, all ranks started together. Both from one run:
    while measuring, glibc unmaps every large block at free (``labkit.memory.host``), which slows both saves alike."""
    dist.barrier()
    start = now_s()
    peak = measure_host_peak_bytes(work)
    return now_s() - start, peak


def save_worker(cfg_dict: dict, root: str, enospc_rank: int) -> dict:
    """Run inside ``launch``: train, save with DCP and with rank-0 torch.save, train on, then a save that hits ENOSPC."""
    torch.set_num_threads(1)
    cfg, rank = CheckpointConfig(**cfg_dict), dist.get_rank()
    model, optimizer = build_sharded(cfg)
    trainer = Trainer(cfg, model, optimizer)
    with ShareMeter() as meter:
        losses_before = trainer.run(0, cfg.steps_before)
        path = step_folder(root, cfg.steps_before)
        dcp_s, dcp_peak = _timed_peak(lambda: save_state(model, optimizer, path))
        kept: dict = {}

        def gather_and_save() -> None:
            kept["state"] = full_state(model, optimizer)      # every rank sends its shards to rank 0
            if rank == 0:
                torch.save(kept["state"], Path(root) / TORCH_SAVE_FILE)
        torch_s, torch_peak = _timed_peak(gather_and_save)
    losses_after = trainer.run(cfg.steps_before, cfg.steps_after)
    failed = step_folder(root, cfg.steps_before + cfg.steps_after)
    try:
        save_state(model, optimizer, failed, writer=FailingWriter(failed, enospc_rank, "enospc"))
        error_line = None
    except (CheckpointException, OSError) as err:    # CheckpointException is a BaseException, not an Exception
        error_line = save_error_line(err, failed)
    return {"rank": rank, "world_size": dist.get_world_size(), "dcp_save_s": dcp_s, "dcp_peak_bytes": dcp_peak,
            "torch_save_s": torch_s, "torch_save_peak_bytes": torch_peak, "held_bytes": held_state_bytes(model, optimizer),
            "losses_before": losses_before, "losses_after": losses_after, "saved_state": kept["state"],
            "enospc_line": error_line, "cpu_share": meter.share}


def run_save(cfg: CheckpointConfig, root: str | Path, world_size: int = 4, enospc_rank: int = 1,
             timeout_s: float = 120.0) -> list[dict]:
    """Launch :func:`save_worker` on ``world_size`` ranks; one result per rank (rank 0 holds the saved state)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    return launch(save_worker, positive_int(world_size, "world_size"), args=(asdict(cfg), str(root), enospc_rank),
                  timeout_s=timeout_s, show_output=False)


def resume_worker(cfg_dict: dict, root: str) -> dict:
    """Run inside ``launch``: load the newest complete checkpoint on this world size, gather what was loaded, keep
    this rank's shards, train on; then the rival: same weights, Adam started afresh."""
    torch.set_num_threads(1)
    cfg, rank = CheckpointConfig(**cfg_dict), dist.get_rank()
    path = latest_complete(root)
    if path is None:
        raise FileNotFoundError(f"no complete checkpoint under {root}")
    model, optimizer = build_sharded(cfg)
    load_state(model, optimizer, path)
    loaded = full_state(model, optimizer)
    shards = {name: p.to_local().detach().clone() for name, p in model.named_parameters()}
    losses = Trainer(cfg, model, optimizer).run(cfg.steps_before, cfg.steps_after)
    rival_model, rival_optimizer = build_sharded(cfg)
    load_state(rival_model, rival_optimizer, path, with_optimizer=False)
    rival = Trainer(cfg, rival_model, rival_optimizer).run(cfg.steps_before, cfg.steps_after)
    return {"rank": rank, "world_size": dist.get_world_size(), "loaded_from": Path(path).name,
            "loaded_state": loaded, "shards": shards, "losses_after": losses, "fresh_adam_losses": rival}


def run_resume(cfg: CheckpointConfig, root: str | Path, world_size: int, timeout_s: float = 120.0) -> list[dict]:
    """Launch :func:`resume_worker` on ``world_size`` ranks; one result per rank."""
    return launch(resume_worker, positive_int(world_size, "world_size"), args=(asdict(cfg), str(root)),
                  timeout_s=timeout_s, show_output=False)


def killed_save_worker(cfg_dict: dict, root: str, kill_rank: int) -> None:
    """Run inside ``launch``: resume from the newest complete checkpoint, train, and save again, rank ``kill_rank``
    SIGKILLed mid-write (the others are stopped by the launcher while they wait for it)."""
    torch.set_num_threads(1)
    cfg = CheckpointConfig(**cfg_dict)
    model, optimizer = build_sharded(cfg)
    load_state(model, optimizer, latest_complete(root))
    Trainer(cfg, model, optimizer).run(cfg.steps_before, cfg.steps_after + 1)
    path = step_folder(root, cfg.steps_before + cfg.steps_after + 1)
    save_state(model, optimizer, path, writer=FailingWriter(path, kill_rank, "kill"))


def run_killed_save(cfg: CheckpointConfig, root: str | Path, world_size: int = 2, kill_rank: int = 1,
                    timeout_s: float = 120.0) -> tuple[Path, str]:
    """(the folder the killed save left, the launcher's one-line account of the death)."""
    try:
        launch(killed_save_worker, positive_int(world_size, "world_size"), args=(asdict(cfg), str(root), kill_rank),
               timeout_s=timeout_s, show_output=False)
    except RankFailedError as err:
        return step_folder(root, cfg.steps_before + cfg.steps_after + 1), err.summary.split(" (")[0]  # no OOM guess
    raise RuntimeError(f"rank {kill_rank} was to be killed mid-save, but the save finished")
