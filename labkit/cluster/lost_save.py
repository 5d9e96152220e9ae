"""A node lost in the middle of a DCP save on the emulated cluster, and the job resumed on the node that is left.

:func:`run_lost_save` runs :func:`saving_job` on 2 emulated nodes x 2 ranks (``labkit.cluster.run``): the FSDP2 MLP
and Adam of ``labkit.checkpoint.trainer``, a ``dcp.save`` every ``every_k`` steps into ``<folder>/checkpoints``
(the nodes share the host's disk, as a cluster shares a parallel file system). At the last save the ranks of the
victim node write the first bytes of their shard, mark in the run folder that they are inside the save, and wait;
the killer waits for those marks, then SIGKILLs the node's training processes (``failover.training_pids``). The
kill lands inside the save every time, not by luck. The save never gets its ``.metadata``.
:func:`run_resume_on_survivor` then starts the job on the surviving node alone (2 ranks, the job had 4): it refuses
the half-written folder, loads the last complete one (DCP re-cuts the shards 4 -> 2), gathers what it loaded for an
exact comparison with the state rank 0 gathered at that save, and trains on the batches the lost job trained on.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner

from labkit.checkpoint.store import (PARTIAL_WRITE_BYTES, IncompleteCheckpointError, check_complete, is_complete,
                                     latest_complete, load_state, save_state, step_folder, step_folders)
from labkit.checkpoint.trainer import CheckpointConfig, Trainer, build_sharded, full_state, state_differences
from labkit.cluster.failover import training_pids
from labkit.cluster.faults import fault_message, watch_job
from labkit.cluster.link_jobs import join_node_group
from labkit.cluster.nodes import EmulatedNodes
from labkit.cluster.rankside import job_params, report
from labkit.cluster.run import RANK_MARKS, JobFailed, job_env, node_command, run_job
from labkit.core.clock import Deadline, timestamp_s
from labkit.core.validation import checked_int, positive_int, positive_number

SAVE_TARGET = "labkit.cluster.lost_save:saving_job"
RESUME_TARGET = "labkit.cluster.lost_save:resume_job"
CHECKPOINTS = "checkpoints"
LOSSES = "losses.log"            # rank 0's "step loss" lines, flushed as it goes: the uninterrupted run's losses
EVENTS = "events.log"            # rank 0's "kind start end" lines (wall clock): the timeline's steps and saves
MID_SAVE = "mid-save"            # the marks "rank<R>" the victim's ranks leave once inside the save
POLL_S = 0.02


@dataclass(frozen=True)
class LostSaveConfig:
    """Saves every ``every_k`` steps, ``complete_saves`` of them before the one the node is lost in; the victim node."""

    every_k: int = 2
    complete_saves: int = 1
    victim: int = 1
    procs_per_node: int = 2
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        positive_int(self.every_k, "every_k")
        positive_int(self.complete_saves, "complete_saves", hint="a complete checkpoint must exist to resume from")
        checked_int(self.victim, "victim", minimum=1, hint="node 0 holds the rendezvous: lose another node")
        positive_int(self.procs_per_node, "procs_per_node")
        positive_number(self.timeout_s, "timeout_s")

    @property
    def lost_step(self) -> int:
        """The step whose save the node is lost in."""
        return self.every_k * (self.complete_saves + 1)

    @property
    def resume_step(self) -> int:
        """The step of the last complete checkpoint: where the survivor resumes."""
        return self.every_k * self.complete_saves


class MidSaveWriter(FileSystemWriter):
    """A ``FileSystemWriter`` whose ranks in ``victims`` write the first bytes of their shard, mark that they are
    inside the save, and wait to be killed (a ``TimeoutError`` after ``wait_s``); the other ranks write as usual."""

    def __init__(self, path: str | Path, victims: list[int], marks: str | Path, wait_s: float) -> None:
        super().__init__(str(path))
        self.folder, self.victims, self.marks, self.wait_s = Path(path), list(victims), Path(marks), wait_s

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Write as FileSystemWriter does, except on a victim rank: part of a shard, the mark, then wait."""
        rank = dist.get_rank()
        if rank not in self.victims:
            return super().write_data(plan, planner)
        with open(self.folder / f"__{rank}_0.distcp", "wb") as half:
            half.write(b"\0" * PARTIAL_WRITE_BYTES)
        (self.marks / f"rank{rank}").write_text(f"{timestamp_s():.6f}")
        deadline = Deadline(self.wait_s)
        while not deadline.expired:
            time.sleep(POLL_S)
        raise TimeoutError(f"rank {rank} waited {self.wait_s:g} s inside the save and was never killed")


def _log(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def saving_job() -> dict:
    """Rank side: train, save with DCP every ``every_k`` steps (rank 0 keeps the gathered state of each complete
    save for the comparison); the last save is the one the victim node is killed in."""
    me = join_node_group()
    params = job_params()
    cfg, lost = CheckpointConfig(**params["cfg"]), LostSaveConfig(**params["lost"])
    folder = Path(params["folder"])
    victims = list(range(lost.victim * me.local_world_size, (lost.victim + 1) * me.local_world_size))
    model, optimizer = build_sharded(cfg)
    trainer = Trainer(cfg, model, optimizer)
    for step in range(lost.lost_step):
        start = timestamp_s()
        loss = trainer.run(step, 1)[0]
        if me.rank == 0:
            _log(folder / LOSSES, f"{step} {loss!r}")
            _log(folder / EVENTS, f"step{step} {start:.6f} {timestamp_s():.6f}")
        if (step + 1) % lost.every_k:
            continue
        path, start = step_folder(folder / CHECKPOINTS, step + 1), timestamp_s()
        if step + 1 == lost.lost_step:
            save_state(model, optimizer, path, writer=MidSaveWriter(path, victims, folder / MID_SAVE,
                                                                    lost.timeout_s))
        else:
            save_state(model, optimizer, path)
            state = full_state(model, optimizer)           # every rank joins; rank 0 keeps the saved state
            if me.rank == 0:
                torch.save(state, folder / f"saved_{path.name}.pt")
        if me.rank == 0:
            _log(folder / EVENTS, f"save_{path.name} {start:.6f} {timestamp_s():.6f}")
    return report({"rank": me.rank, "finished": True}, me.rank)


def resume_job() -> dict:
    """Rank side, on the surviving node: refuse the newest folder if incomplete, load the last complete one, gather
    it, train on; then the rival that reloads the weights with Adam started afresh."""
    me = join_node_group()
    params = job_params()
    cfg, lost = CheckpointConfig(**params["cfg"]), LostSaveConfig(**params["lost"])
    folder = Path(params["folder"])
    root = folder / CHECKPOINTS
    newest, path = step_folders(root)[-1], latest_complete(root)
    refusal = None
    try:
        check_complete(newest)
    except IncompleteCheckpointError as err:
        refusal = str(err)
    model, optimizer = build_sharded(cfg)
    load_state(model, optimizer, path)
    loaded = full_state(model, optimizer)
    differences = ["rank 0 compares"]
    if me.rank == 0:
        saved = torch.load(folder / f"saved_{path.name}.pt", weights_only=True)
        differences = state_differences(loaded, saved)
    step = int(path.name.split("_")[-1])
    losses = Trainer(cfg, model, optimizer).run(step, lost.every_k)
    rival_model, rival_optimizer = build_sharded(cfg)
    load_state(rival_model, rival_optimizer, path, with_optimizer=False)
    rival = Trainer(cfg, rival_model, rival_optimizer).run(step, lost.every_k)
    return report({"rank": me.rank, "world_size": me.world_size, "newest": newest.name, "refusal": refusal,
                   "loaded_from": path.name, "state_differences": differences[:20], "losses": losses,
                   "fresh_adam_losses": rival}, me.rank)


def run_lost_save(nodes: EmulatedNodes, cfg: CheckpointConfig, lost: LostSaveConfig, folder: str | Path
                  ) -> dict[str, Any]:
    """Run :func:`saving_job` across the nodes and kill node ``lost.victim``'s ranks once all are inside the last
    save; what happened: the kill (time, pids, marks), the job's first failure line, each folder complete or not."""
    folder = Path(folder)
    for made in (folder, folder / MID_SAVE, folder / "save_job"):
        made.mkdir(parents=True, exist_ok=True)
        os.chmod(made, 0o777)                    # ranks in a user namespace write here too
    victims = range(lost.victim * lost.procs_per_node, (lost.victim + 1) * lost.procs_per_node)
    kill: dict[str, Any] = {}

    def killer(procs: list[subprocess.Popen], run_dir: Path) -> None:
        deadline = Deadline(lost.timeout_s)
        while not all((folder / MID_SAVE / f"rank{r}").exists() for r in victims) and not deadline.expired:
            if any(p.poll() is not None for p in procs):
                return                                      # the job ended before the save: no kill
            time.sleep(POLL_S)
        kill.update(pids=training_pids(nodes, lost.victim), time_s=timestamp_s())
        for pid in kill["pids"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kill["complete_at_kill"] = {p.name: is_complete(p) for p in step_folders(folder / CHECKPOINTS)}

    params = {"cfg": asdict(cfg), "lost": asdict(lost), "folder": str(folder)}
    try:
        run_job(nodes, SAVE_TARGET, lost.procs_per_node, params, timeout_s=lost.timeout_s, while_running=killer,
                result_dir=folder / "save_job")
    except JobFailed as err:
        failure = str(err).splitlines()[0]
    else:
        raise RuntimeError(f"node {lost.victim} was to be lost mid-save, but the job finished")
    if not kill:
        raise RuntimeError(f"the job failed before node {lost.victim} was killed inside the save: {failure}")
    marks = {p.name: float(p.read_text()) for p in sorted((folder / MID_SAVE).iterdir())}
    return {**kill, "marks": marks, "failure": failure, "victim": lost.victim,
            "complete_after": {p.name: is_complete(p) for p in step_folders(folder / CHECKPOINTS)}}


def run_resume_on_survivor(nodes: EmulatedNodes, cfg: CheckpointConfig, lost: LostSaveConfig, folder: str | Path
                           ) -> list[dict]:
    """Run :func:`resume_job` on node 0 alone (it holds the rendezvous; ``procs_per_node`` ranks, a one-node
    torchrun job); each rank's report. Every process on every node is killed at the end, on error or timeout too."""
    node = 0
    folder, run_dir = Path(folder), Path(folder) / "resume_job"
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o777)
    params = {"cfg": asdict(cfg), "lost": asdict(lost), "folder": str(folder)}
    argv = node_command(RESUME_TARGET, node, 1, lost.procs_per_node, lost.timeout_s + 20)
    with open(run_dir / f"node{node}.log", "wb") as out:
        proc = nodes.popen(node, argv, stdout=out, stderr=subprocess.STDOUT, env=job_env(node, run_dir, params))
        try:
            watch = watch_job(nodes, [proc], lost.timeout_s, run_dir / RANK_MARKS)
        finally:
            nodes.kill_all()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    output = (run_dir / f"node{node}.log").read_text(errors="replace")
    if watch.fault is not None:
        raise JobFailed(fault_message(RESUME_TARGET, watch, [output]))
    if watch.codes[0] is None:
        raise TimeoutError(f"{RESUME_TARGET}: node {node} did not finish within {lost.timeout_s:g} s; killed")
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(lost.procs_per_node)]


def uninterrupted_losses(folder: str | Path) -> dict[int, float]:
    """{step: global loss} the 4-rank job logged before it lost the node (steps it finished, uninterrupted)."""
    lines = (Path(folder) / LOSSES).read_text().split("\n")[:-1]
    return {int(step): float(loss) for step, loss in (line.split() for line in lines)}


def resume_summary(folder: str | Path, resumed: list[dict], lost: LostSaveConfig) -> dict[str, Any]:
    """The resume against the lost job: what was refused and loaded, state differences (exact), the largest loss
    gap to the 4-rank job's own losses of the same steps, and the same gap for the fresh-Adam rival."""
    before = uninterrupted_losses(folder)
    reference = [before[s] for s in range(lost.resume_step, lost.resume_step + lost.every_k)]
    first = resumed[0]
    return {"world_size": first["world_size"], "newest": first["newest"], "refusal": first["refusal"],
            "loaded_from": first["loaded_from"], "state_differences": first["state_differences"],
            "max_loss_gap": max(abs(a - b) for a, b in zip(first["losses"], reference)),
            "fresh_adam_max_loss_gap": max(abs(a - b) for a, b in zip(first["fresh_adam_losses"], reference)),
            "losses": first["losses"], "uninterrupted_losses": reference}


def timeline_figure(folder: str | Path, kill: dict[str, Any]) -> Any:
    """Rank 0's steps and saves on the wall clock, the victim ranks' marks, the kill, and each folder's state."""
    import matplotlib.pyplot as plt   # lazy: the rank side never draws
    events = [line.split() for line in (Path(folder) / EVENTS).read_text().splitlines()]
    t0 = float(events[0][1])
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for kind, start, end in events:
        color = "tab:green" if kind.startswith("save") else "tab:blue"
        ax.barh(0, float(end) - float(start), left=float(start) - t0, color=color, edgecolor="white")
        ax.text((float(start) + float(end)) / 2 - t0, 0.45, kind.replace("save_", "save "), ha="center", fontsize=7)
    lost_start = float(events[-1][2])
    ax.barh(0, kill["time_s"] - lost_start, left=lost_start - t0, color="tab:red", edgecolor="white")
    lost_name = [name for name, ok in kill["complete_after"].items() if not ok]
    ax.text((lost_start + kill["time_s"]) / 2 - t0, -0.55, f"save {lost_name[-1] if lost_name else ''}: lost",
            ha="center", fontsize=7, color="tab:red")
    for name, at in kill["marks"].items():
        ax.plot([at - t0], [0], "k|", markersize=18)
    ax.axvline(kill["time_s"] - t0, color="tab:red", linestyle="--",
               label=f"node {kill['victim']} killed (its ranks inside the save: | marks)")
    state = ", ".join(f"{name}: {'complete' if ok else 'INCOMPLETE, never loaded'}"
                      for name, ok in kill["complete_after"].items())
    ax.set_yticks([0], ["rank 0"])
    ax.set_ylim(-0.6, 1.0)
    ax.set_xlabel("seconds since the first step (green: complete saves, red: the save the node was lost in)")
    ax.set_title(state, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
