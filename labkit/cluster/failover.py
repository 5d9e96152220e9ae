"""A node fails, the job goes on: run the checkpointed training, kill one node's workers mid-run, read the log.

:func:`run_with_failure` starts :func:`labkit.cluster.recovery.elastic_training` on every node with torchrun's
``--max-restarts=1``; once rank 0 has logged step ``kill_after_step`` it SIGKILLs the training processes of node
``victim`` (not its torchrun agent: a process dies, the machine lives), as a crashed worker or an out-of-memory
kill would. :func:`recovery_summary` then reads rank 0's step log: which steps ran in which attempt, how many ran
twice, and the seconds from the kill to the first step after the restart. Torch-free.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from labkit.cluster.nodes import EmulatedNodes
from labkit.cluster.run import JobResult, run_job
from labkit.core.clock import Deadline, timestamp_s
from labkit.core.env import Mode, get_mode
from labkit.core.validation import checked_int, positive_int

POLL_S = 0.02
TARGET = "labkit.cluster.recovery:elastic_training"


@dataclass(frozen=True)
class FailureConfig:
    """Steps, checkpoint interval, when to kill which node, and the stand-in step time."""

    steps: int = 40
    every_k: int = 10
    kill_after_step: int = 15
    victim: int = 1
    pace_s: float = 0.05
    procs_per_node: int = 2
    max_restarts: int = 3
    timeout_s: float = 180.0

    @classmethod
    def for_mode(cls, mode: Mode | None = None) -> "FailureConfig":
        """Fast (2 cores, 2 GB): one rank per node, enough to lose a node; full: two per node."""
        return cls(procs_per_node=1) if (mode or get_mode()).fast else cls(procs_per_node=2)

    def __post_init__(self) -> None:
        positive_int(self.steps, "steps")
        positive_int(self.every_k, "every_k", maximum=self.steps)
        checked_int(self.kill_after_step, "kill_after_step", minimum=0, maximum=self.steps - 2,
                    hint="the kill must land before the last step")
        checked_int(self.victim, "victim", minimum=0)
        positive_int(self.procs_per_node, "procs_per_node")


def training_pids(nodes: EmulatedNodes, node: int) -> list[int]:
    """The training processes on ``node``: every process there whose parent runs there too (torchrun's workers
    and what they started), not the node's agent, whose parent is the lab outside the node."""
    on_node = set(nodes.pids(node))
    out = []
    for pid in on_node:
        try:
            if psutil.Process(pid).ppid() in on_node:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def _last_step(log: Path) -> int:
    if not log.exists():
        return -1
    lines = log.read_text().split("\n")[:-1]          # a line being written has no newline yet
    return int(lines[-1].split()[1]) if lines else -1


def run_with_failure(nodes: EmulatedNodes, config: FailureConfig) -> tuple[JobResult, dict[str, Any]]:
    """Run the checkpointed training across the nodes, kill node ``victim``'s workers mid-run; (job, kill record)."""
    if config.victim >= nodes.config.nodes:
        raise ValueError(f"victim must be a node in 0..{nodes.config.nodes - 1}, got {config.victim}")
    kill: dict[str, Any] = {}

    def killer(procs: list[subprocess.Popen], run_dir: Path) -> None:
        deadline = Deadline(config.timeout_s)
        while _last_step(run_dir / "steps.log") < config.kill_after_step and not deadline.expired:
            if any(p.poll() is not None for p in procs):
                return                                  # the job ended (or failed) before the kill
            time.sleep(POLL_S)
        victims = training_pids(nodes, config.victim)
        kill.update(time_s=timestamp_s(), last_step_logged=_last_step(run_dir / "steps.log"), pids=victims)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    params = {"steps": config.steps, "every_k": config.every_k, "pace_s": config.pace_s}
    job = run_job(nodes, TARGET, config.procs_per_node, params, timeout_s=config.timeout_s, max_restarts=config.max_restarts,
                  while_running=killer)
    return job, kill


def recovery_summary(step_log: str, kill_time_s: float, steps: int, every_k: int) -> dict[str, Any]:
    """From rank 0's step log: the steps of each attempt, steps lost and repeated, seconds to the first resumed step."""
    rows = [line.split() for line in step_log.strip().splitlines()]
    by_attempt: dict[int, list[int]] = {}
    times: dict[int, list[float]] = {}
    for attempt, step, when in rows:
        by_attempt.setdefault(int(attempt), []).append(int(step))
        times.setdefault(int(attempt), []).append(float(when))
    done = sorted({s for ss in by_attempt.values() for s in ss})
    last = max(by_attempt)
    repeated = sum(len(ss) for ss in by_attempt.values()) - len(done)
    resumed_at = by_attempt[last][0] if last > 0 else None
    return {"attempts": sorted(by_attempt), "steps per attempt": {a: (ss[0], ss[-1]) for a, ss in by_attempt.items()},
            "resumed at step": resumed_at, "steps lost": steps - len(done), "steps run twice": repeated,
            "resumed from a checkpoint": resumed_at is not None and resumed_at % every_k == 0,
            "recovery (s)": (times[last][0] - kill_time_s) if last > 0 else None}
