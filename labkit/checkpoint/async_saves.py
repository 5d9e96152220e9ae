"""Blocking ``dcp.save`` against ``dcp.async_save`` every k steps: how long training waits, in paired rounds.

``dcp.async_save`` copies this rank's shards to a CPU staging buffer, returns a future, and writes the files in a
background thread while training goes on; training waits only for the copy (and, at the next save, for the previous
write to end). Its collectives run on their own gloo process group, as PyTorch's DCP docs advise, so the saving
thread never interleaves its messages with the training's on the default group. Each round runs k steps and a
blocking save, then k steps and an async save (the order alternating), so both sides see the same machine; each
rank reports the time it waited in each save, and its CPU share for the verdict (``labkit.core.verdict``).
"""
from __future__ import annotations

import shutil
import statistics
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from labkit.checkpoint.store import save_state
from labkit.checkpoint.trainer import CheckpointConfig, Trainer, build_sharded, held_state_bytes
from labkit.comm.launch import launch
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.validation import positive_int
from labkit.core.verdict import Load, Rival, Verdict, judge_at_least, relative_spread
from labkit.memory.host import measure_host_peak_bytes

MODES = ("blocking", "async")
ASYNC_SPEEDUP_FLOOR = 1.5   # the claim: async waits at most 1/1.5 of blocking's time (rival: the same, 1.0x)
RIVAL_SAME_COST = "async saves cost the same as blocking (1.0x)"


def _steps(trainer: Trainer, first: int, k: int, timeline: list, t0: float) -> None:
    """k steps, each one's (kind, start, end) seconds since ``t0`` appended to ``timeline``."""
    for step in range(first, first + k):
        start = now_s()
        trainer.run(step, 1)
        timeline.append(("step", start - t0, now_s() - t0))


def _one_round(mode: str, trainer: Trainer, state_of, path: Path, group, first: int, k: int,  # noqa: ANN001
               timeline: list, t0: float) -> float:
    """k steps, a save, k steps (the write overlapping them when async), then waiting for it: seconds waited."""
    _steps(trainer, first, k, timeline, t0)
    start = now_s()
    if mode == "blocking":
        save_state(trainer.model, trainer.optimizer, path)
        waited = now_s() - start
        timeline.append(("save (training waits)", start - t0, now_s() - t0))
        _steps(trainer, first + k, k, timeline, t0)
        return waited
    future = dcp.async_save(state_of(), checkpoint_id=str(path), process_group=group)
    waited = now_s() - start
    timeline.append(("async_save returns", start - t0, now_s() - t0))
    _steps(trainer, first + k, k, timeline, t0)
    start = now_s()
    future.result()
    timeline.append(("wait for the write", start - t0, now_s() - t0))
    return waited + now_s() - start


def async_worker(cfg_dict: dict, root: str, rounds: int, every_k: int) -> dict:
    """Run inside ``launch``: paired rounds of blocking and async saves every ``every_k`` steps; the staging copy's
    memory measured on one more async save."""
    torch.set_num_threads(1)
    cfg, rank = CheckpointConfig(**cfg_dict), dist.get_rank()
    model, optimizer = build_sharded(cfg)
    trainer = Trainer(cfg, model, optimizer)
    trainer.run(0, 1)                                   # Adam's moments exist from here on
    group = dist.new_group(backend="gloo")              # the background writer's own collectives

    def state_of() -> dict:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {"model": model_sd, "optim": optim_sd}
    waited: dict[str, list[float]] = {m: [] for m in MODES}
    timelines: dict[str, list] = {m: [] for m in MODES}
    step = 1
    with ShareMeter() as meter:
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                dist.barrier()
                timeline: list = []
                waited[mode].append(_one_round(mode, trainer, state_of, Path(root) / f"timing_{mode}", group,
                                               step, every_k, timeline, now_s()))
                timelines[mode] = timeline              # the last round's, for the figure
                step += 2 * every_k
    dist.barrier()
    kept: list = []
    staging_peak = measure_host_peak_bytes(
        lambda: kept.append(dcp.async_save(state_of(), checkpoint_id=str(Path(root) / "timing_async"),
                                           process_group=group)))
    kept[0].result()
    dist.barrier()
    if rank == 0:
        for mode in MODES:
            shutil.rmtree(Path(root) / f"timing_{mode}", ignore_errors=True)
    return {"rank": rank, "waited_s": waited, "timelines": timelines, "staging_peak_bytes": staging_peak,
            "cpu_share": meter.share, "every_k": every_k, "held_bytes": held_state_bytes(model, optimizer)}


def run_async(cfg: CheckpointConfig, root: str | Path, world_size: int = 2, rounds: int = 4, every_k: int = 2,
              timeout_s: float = 150.0) -> list[dict]:
    """Launch :func:`async_worker`; one result per rank."""
    Path(root).mkdir(parents=True, exist_ok=True)
    return launch(async_worker, positive_int(world_size, "world_size"),
                  args=(asdict(cfg), str(root), positive_int(rounds, "rounds"), positive_int(every_k, "every_k")),
                  timeout_s=timeout_s, show_output=False)


def waits_by_round(results: list[dict]) -> list[tuple[float, float]]:
    """(blocking, async) seconds training waited in each round: the slowest rank's, as the next step waits for it."""
    rounds = len(results[0]["waited_s"]["blocking"])
    return [(max(r["waited_s"]["blocking"][i] for r in results), max(r["waited_s"]["async"][i] for r in results))
            for i in range(rounds)]


def async_verdict(results: list[dict]) -> Verdict:
    """Async waits at least ASYNC_SPEEDUP_FLOOR x less than blocking, judged on paired rounds and the ranks' load."""
    pairs = waits_by_round(results)
    ratios = [b / a for b, a in pairs]
    load = Load.of_ranks(results, spread=relative_spread(ratios))
    return judge_at_least(f"dcp.async_save keeps training waiting >= {ASYNC_SPEEDUP_FLOOR}x less than a blocking "
                          "dcp.save", statistics.median(ratios), ASYNC_SPEEDUP_FLOOR, load=load,
                          by_round=[(r, ASYNC_SPEEDUP_FLOOR) for r in ratios], rival=Rival(RIVAL_SAME_COST, 1.0))
