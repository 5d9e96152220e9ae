"""Distributed hangs provoked on purpose, on real ranks under a short timeout, and the tool that names the cause.

Six ways one rank leaves the others waiting in a collective (pytorch#132644, #115964; the shapes and order
checks of ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, torch.distributed docs "Debugging torch.distributed applications"):

- ``skipped``: one rank skips a step's all-reduce (it saw a NaN loss only it had), the others wait for it (it then
  evaluates with its connections open, so they meet their timeout, not a closed socket);
- ``order``: one rank calls barrier() and all_reduce() in the other order (a checkpoint saved at a different place);
- ``shapes``: one rank all-reduces a gradient of another size (its model was built with another config);
- ``straggler``: one rank is stuck in its data loader (a dead file system), the others time out;
- ``dead``: one rank is killed (the OOM killer's SIGKILL), the others wait on a peer that is gone;
- ``unused``: under DDP one rank stops using a parameter (an auxiliary head); DDP on that rank waits for a gradient
  that never comes, and raises at its next forward; ``TORCH_DISTRIBUTED_DEBUG=INFO`` names the parameters.

:func:`provoke` runs one on ``world_size`` gloo ranks (NCCL with blocking wait on a GPU box) with the flight
recorder on, and returns what the learner sees by default (each rank's error and after how long), every rank's
flight record read by :func:`labkit.parallel.debug.flight_recorder.diagnose`, and the stack of the stuck rank.
``tool="detail"`` adds DETAIL's checks (``"info"``: INFO's); ``tool="monitored_barrier"`` puts a monitored barrier
before each step.
"""
from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.comm.backend import choose_backend
from labkit.comm.launch import LaunchTimeout, RankFailedError, launch
from labkit.comm.worker import rank_device
from labkit.core.clock import now_s
from labkit.core.validation import checked_int, positive_number
from labkit.parallel.debug.flight_recorder import (Divergence, StallWatchdog, as_plain, diagnose, dump_rank, entry_states,
                                             read_dumps, recorder_env, stuck_stack)

SCENARIOS = ("none", "skipped", "order", "shapes", "straggler", "dead", "unused")
TOOLS = ("default", "detail", "info", "monitored_barrier")
STEP_S = 0.2                   # each step's compute, slept: gives the recorder's watchdog time to write
GRAD_NUMEL = 64                # the stand-in gradient each step all-reduces
DEBUG_ENV = {"detail": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "info": {"TORCH_DISTRIBUTED_DEBUG": "INFO"}}
NCCL_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1"}   # NCCL raises the timeout in the rank that waited, as gloo does


def _loader_batch(scenario: str, is_culprit: bool, step: int, hang_step: int, stuck_s: float) -> torch.Tensor:
    """The rank's next batch; the straggler blocks here, the dead rank is killed here."""
    if is_culprit and step == hang_step:
        if scenario == "straggler":
            time.sleep(stuck_s)                     # a read from a file system that stopped answering
        elif scenario == "dead":
            os.kill(os.getpid(), signal.SIGKILL)    # what the OOM killer does: no exception, no goodbye
    return torch.full((8,), float(step))


def _step(scenario: str, is_culprit: bool, step: int, hang_step: int, state: dict) -> None:
    """One training step's collectives: the loss for logging, the gradient; the culprit's bug at ``hang_step``."""
    device, bug = rank_device(), is_culprit and step == hang_step
    loss = torch.tensor([float(step)], device=device)
    grad = torch.ones(GRAD_NUMEL + (1 if scenario == "shapes" and is_culprit else 0), device=device)
    if bug and scenario == "skipped":
        return                                      # "if not torch.isfinite(loss): continue" on this rank only
    state["entered_s"] = now_s()
    dist.all_reduce(loss)
    if bug and scenario == "order":
        dist.barrier()                              # the checkpoint's barrier, before the all-reduce here ...
        dist.all_reduce(grad)
    else:
        dist.all_reduce(grad)
        if scenario == "order" and step == hang_step:
            dist.barrier()                          # ... and after it on every other rank
    state["entered_s"] = None


class _TwoHeads(nn.Module):
    """A model with an auxiliary head that a rank may leave out of its loss (the ``unused`` scenario)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux = nn.Linear(8, 1), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        return self.body(x) + self.aux(x) if use_aux else self.body(x)


def _ddp_step(model: nn.Module, use_aux: bool, state: dict) -> None:
    """One DDP step: forward (which checks the last step's reduction finished), backward (the all-reduces)."""
    state["entered_s"] = now_s()
    model(torch.randn(4, 8, device=rank_device()), use_aux).sum().backward()
    state["entered_s"] = None


def hang_worker(scenario: str, culprit: int, folder: str, steps: int, hang_step: int, tool: str,
                stall_s: float, stuck_s: float, step_s: float = STEP_S) -> dict:
    """One rank of a provoked hang: the loop, with a watchdog that dumps a rank still busy after ``stall_s``."""
    rank, state = dist.get_rank(), {"entered_s": None}
    watchdog_group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=stall_s))
                      if tool == "monitored_barrier" else None)
    ddp = (DistributedDataParallel(_TwoHeads().to(rank_device())) if scenario == "unused" else None)
    with StallWatchdog(folder, stall_s):
        try:
            for step in range(steps):
                state["step"] = step
                time.sleep(step_s)                  # the step's forward and backward, on every rank
                _loader_batch(scenario, rank == culprit, step, hang_step, stuck_s)
                if watchdog_group is not None:      # every rank checks in before the step's collectives
                    dist.monitored_barrier(group=watchdog_group, timeout=timedelta(seconds=stall_s),
                                           wait_all_ranks=True)
                if ddp is not None:                 # the culprit stops using the head from hang_step on
                    _ddp_step(ddp, not (rank == culprit and step >= hang_step), state)
                else:
                    _step(scenario, rank == culprit, step, hang_step, state)
        except Exception as err:
            waited = None if state["entered_s"] is None else now_s() - state["entered_s"]
            dump_rank(folder, {"rank": rank, "step": state["step"], "waited_s": waited,
                               "error": f"{type(err).__name__}: {err}"[:4000]})
            raise
    dump_rank(folder, {"rank": rank, "step": steps, "waited_s": None, "error": None})
    if scenario == "skipped" and rank == culprit:
        # It goes on to its evaluation pass with its connections open, so the others meet their timeout. Had it
        # exited, they would see gloo's "Connection closed by peer" as soon as it left: a race between two errors.
        time.sleep(stuck_s)
    return {"rank": rank, "steps": steps}


@dataclass(frozen=True)
class HangEvidence:
    """What one provoked hang showed: the errors (default view), the flight records' verdict, the stuck stack."""

    scenario: str
    tool: str
    culprit: int
    world_size: int
    pg_timeout_s: float
    wall_s: float
    launcher_said: str                   # the launcher's one line (first failing rank), or "" if all finished
    errors: dict                         # rank -> {"error", "waited_s", "step"} from the ranks that raised
    divergence: Divergence
    stack: str                           # the culprit's innermost frames if it was still running at stall_s
    backend: str
    records: dict                        # rank -> [{"seq", "op", "sizes"}]: what each rank's flight record holds
    states: dict                         # recorded entries per state: on gloo all "scheduled" (see flight_recorder)

    @property
    def hung(self) -> bool:
        """Whether the run failed (a timeout or an error) instead of finishing."""
        return bool(self.launcher_said)

    def first_error(self) -> str:
        """The first line of the first error a waiting rank saw (what a learner reads by default). A timeout comes
        first in time: with the culprit alive, a waiting rank sees "Connection closed by peer" only after another
        waiting rank timed out and left (a CI run read rank 0's closure, after rank 1's timeout)."""
        waiting = [r for r in sorted(self.errors) if r != self.culprit and self.errors[r].get("error")]
        waiting.sort(key=lambda r: "timed out" not in self.errors[r]["error"].lower())
        for rank in waiting:
            return self.errors[rank]["error"].splitlines()[0][:240]
        return self.launcher_said.splitlines()[0][:240] if self.launcher_said else ""

    def recorder_missing_reason(self) -> str | None:
        """None when the flight recorder recorded this run; else why its records cannot be judged here."""
        if any(self.records.values()):
            return None
        return ("the flight recorder recorded nothing on this torch build and backend (its gloo support and the "
                f"_dump_fr_trace API are recent; torch {torch.__version__} here)")

    def error_rows(self) -> list[dict]:
        """One row per rank that raised: how long it had waited, and its message without gloo's source path."""
        return [{"rank": r, "waited (s)": None if e.get("waited_s") is None else round(e["waited_s"], 2),
                 "error (first line)": re.sub(r"\[/[^\]]*\] ?", "", e["error"].splitlines()[0])[:160]}
                for r, e in sorted(self.errors.items())]

    def max_waited_s(self) -> float | None:
        """How long the longest-waiting rank sat in its collective before the error (None: nobody raised)."""
        waits = [e["waited_s"] for e in self.errors.values() if e.get("waited_s") is not None]
        return max(waits) if waits else None

    def error_names(self, rank: int) -> bool:
        """Whether any error text names ``rank`` the way torch does ("Rank 2", "rank 2", "ranks: 2")."""
        words = (f"rank {rank}", f"ranks: {rank}", f"ranks {rank}", f"[{rank}]", f"rank: {rank}")
        texts = [e.get("error") or "" for e in self.errors.values()]
        return any(w in t.lower() for t in texts for w in words)


def provoke(scenario: str, tool: str = "default", *, world_size: int = 3, culprit: int | None = None,
            steps: int = 3, hang_step: int = 1, pg_timeout_s: float = 3.0, stall_s: float | None = None,
            timeout_s: float = 90.0) -> HangEvidence:
    """Run ``scenario`` on real ranks under a ``pg_timeout_s`` collective timeout; every process and temp folder
    is gone when this returns (the launcher kills the ranks; the dumps' folder is a TemporaryDirectory)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}")
    if tool not in TOOLS:
        raise ValueError(f"tool must be one of {TOOLS}, got {tool!r}")
    checked_int(world_size, "world_size", minimum=2, hint="a hang needs a rank that waits for another")
    culprit = world_size - 1 if culprit is None else checked_int(culprit, "culprit", minimum=0)
    if culprit >= world_size:
        raise ValueError(f"culprit must be a rank below world_size={world_size}, got {culprit}")
    checked_int(hang_step, "hang_step", minimum=0)
    if hang_step >= steps:
        raise ValueError(f"hang_step must be below steps={steps}, got {hang_step}")
    positive_number(pg_timeout_s, "pg_timeout_s", hint="a number of seconds")
    stall_s = pg_timeout_s / 2 if stall_s is None else positive_number(stall_s, "stall_s")
    choice = choose_backend(world_size)
    env = {**recorder_env(), **DEBUG_ENV.get(tool, {}), **(NCCL_ENV if choice.uses_gpus else {})}
    start, said = now_s(), ""
    with tempfile.TemporaryDirectory(prefix="labkit-hang-") as folder:
        try:
            launch(hang_worker, world_size, args=(scenario, culprit, folder, steps, hang_step, tool, stall_s,
                                                  4 * pg_timeout_s + 10),
                   backend=choice.backend, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, env=env,
                   show_output=False)
        except RankFailedError as err:
            said = str(err).splitlines()[0]
        except LaunchTimeout as err:
            said = str(err).splitlines()[0]
        wall = now_s() - start
        errors = _notes(folder, world_size)
        records = read_dumps(folder, world_size)
        verdict, states = diagnose(records), entry_states(folder, world_size)
        stack = stuck_stack(folder, culprit)
    return HangEvidence(scenario, tool, culprit, world_size, pg_timeout_s, wall, said, errors, verdict, stack,
                        choice.backend, as_plain(records), states)


def _notes(folder: str, world_size: int) -> dict:
    """rank -> the note a rank wrote when its collective raised (ranks that finished or died are left out)."""
    out = {}
    for rank in range(world_size):
        path = os.path.join(folder, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as fh:
                note = json.load(fh)
            if note.get("error"):
                out[rank] = note
    return out
