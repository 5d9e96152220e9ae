"""Which rank stopped answering: the launcher's look at each running rank's process state while it waits.

A rank that hangs in a collective and a rank that is frozen look the same from the launcher's side (no result, no
exit), and the ranks waiting for the frozen one are the ones a timeout would name. The process state tells them
apart: a rank stopped by SIGSTOP, Ctrl-Z in its terminal, or a debugger is in state ``T`` (``t`` when traced)
and runs no code at all, while its peers wait in a collective (state ``S``). :class:`RankWatch` samples each rank's
state a few times a second and, at the timeout, names the ranks that stayed stopped and for how long. Torch-free.
"""
from __future__ import annotations

import contextlib

import psutil

from labkit.core.clock import now_s

SAMPLE_EVERY_S = 0.25      # how often the launcher reads its ranks' states (a /proc read per rank: cheap)
FROZEN_STATES = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class RankWatch:
    """Remembers, per rank, since when its process has been stopped (state T) without running again."""

    def __init__(self, sample_every_s: float = SAMPLE_EVERY_S) -> None:
        self.sample_every_s = sample_every_s
        self.frozen_since_s: dict[int, float] = {}      # rank -> when it was first seen stopped, this stop
        self._procs: dict[int, psutil.Process] = {}
        self._last_s: float | None = None

    def sample(self, pids: dict[int, int | None]) -> None:
        """Read the state of each running rank (``rank -> pid``; None: not started yet), at most every few tenths."""
        now = now_s()
        if self._last_s is not None and now - self._last_s < self.sample_every_s:
            return
        self._last_s = now
        for rank, pid in pids.items():
            if pid is None:
                continue
            if rank not in self._procs or self._procs[rank].pid != pid:
                with contextlib.suppress(psutil.Error):
                    self._procs[rank] = psutil.Process(pid)
            if self._stopped(rank):
                self.frozen_since_s.setdefault(rank, now)
            else:
                self.frozen_since_s.pop(rank, None)

    def _stopped(self, rank: int) -> bool:
        proc = self._procs.get(rank)
        if proc is None:
            return False
        try:
            return proc.status() in FROZEN_STATES
        except psutil.Error:
            return False

    def frozen(self, running: list[int]) -> dict[int, float]:
        """``rank -> seconds it has been stopped`` for the ranks in ``running`` that are stopped now."""
        self._last_s = None
        self.sample({rank: self._procs[rank].pid for rank in running if rank in self._procs})
        now = now_s()
        return {rank: now - since for rank, since in sorted(self.frozen_since_s.items()) if rank in running}

    def describe(self, running: list[int]) -> str:
        """Why the ranks in ``running`` did not finish: the frozen ones named, or the plain list."""
        frozen = self.frozen(running)
        if not frozen:
            return (f"rank(s) {running} were still running (a hang, a deadlock in a collective, or too little time "
                    "for start-up)")
        waiting = [rank for rank in running if rank not in frozen]
        names = ", ".join(f"rank {rank} (for {seconds:.1f} s)" for rank, seconds in frozen.items())
        then = f"; rank(s) {waiting} were waiting for it" if waiting else ""
        return (f"{names} stopped answering: the process was frozen (state T: stopped by SIGSTOP, Ctrl-Z or a "
                f"debugger), not running{then}")
