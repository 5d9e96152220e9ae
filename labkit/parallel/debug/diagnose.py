"""Run a training function on N ranks with the hang instruments on, and say in a few lines what went wrong.

``labkit diagnose module:function`` (and :func:`run_diagnosed`) launches the function on ``world_size`` ranks
(``labkit.comm.launch``: a timeout, no process left behind) with the flight recorder on
(``TORCH_FR_BUFFER_SIZE``), a short collective timeout, a watchdog per rank that keeps its flight record on disk
and writes its stack once it stops entering collectives, and optionally ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
If the function returns its model, the ranks' weights are fingerprinted at the end (:mod:`labkit.parallel.debug.drift`).
The report: the launcher's one line, each rank's last collective, the first sequence id where they part, the
stuck rank's innermost frames, and the ranks whose weights differ; instead of every rank's wall of logs.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from torch import nn

from labkit.comm.backend import choose_backend
from labkit.comm.launch import LaunchTimeout, RankFailedError, launch, resolve_target, target_name
from labkit.core.clock import now_s
from labkit.core.validation import checked_int, positive_number
from labkit.parallel.debug.drift import fingerprints
from labkit.parallel.debug.flight_recorder import (Divergence, StallWatchdog, diagnose, dump_rank, read_dumps,
                                             recorder_env, stuck_stack)

DETAIL_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def diagnosed_rank(target: str, folder: str, stall_s: float, hold_s: float = 0.0) -> dict:
    """One rank: call ``target`` under the watchdog; dump the flight record when it raises; fingerprint a model.
    A rank that finished holds its sockets open for its peers (:func:`hold_for_peers`), at most ``hold_s``."""
    fn = resolve_target(*target_name(target))
    with StallWatchdog(folder, stall_s):
        try:
            value = fn()
        except Exception as err:
            dump_rank(folder, {"rank": dist.get_rank(), "error": f"{type(err).__name__}: {err}"[:4000]})
            raise
    dump_rank(folder, {"rank": dist.get_rank(), "error": None})
    hold_for_peers(folder, dist.get_world_size(), hold_s)
    prints = fingerprints(value) if isinstance(value, nn.Module) else None
    return {"fingerprints": prints, "value": None if isinstance(value, nn.Module) else value}


def hold_for_peers(folder: str | Path, world_size: int, hold_s: float, poll_s: float = 0.05) -> None:
    """Wait until every rank has finished or raised (each writes its note, ``rank<R>.json``), for at most ``hold_s``.
    A finished rank that closed its sockets at once would fail a peer stuck in a collective with gloo's 'Connection
    closed by peer' within milliseconds, before its watchdog wrote the stack; held, the peer reaches its collective
    timeout, so the report's outcome does not depend on which rank the scheduler ran first."""
    notes = [Path(folder) / f"rank{r}.json" for r in range(world_size)]
    deadline = now_s() + hold_s
    while now_s() < deadline and not all(note.exists() for note in notes):
        time.sleep(poll_s)


@dataclass(frozen=True)
class DiagnoseReport:
    """What a diagnosed run showed; ``text()`` is the short report the command prints."""

    target: str
    world_size: int
    ok: bool
    launcher_said: str
    divergence: Divergence
    stacks: dict                  # rank -> innermost frames, for ranks the watchdog saw stop
    errors: dict                  # rank -> first line of the error it raised
    drifted: tuple[int, ...]      # ranks whose final weights differ from the majority's ((): same, or no model)
    wall_s: float

    def text(self) -> str:
        """The short report: outcome, the flight records' verdict, stuck stacks, drifted ranks."""
        head = (f"{self.target} on {self.world_size} ranks: " + ("finished" if self.ok else "FAILED")
                + f" after {self.wall_s:.1f} s")
        lines = [head] + ([f"launcher: {self.launcher_said}"] if self.launcher_said else [])
        lines += [f"rank {r} raised: {e}" for r, e in sorted(self.errors.items())]
        lines.append(self.divergence.report())
        for rank, frames in sorted(self.stacks.items()):
            if rank in self.divergence.culprits or not self.divergence.culprits:
                lines.append(f"stack of rank {rank} (innermost first):\n  " + frames.replace("\n", "\n  "))
        if self.drifted:
            lines.append(f"weights differ at the end on rank(s) {list(self.drifted)} (parameter fingerprints)")
        return "\n".join(lines)


def run_diagnosed(target: str, world_size: int = 2, *, pg_timeout_s: float = 10.0, timeout_s: float = 120.0,
                  detail: bool = False, stall_s: float | None = None) -> DiagnoseReport:
    """Run ``target`` ('module:function', no arguments) on real ranks with the instruments on; never hangs."""
    target_name(target)                               # a bad name fails here, before any process starts
    checked_int(world_size, "world_size", minimum=2, hint="hangs and drift need at least two ranks")
    positive_number(pg_timeout_s, "pg_timeout_s", hint="a number of seconds")
    positive_number(timeout_s, "timeout_s", hint="a number of seconds")
    stall_s = pg_timeout_s / 2 if stall_s is None else positive_number(stall_s, "stall_s")
    choice, said, results = choose_backend(world_size), "", []
    env = {**recorder_env(), **(DETAIL_ENV if detail else {}),
           **({"TORCH_NCCL_BLOCKING_WAIT": "1"} if choice.uses_gpus else {})}
    start = now_s()
    with tempfile.TemporaryDirectory(prefix="labkit-diagnose-") as folder:
        try:
            results = launch(diagnosed_rank, world_size, args=(target, folder, stall_s, pg_timeout_s + stall_s),
                             backend=choice.backend, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, env=env,
                             show_output=False)
        except (RankFailedError, LaunchTimeout) as err:
            said = str(err).splitlines()[0]
        verdict = diagnose(read_dumps(folder, world_size))
        stacks = {r: s for r in range(world_size) if (s := stuck_stack(folder, r))}
        errors = _errors(Path(folder), world_size)
    prints = results[0]["fingerprints"] if results else None
    drifted = ()
    if prints:
        top = max(set(prints), key=lambda h: (prints.count(h), -prints.index(h)))
        drifted = tuple(r for r, h in enumerate(prints) if h != top)
    return DiagnoseReport(target, world_size, not said, said, verdict, stacks, errors, drifted, now_s() - start)


def _errors(folder: Path, world_size: int) -> dict:
    """rank -> the first line of the error it raised (from the note it wrote)."""
    out = {}
    for rank in range(world_size):
        path = folder / f"rank{rank}.json"
        if path.exists() and (err := json.loads(path.read_text()).get("error")):
            out[rank] = err.splitlines()[0][:200]
    return out
