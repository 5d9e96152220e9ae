"""A rank worker for the pipeline tests: rank 0 stops sending after the warm-up step (a stuck stage, provoked from the
test's side; the library has no test-only branch for it)."""
from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist

from labkit.parallel.pipeline.schedules import PipeConfig, schedules_worker


def rank_zero_stops_after_warm_up(runs: list[dict], cfg: PipeConfig, repeats: int, probe: bool = True) -> dict:
    """Rank 0 runs the warm-up step only, meets the others at the timed step's barrier, then never sends."""
    if dist.get_rank() != 0:
        return schedules_worker(runs, cfg, repeats, probe)
    schedules_worker(runs, cfg, 0, probe)
    dist.barrier()
    time.sleep(3600)
    return {}


def rank_zero_freezes_after_warm_up(runs: list[dict], cfg: PipeConfig, repeats: int, probe: bool = True) -> dict:
    """Rank 0 runs the warm-up step, meets the others at the timed step's barrier, then freezes itself (SIGSTOP:
    state T, as Ctrl-Z or a debugger would leave it)."""
    if dist.get_rank() != 0:
        return schedules_worker(runs, cfg, repeats, probe)
    schedules_worker(runs, cfg, 0, probe)
    dist.barrier()
    os.kill(os.getpid(), signal.SIGSTOP)
    return {}
